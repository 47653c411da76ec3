"""Readable tables of build manifests, qualified manifests and release indexes (records of core/schema.py)."""

from __future__ import annotations

import base64
import dataclasses
from collections import defaultdict
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from mamba_forge.core.codec import to_dict
from mamba_forge.core.errors import printable
from mamba_forge.core.schema import BuildManifest, QualifiedManifest, ReleaseIndex
from mamba_forge.report.classes import check_verdict, class_counts, counts_line, group_rejections
from mamba_forge.report.qualify import rejection_lines

if TYPE_CHECKING:  # names in annotations only: `build` renders its table without cryptography or the manifest reader
    from mamba_forge.report.diff import Document
    from mamba_forge.runtime import signing


def build_summary(manifest: BuildManifest) -> list[dict]:
    """One row per module kind and target: compile status and admitted/rejected counts."""
    rows = []
    for m in manifest.modules:
        admitted = sum(s.verdict.status == "admitted" for s in m.symbols)
        rows.append(
            {
                "module": m.kind,
                "target": m.target,
                "role": m.role + (" (built only)" if m.built_only else ""),
                "mandatory": m.mandatory,
                "status": m.status,
                "admitted": admitted,
                "rejected": len(m.symbols) - admitted,
                "cached": m.cached,
            }
        )
    return rows


def plain(console: Console) -> bool:
    """Off a terminal (a log, a pipe, a file) every table row, rejection and change is one line: never wrapped
    inside a name, never padded with trailing spaces, so grep and diff see whole names."""
    return not console.is_terminal


_LINE = 1 << 20  # a report line is escaped, never cut for length


def _safe(text: object) -> str:
    """Text from a manifest (read, not verified: anyone may have written it) as one line a terminal shows
    as-is: control characters, newlines and escape sequences written as Python escapes (errors.printable).
    Every string this module prints passes here: lines, titles, table cells, markdown."""
    return printable(text, limit=_LINE)


def _lines(text: str) -> str:
    """Text that is several lines by design (a compiler log) with each line escaped."""
    return "\n".join(_safe(line) for line in str(text).split("\n"))


def _say(console: Console, text: str, indent: int = 0) -> None:
    """Plain text: on a terminal wrapped to its width, a word longer than a line (a symbol name) folded, never
    cut; off one, a single line."""
    text = _safe(text)
    if plain(console):
        console.print(" " * indent + text, markup=False, highlight=False, soft_wrap=True)
        return
    from rich.padding import Padding
    from rich.text import Text

    t = Text(text, overflow="fold")
    console.print(Padding(t, (0, 0, 0, indent)) if indent else t, highlight=False)


def _head(console: Console, title: str, count: int | None = None) -> None:
    """A section title, bold on a terminal."""
    text = _safe(title if count is None else f"{title} ({count})")
    if plain(console):
        console.print(text, markup=False, highlight=False, soft_wrap=True)
    else:
        from rich.text import Text

        console.print(Text(text, style="bold"))


class _Rows:
    """A table: a rich Table on a terminal; off one, the title and then one aligned line per row (the header
    first), with no trailing spaces."""

    def __init__(self, title: str, cols: tuple[str, ...], right: tuple[str, ...] = ()):
        self.title, self.cols, self.right = title, cols, right
        self.rows: list[tuple[tuple[str, ...], str | None]] = []

    def add_row(self, *cells: str, style: str | None = None) -> None:
        self.rows.append((tuple(_safe(c) for c in cells), style))

    def print(self, console: Console) -> None:
        title = _safe(self.title)
        if not plain(console):
            from rich.text import Text  # cells as Text: a '[' in a name is not rich markup

            table = Table(title=Text(title))
            for col in self.cols:
                table.add_column(col, justify="right" if col in self.right else "left", overflow="fold")
            for cells, style in self.rows:
                table.add_row(*map(Text, cells), style=style)
            console.print(table)
            return
        lines = [self.cols] + [cells for cells, _ in self.rows]
        widths = [max(len(line[i]) for line in lines) for i in range(len(self.cols))]
        console.print(title, markup=False, highlight=False, soft_wrap=True)
        for line in lines:
            text = "  ".join(c.rjust(w) if col in self.right else c.ljust(w)
                             for c, w, col in zip(line, widths, self.cols, strict=True))
            console.print(text.rstrip(), markup=False, highlight=False, soft_wrap=True)


def match_any(name: str, globs: tuple[str, ...] | list[str]) -> bool:
    return any(fnmatchcase(name, g) for g in globs)


