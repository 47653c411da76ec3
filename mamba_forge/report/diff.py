"""What changed between two manifests (build or qualified), and between a qualified manifest and a fresh
rebuild of its kernels (the reproducibility check: a kernel change without a new qualification is stale).

Manifests are read as plain dicts (tomllib); a trailing [signature] table is shown, not checked: ``verify`` checks it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from mamba_forge.errors import ManifestError

RESOURCE_KEYS = ("registers", "static_smem", "local_bytes", "stack_frame", "spill_stores", "spill_loads",
                 "max_threads", "blocks_per_sm", "barriers", "param_bytes")


def read_body(path: Path) -> dict:
    """A manifest as plain dicts (its [signature] table, if any, under "signature": not verified here)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}") from None
    except (IsADirectoryError, UnicodeDecodeError):
        raise ManifestError(f"{path}: cannot read as a manifest") from None
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"{path}: not valid TOML: {exc}") from None
    if data.get("kind") not in ("build", "qualified", "index"):
        raise ManifestError(f"{path}: kind {data.get('kind')!r} is not a build, qualified manifest or index")
    return data


def normalize(body: dict) -> tuple[dict[str, dict], dict[str, dict]]:
    """(symbols keyed 'module/target/name', artifacts keyed by path) of a build or qualified manifest."""
    symbols: dict[str, dict] = {}
    artifacts: dict[str, dict] = {}
    if body.get("kind") == "build":
        for m in body.get("modules", []):
            for a in m.get("artifacts", []):
                artifacts[a["path"]] = {"sha256": a["sha256"], "size": a["size"]}
            for s in m.get("symbols", []):
                v = s.get("verdict", {})
                symbols[f"{m['kind']}/{m['target']}/{s['name']}"] = {
                    "status": v.get("status", ""), "reason": v.get("reason", ""), "check": v.get("check", ""),
                    "resources": {k: x for k, x in (s.get("resources") or {}).items() if k in RESOURCE_KEYS},
                    "dynamic_smem": s.get("dynamic_smem", 0), "block": s.get("block", []), "digests": {},
                }
    elif body.get("kind") == "qualified":
        for a in body.get("artifacts", []):
            artifacts[a["path"]] = {"sha256": a["sha256"], "size": a["size"]}
        for s in body.get("symbols", []):
            symbols[f"{s['module']}/{s['target']}/{s['name']}"] = {
                "status": s.get("status", ""), "reason": s.get("reason", ""), "check": s.get("check", ""),
                "resources": {k: x for k, x in (s.get("resources") or {}).items() if k in RESOURCE_KEYS},
                "dynamic_smem": s.get("dynamic_smem", 0), "block": s.get("block", []),
                "digests": {c["name"]: c.get("digest", "") for c in s.get("checks", []) if c.get("digest")},
            }
    else:
        for e in body.get("entries", []):
            artifacts[e["path"]] = {"sha256": e["sha256"], "size": e["size"]}
    return symbols, artifacts


def diff(a: dict, b: dict) -> dict:
    """Symbols added/removed, newly rejected/admitted, other status changes, resource and digest changes."""
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
        for field in sorted(set(x["resources"]) & set(y["resources"])):  # build and qualified record different sets
            if x["resources"].get(field) != y["resources"].get(field):
                out["resource_changes"].append({"symbol": key, "field": field, "old": x["resources"].get(field),
                                                "new": y["resources"].get(field)})
        for field in ("dynamic_smem", "block"):
            if x[field] != y[field]:
                out["resource_changes"].append({"symbol": key, "field": field, "old": x[field], "new": y[field]})
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


def rebuild_and_compare(body: dict, out: Path, *, catalog: Path | None = None,
                        cache_location: Path | str | None = "default") -> list[dict]:
    """Rebuild the manifest's modules for its targets (through the build cache) into `out` and compare every
    artifact's sha256. Returns one record per stale artifact: module, target, path, expected, actual, symbols."""
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.model import default_catalog_path, load_catalog
    from mamba_forge.catalog.targets import get_target

    if body.get("kind") != "qualified":
        raise ManifestError(f"the reproducibility check takes a qualified manifest, not a {body.get('kind')!r}")
    cat = load_catalog(catalog or default_catalog_path())
    targets = sorted({a["target"] for a in body["artifacts"]})
    cap = int(body.get("state_capacity", 64))
    fresh = build(BuildRequest(cat, [get_target(t) for t in targets], Path(out), state_capacity=cap,
                               cache_location=cache_location))
    built = {a.path: (m, a) for m in fresh.modules for a in m.artifacts}
    status = {(m.kind, m.target): m.status for m in fresh.modules}
    stale = []
    for a in body["artifacts"]:
        names = sorted(s["name"] for s in body.get("symbols", []) if (s["module"], s["target"]) == (a["module"], a["target"]))
        got = built.get(a["path"])
        actual = got[1].sha256 if got else ("failed to compile" if status.get((a["module"], a["target"])) == "failed" else "absent")
        if actual != a["sha256"]:
            stale.append({"module": a["module"], "target": a["target"], "path": a["path"], "expected": a["sha256"],
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
