"""What changed between two manifests (build or qualified), and between a qualified manifest and a fresh
rebuild of its kernels (the reproducibility check: a kernel change without a new qualification is stale).

Manifests are read into the schema's records (mamba_forge/core/schema.py); a trailing [signature] table is
shown, not checked: ``verify`` checks it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mamba_forge.core.codec import document_record, to_dict
from mamba_forge.core.errors import ManifestError
from mamba_forge.core.schema import BuildManifest, QualifiedManifest, ReleaseIndex, SchemaError
from mamba_forge.core.tomlmemo import parse_toml_bytes
from mamba_forge.manifest import toml_io
from mamba_forge.runtime import signing

RESOURCE_KEYS = ("registers", "static_smem", "local_bytes", "stack_frame", "spill_stores", "spill_loads",
                 "max_threads", "blocks_per_sm", "barriers", "param_bytes")
_RECORDS = {"build": BuildManifest, "qualified": QualifiedManifest, "index": ReleaseIndex}


@dataclass
class Document:
    """A manifest's record and its [signature] table, when it has a well-formed one (not verified here)."""

    record: BuildManifest | QualifiedManifest | ReleaseIndex
    signature: signing.Signature | None = None

    @property
    def kind(self) -> str:
        return self.record.kind


def read_document(path: Path) -> Document:
    """A build manifest, qualified manifest or index as its record; refuses (one line) what does not fit."""
    path = Path(path)
    raw = toml_io.read_input(path)
    sig = None
    if signing.MARKER in raw:
        try:
            raw, sig = signing.split(raw)
        except signing.SignatureError:
            pass  # shown as unsigned; the TOML below refuses what is not a manifest
    try:
        data = parse_toml_bytes(raw, what=str(path))
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: cannot read as a manifest") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML: {exc}") from None
    data.pop("signature", None)
    try:
        cls = document_record(data, _RECORDS, where=str(path))
    except SchemaError as exc:
        raise ManifestError(f"{exc}: not a build, qualified manifest or index") from None
    return Document(toml_io.parse(data, cls, source=str(path)), sig)


def _resources(res) -> dict:
    return {k: x for k, x in to_dict(res).items() if k in RESOURCE_KEYS} if res is not None else {}


def normalize(m: BuildManifest | QualifiedManifest | ReleaseIndex) -> tuple[dict[str, dict], dict[str, dict]]:
    """(symbols keyed 'module/target/name', artifacts keyed by path) of a build or qualified manifest."""
    symbols: dict[str, dict] = {}
    artifacts: dict[str, dict] = {}
    if isinstance(m, BuildManifest):
        for mod in m.modules:
            for a in mod.artifacts:
                artifacts[a.path] = {"sha256": a.sha256, "size": a.size}
            for s in mod.symbols:
                v = s.verdict
                symbols[f"{mod.kind}/{mod.target}/{s.name}"] = {
                    "status": v.status, "reason": v.reason, "check": v.check, "resources": _resources(s.resources),
                    "dynamic_smem": s.dynamic_smem, "block": s.block, "digests": {},
                }
    elif isinstance(m, QualifiedManifest):
        for a in m.artifacts:
            artifacts[a.path] = {"sha256": a.sha256, "size": a.size}
        for s in m.symbols:
            symbols[f"{s.module}/{s.target}/{s.name}"] = {
                "status": s.status, "reason": s.reason, "check": s.check, "resources": _resources(s.resources),
                "dynamic_smem": s.dynamic_smem, "block": s.block, "pdl_max_blocks": s.pdl_max_blocks,
                "digests": {c.name: c.digest for c in s.checks if c.digest},
            }
    else:
        for e in m.entries:
            artifacts[e.path] = {"sha256": e.sha256, "size": e.size}
    return symbols, artifacts


def diff(a, b) -> dict:
    """Between two records (build, qualified or index): symbols added/removed, newly rejected/admitted, other status changes, resource and digest changes."""
    sa, aa = normalize(a)
    sb, ab = normalize(b)
    out: dict[str, list] = {
        "added": sorted(set(sb) - set(sa)),
        "removed": sorted(set(sa) - set(sb)),
        "newly_rejected": [], "newly_admitted": [], "status_changed": [],
        "resource_changes": [], "digest_changes": [],
        "artifacts_added": sorted(set(ab) - set(aa)), "artifacts_removed": sorted(set(aa) - set(ab)),
        "artifact_changes": [],
    }
    for key in sorted(set(sa) & set(sb)):
        x, y = sa[key], sb[key]
        if x["status"] != y["status"]:
            rec = {"symbol": key, "old": x["status"], "new": y["status"], "reason": y["reason"], "check": y["check"]}
            if y["status"] == "rejected":
                out["newly_rejected"].append(rec)
            elif y["status"] == "admitted" and x["status"] == "rejected":
                out["newly_admitted"].append(rec)
            else:
                out["status_changed"].append(rec)
        for name in sorted(set(x["resources"]) & set(y["resources"])):  # build and qualified record different sets
            if x["resources"].get(name) != y["resources"].get(name):
                out["resource_changes"].append({"symbol": key, "field": name, "old": x["resources"].get(name),
                                                "new": y["resources"].get(name)})
        for name in ("dynamic_smem", "block", "pdl_max_blocks"):  # the last: qualified records only
            if name in x and name in y and x[name] != y[name]:
                out["resource_changes"].append({"symbol": key, "field": name, "old": x[name], "new": y[name]})
        for check in sorted(set(x["digests"]) & set(y["digests"])):
            if x["digests"][check] != y["digests"][check]:
                out["digest_changes"].append({"symbol": key, "check": check, "old": x["digests"][check],
                                              "new": y["digests"][check]})
    for path in sorted(set(aa) & set(ab)):
        if aa[path] != ab[path]:
            out["artifact_changes"].append({"path": path, "old": aa[path]["sha256"], "new": ab[path]["sha256"],
                                            "old_size": aa[path]["size"], "new_size": ab[path]["size"]})
    out["changed"] = any(v for v in out.values() if isinstance(v, list))  # type: ignore[assignment]
    return out