def render_build(manifest: BuildManifest, console: Console, *, symbols: tuple[str, ...] = (),
                 digests: bool = False) -> None:
    table = _Rows(f"build of catalog {manifest.catalog} (state capacity {manifest.state_capacity})",
                   ("module", "target", "role", "mandatory", "status", "admitted", "rejected"),
                   ("admitted", "rejected"))
    for r in build_summary(manifest):
        style = "red" if r["status"] == "failed" else ("yellow" if r["rejected"] else None)
        table.add_row(
            r["module"], r["target"], r["role"], "yes" if r["mandatory"] else "no", r["status"],
            str(r["admitted"]), str(r["rejected"]), style=style,
        )
    table.print(console)
    for m in manifest.modules:
        if m.status == "failed" and m.log_head:
            console.print(_safe(f"{m.kind} on {m.target} failed to compile:"), style="red", markup=False,
                          highlight=False, soft_wrap=plain(console))
            console.print(_lines(m.log_head), markup=False, highlight=False, overflow="fold", soft_wrap=plain(console))
    by_module: dict[str, list] = defaultdict(list)
    for m, s in manifest.symbols():
        if s.verdict.status == "rejected":
            by_module[f"{m.kind} / {m.target}"].append(s)
    for where, syms in by_module.items():
        _head(console, f"rejected in {where}", len(syms))
        for s in syms:
            why = s.verdict.reason or "no reason recorded"
            _say(console, f"- {why}" if why.startswith(s.name) else f"- {s.name}: {why}", 2)
    chosen = [(m, s) for m, s in manifest.symbols() if symbols and match_any(s.name, symbols)]
    if chosen:
        _head(console, "symbols", len(chosen))
    for m, s in chosen:
        _say(console, f"{s.name} ({m.kind}/{m.target}) {s.verdict.status}")
        r = s.resources
        if r is not None:
            _say(console, f"regs {r.registers}, smem {r.static_smem}, dyn smem {s.dynamic_smem}, stack "
                          f"{r.stack_frame}, spills {r.spill_stores}/{r.spill_loads}, max threads {r.max_threads}, "
                          f"block {'x'.join(map(str, s.block))}", 4)
    if digests:
        _head(console, "artifacts")
        for m in manifest.modules:
            for a in m.artifacts:
                _say(console, f"{a.path} {a.size} bytes sha256 {a.sha256}", 2)


# ---- qualified manifests and indexes (records, with the [signature] table as read, not verified) ------------


def _artifact_roles(m: QualifiedManifest) -> dict[tuple[str, str], str]:
    return {(a.module, a.target): a.role for a in m.artifacts}


def qualified_summary(m: QualifiedManifest) -> list[dict]:
    """One row per module kind and target: role and symbol counts by status."""
    roles = _artifact_roles(m)
    rows: dict[tuple[str, str], dict] = {}
    for s in m.symbols:
        key = (s.module, s.target)
        r = rows.setdefault(key, {"module": key[0], "target": key[1], "role": roles.get(key, ""),
                                  "admitted": 0, "rejected": 0, "other": 0})
        r[s.status if s.status in ("admitted", "rejected") else "other"] += 1
    return list(rows.values())


_HEAD = ("kind", "schema_version", "manifest_version", "created", "expires", "tool_version", "level",
         "qualification_seconds", "development_key", "catalog_sha256", "state_capacity")


def _signature(sig: signing.Signature | None) -> dict:
    if sig is None:
        return {}
    return {"algorithm": sig.algorithm, "key_id": sig.key_id, "development_key": sig.development_key,
            "value": base64.b64encode(sig.value).decode()}


def qualified_report(doc: Document) -> dict:
    """Everything `report --json` prints for a qualified manifest."""
    m: QualifiedManifest = doc.record  # type: ignore[assignment]
    groups = group_rejections(s for s in m.symbols if s.status == "rejected")
    rejected = [{"module": s.module, "target": s.target, "symbol": s.name, "check": s.check, "class": c,
                 "reason": s.reason} for c, members in groups for s in members]
    symbols = [{"symbol": s.name, "module": s.module, "target": s.target, "status": s.status, "block": s.block,
                "dynamic_smem": s.dynamic_smem, "resources": to_dict(s.resources) if s.resources else {},
                "fallback": s.fallback, "params": [to_dict(p) for p in s.params],
                "checks": [to_dict(c) for c in s.checks]}
               for s in m.symbols]
    artifacts = [{k: getattr(a, k) for k in ("path", "module", "target", "role", "code", "size", "sha256")}
                 for a in m.artifacts]
    return {"manifest": {k: getattr(m, k) for k in _HEAD}, "device": to_dict(m.device),
            "toolchain": to_dict(m.toolchain), "signature": _signature(doc.signature),
            "summary": qualified_summary(m), "rejected_by_class": class_counts(groups), "rejected": rejected,
            "symbols": symbols, "artifacts": artifacts,
            "routes": [to_dict(r) for r in m.routes]}


def index_report(doc: Document) -> dict:
    """`report --json` of a release index: its body and its [signature] table."""
    return {**to_dict(doc.record), "signature": _signature(doc.signature)}


def _sig_line(sig: signing.Signature | None) -> str:
    if sig is None:
        return "unsigned"
    dev = " (development key)" if sig.development_key else ""
    return f"signed by key {sig.key_id[:16]}{dev}; run `mamba-forge verify` to check it"


def check_labels(checks) -> list[str]:
    """A name per check that tells repeated ones apart: `correctness(uniform)` for the check run on corpus
    `uniform` (its detail says `corpus uniform: ...`), else the detail's first words, else a count."""
    from collections import Counter

    repeated = {n for n, k in Counter(c.name for c in checks).items() if k > 1}
    labels, seen = [], Counter()
    for c in checks:
        if c.name not in repeated:
            labels.append(c.name)
            continue
        seen[c.name] += 1
        head = c.detail.split(":", 1)[0].strip() if c.detail else ""
        head = head.removeprefix("corpus ").strip()
        labels.append(f"{c.name}({head})" if head and len(head) <= 40 else f"{c.name}#{seen[c.name]}")
    return labels


def render_qualified(doc: Document, console: Console, *, symbols: tuple[str, ...] = (), digests: bool = False,
                     kernels: tuple[str, ...] = ()) -> None:
    """Header, the per-module summary and every rejection; per-symbol resources and checks only for the symbols
    matching `symbols`; digests (checks and artifacts) only with `digests`. `kernels` narrows everything."""
    m: QualifiedManifest = doc.record  # type: ignore[assignment]
    if kernels:
        m = dataclasses.replace(m, symbols=[s for s in m.symbols if match_any(s.name, kernels)])
    dev = m.device
    _say(console, f"qualified on {dev.name} (cc {dev.cc}, {dev.sm_count} SMs, driver {dev.driver_version}, "
                  f"{dev.count} GPU) level {m.level}, {m.qualification_seconds:.1f} s")
    _say(console, f"created {m.created}, expires {m.expires}")
    _say(console, _sig_line(doc.signature))
    table = _Rows("symbols per module kind", ("module", "target", "role", "admitted", "rejected", "other"),
                   ("admitted", "rejected", "other"))
    for r in qualified_summary(m):
        table.add_row(r["module"], r["target"], r["role"], str(r["admitted"]), str(r["rejected"]), str(r["other"]),
                      style="yellow" if r["rejected"] else None)
    table.print(console)
    rejected = [s for s in m.symbols if s.status == "rejected"]
    if rejected:
        _head(console, "rejected", len(rejected))
        for indent, line in rejection_lines(rejected):
            _say(console, line, indent)
    else:
        _say(console, "no symbol rejected")
    chosen = [s for s in m.symbols if symbols and match_any(s.name, symbols)]
    if chosen:
        _head(console, "symbols", len(chosen))
    for s in chosen:
        _say(console, f"{s.name} ({s.module}/{s.target}) {s.status}")
        r = s.resources
        if r is not None:
            _say(console, f"regs {r.registers}, smem {r.static_smem}, dyn smem {s.dynamic_smem}, local "
                          f"{r.local_bytes}, blocks/SM {r.blocks_per_sm}, block {'x'.join(map(str, s.block))}", 4)
        if s.checks:
            labels = check_labels(s.checks)
            if digests:
                for c, label in zip(s.checks, labels, strict=True):
                    _say(console, f"{label} {check_verdict(c) or 'passed'}" + (f" {c.digest}" if c.digest else ""), 4)
            else:
                _say(console, "checks: " + " ".join(label + (f" ({v})" if (v := check_verdict(c)) else "")
                                                    for c, label in zip(s.checks, labels, strict=True)), 4)
    if not symbols:
        _say(console, "per-symbol resources and checks: --symbols GLOB; digests: --digests")
    art = _Rows("artifacts", ("path", "role", "code", "size") + (("sha256",) if digests else ()), ("size",))
    for a in m.artifacts:
        art.add_row(a.path, a.role, a.code, str(a.size), *((a.sha256,) if digests else ()))
    art.print(console)


def render_index(doc: Document, console: Console, *, digests: bool = False) -> None:
    ix: ReleaseIndex = doc.record  # type: ignore[assignment]
    _say(console, f"release index created {ix.created}, expires {ix.expires}")
    _say(console, _sig_line(doc.signature))
    t = _Rows("entries", ("device", "cc", "SMs", "level", "path", "size") + (("sha256",) if digests else ()))
    for e in ix.entries:
        t.add_row(e.device_name, e.cc, str(e.sm_count), e.level, e.path, str(e.size), *((e.sha256,) if digests else ()))
    t.print(console)


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md(lines: list[str]) -> str:
    """The markdown document: each line escaped (_safe), so a field holding a newline stays in its line."""
    return "\n".join(_safe(line) for line in lines) + "\n"