# ---- reproducibility: a qualified manifest against a fresh rebuild ------------------------------------------
# The check reads only what a rebuild needs (which artifacts, their digests, the state capacity, which symbols
# live where), so it takes a manifest of any manifest_version: the committed one may predate the current layout.


@dataclass(kw_only=True)
class _Pinned:
    module: str
    target: str
    path: str
    sha256: str


@dataclass(kw_only=True)
class _Placed:
    name: str
    module: str
    target: str


@dataclass(kw_only=True)
class ReproPins:
    """What a qualified manifest pins for the reproducibility check."""

    kind: Literal["qualified"]
    state_capacity: int = 64
    artifacts: list[_Pinned]
    symbols: list[_Placed] = field(default_factory=list)


def _only(table, keys: tuple[str, ...]):
    return {k: table[k] for k in keys if k in table} if type(table) is dict else table


def repro_pins(body: dict | QualifiedManifest, *, source: str = "the manifest") -> ReproPins:
    """The pins of a qualified record, or of a plain body of any manifest_version."""
    if isinstance(body, QualifiedManifest):
        body = to_dict(body)
    if type(body) is not dict or ("kind" in body and body["kind"] != "qualified"):
        kind = body["kind"] if type(body) is dict else type(body).__name__
        raise ManifestError(f"the reproducibility check takes a qualified manifest, not a {kind!r}")
    plain = _only(body, ("kind", "state_capacity", "artifacts", "symbols"))
    for key, keys in (("artifacts", ("module", "target", "path", "sha256")), ("symbols", ("name", "module", "target"))):
        if key in plain and type(plain[key]) is list:
            plain[key] = [_only(x, keys) for x in plain[key]]
    return toml_io.parse(plain, ReproPins, source=source)


def rebuild_and_compare(body: dict | QualifiedManifest, out: Path, *, catalog: Path | None = None,
                        cache_location: Path | str | None = "default") -> list[dict]:
    """Rebuild the manifest's modules for its targets (through the build cache) into `out` and compare every
    artifact's sha256. Returns one record per stale artifact: module, target, path, expected, actual, symbols."""
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.model import default_catalog_path, load_catalog
    from mamba_forge.catalog.targets import get_target

    pins = repro_pins(body)
    cat = load_catalog(catalog or default_catalog_path())
    targets = sorted({a.target for a in pins.artifacts})
    fresh = build(BuildRequest(cat, [get_target(t) for t in targets], Path(out), state_capacity=pins.state_capacity,
                               cache_location=cache_location))
    built = {a.path: (m, a) for m in fresh.modules for a in m.artifacts}
    status = {(m.kind, m.target): m.status for m in fresh.modules}
    stale = []
    for a in pins.artifacts:
        names = sorted(s.name for s in pins.symbols if (s.module, s.target) == (a.module, a.target))
        got = built.get(a.path)
        actual = got[1].sha256 if got else ("failed to compile" if status.get((a.module, a.target)) == "failed" else "absent")
        if actual != a.sha256:
            stale.append({"module": a.module, "target": a.target, "path": a.path, "expected": a.sha256,
                          "actual": actual, "symbols": names})
    return stale


def stale_message(manifest: Path | str, stale: list[dict], level: str = "quick") -> str:
    """One paragraph naming the stale modules and symbols and the command that re-qualifies them."""
    parts = []
    for s in stale:
        syms = ", ".join(s["symbols"][:8]) + (f" and {len(s['symbols']) - 8} more" if len(s["symbols"]) > 8 else "")
        parts.append(f"{s['module']} on {s['target']} ({s['path']}: rebuilt {s['actual'][:12]}, manifest "
                     f"{s['expected'][:12]}; symbols {syms or 'none'})")
    return (f"{manifest} is stale: the kernels changed since they were qualified: " + "; ".join(parts)
            + f". Re-qualify on the GPU: mamba-forge build --out build && mamba-forge qualify --build build "
            f"--level {level} --out {manifest}")


def narrow(d: dict, globs: tuple[str, ...] = (), *, modules: tuple[str, ...] = (),
           targets: tuple[str, ...] = ()) -> dict:
    """A diff of only the symbols whose key 'module/target/name' has a name matching a glob, a module kind in
    `modules` and a target in `targets` (an empty filter keeps all). Artifact changes are dropped with globs (they
    are not per symbol); with only module and target filters they are kept by their path, `<target>/<module>.<code>`
    as the builder names them."""
    from fnmatch import fnmatchcase

    def keep(key: str) -> bool:
        module, target, name = key.split("/", 2) if key.count("/") >= 2 else ("", "", key)
        return ((not globs or any(fnmatchcase(name, g) for g in globs)) and (not modules or module in modules)
                and (not targets or target in targets))

    def keep_artifact(path: str) -> bool:
        if globs:
            return False
        target, _, file = path.partition("/")
        return (not targets or target in targets) and (not modules or file.split(".", 1)[0] in modules)

    out = {}
    for k, v in d.items():
        if k in ("added", "removed"):
            out[k] = [x for x in v if keep(x)]
        elif k in ("artifacts_added", "artifacts_removed"):
            out[k] = [x for x in v if keep_artifact(x)]
        elif k == "artifact_changes":
            out[k] = [x for x in v if keep_artifact(x["path"])]
        elif isinstance(v, list):
            out[k] = [x for x in v if keep(x["symbol"])]
    out["changed"] = any(v for v in out.values() if isinstance(v, list))
    return out