def qualified_markdown(doc: Document) -> str:
    """Release notes for a qualified manifest (or an index): device, counts, rejections with reasons, digests."""
    if isinstance(doc.record, ReleaseIndex):
        ix = doc.record
        lines = ["# mamba-forge release index", "", f"Created {ix.created}, expires {ix.expires}.", "",
                 "| device | cc | SMs | level | file | sha256 |", "| --- | --- | --- | --- | --- | --- |"]
        for e in ix.entries:
            lines.append(f"| {_md_escape(e.device_name)} | {e.cc} | {e.sm_count} | {e.level} | `{e.path}` | `{e.sha256}` |")
        return _md(lines)
    m: QualifiedManifest = doc.record  # type: ignore[assignment]
    dev = m.device
    lines = [
        f"# mamba-forge kernels qualified on {dev.name}", "",
        f"Compute capability {dev.cc}, {dev.sm_count} SMs, driver {dev.driver_version}; level `{m.level}`, tool "
        f"{m.tool_version}, created {m.created}, expires {m.expires}.",
    ]
    if doc.signature is not None:
        lines.append(f"Signed by key `{doc.signature.key_id}`"
                     + (" (development key)." if doc.signature.development_key else "."))
    lines += ["", "## Symbols", "", "| module | target | role | admitted | rejected | other |",
              "| --- | --- | --- | ---: | ---: | ---: |"]
    for r in qualified_summary(m):
        lines.append(f"| {r['module']} | {r['target']} | {r['role']} | {r['admitted']} | {r['rejected']} | {r['other']} |")
    groups = group_rejections(s for s in m.symbols if s.status == "rejected")
    if groups:
        lines += ["", "## Rejected", "", counts_line(groups) + ".", "",
                  "| class | symbol | module | check | reason |", "| --- | --- | --- | --- | --- |"]
        for c, members in groups:
            for s in members:
                lines.append(f"| {c} | `{s.name}` | {s.module}/{s.target} | {s.check} | {_md_escape(s.reason)} |")
    lines += ["", "## Artifacts", "", "| path | role | size | sha256 |", "| --- | --- | ---: | --- |"]
    for a in m.artifacts:
        lines.append(f"| `{a.path}` | {a.role} | {a.size} | `{a.sha256}` |")
    return _md(lines)


def digest_symbols(d: dict) -> int:
    """How many symbols changed at least one check digest."""
    return len({x["symbol"] for x in d["digest_changes"]})


def render_diff(d: dict, console: Console, a: str = "A", b: str = "B", *, digests: bool = False) -> None:
    """Symbols added/removed, status, verdict and resource changes listed; digest changes as a count unless
    `digests` (then every old -> new)."""
    if not d["changed"]:
        _say(console, f"no differences between {a} and {b}")
        return
    _say(console, f"changes from {a} to {b}")
    for key, title in (("added", "symbols added"), ("removed", "symbols removed"),
                       ("artifacts_added", "artifacts added"), ("artifacts_removed", "artifacts removed")):
        if d[key]:
            _head(console, title, len(d[key]))
            for x in d[key]:
                _say(console, f"+ {x}" if "added" in key else f"- {x}", 2)
    for key, title in (("newly_rejected", "newly rejected"), ("newly_admitted", "newly admitted"),
                       ("status_changed", "status changed")):
        if d[key]:
            _head(console, title, len(d[key]))
            for x in d[key]:
                why = f": {x['reason']}" if x["reason"] else ""
                _say(console, f"{x['symbol']}: {x['old']} -> {x['new']}{why}", 2)
    if d["resource_changes"]:
        _head(console, "resource changes", len(d['resource_changes']))
        for x in d["resource_changes"]:
            _say(console, f"{x['symbol']}: {x['field']} {x['old']} -> {x['new']}", 2)
    n_sym, n_art = digest_symbols(d), len(d["artifact_changes"])
    if not (n_sym or n_art):
        return
    if not digests:
        _say(console, f"{n_sym:,} symbol{'s' * (n_sym != 1)} changed digest, {n_art:,} artifact"
                      f"{'s' * (n_art != 1)} changed sha256 (list them: --digests)")
        return
    _head(console, "digest changes", len(d['digest_changes']) + n_art)
    for x in d["artifact_changes"]:
        _say(console, f"{x['path']}: {x['old']} -> {x['new']}", 2)
    for x in d["digest_changes"]:
        _say(console, f"{x['symbol']} {x['check']}: {x['old']} -> {x['new']}", 2)
