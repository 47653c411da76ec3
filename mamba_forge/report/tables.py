"""Readable tables of build manifests, qualified manifests and release indexes (records of manifest/schema.py)."""

from __future__ import annotations

import base64
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from mamba_forge.manifest import signing
from mamba_forge.manifest.codec import to_dict
from mamba_forge.manifest.schema import BuildManifest, QualifiedManifest, ReleaseIndex
from mamba_forge.report.diff import Document


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


def render_build(manifest: BuildManifest, console: Console) -> None:
    table = Table(title=f"build of catalog {manifest.catalog} (state capacity {manifest.state_capacity})")
    for col in ("module", "target", "role", "mandatory", "status", "admitted", "rejected"):
        table.add_column(col, justify="right" if col in ("admitted", "rejected") else "left")
    for r in build_summary(manifest):
        style = "red" if r["status"] == "failed" else ("yellow" if r["rejected"] else None)
        table.add_row(
            r["module"], r["target"], r["role"], "yes" if r["mandatory"] else "no", r["status"],
            str(r["admitted"]), str(r["rejected"]), style=style,
        )
    console.print(table)
    by_module: dict[str, list[str]] = defaultdict(list)
    for m, s in manifest.symbols():
        if s.verdict.status == "rejected":
            by_module[f"{m.kind} / {m.target}"].append(s.verdict.reason)
    for m in manifest.modules:
        if m.status == "failed" and m.log_head:
            console.print(f"[red]{m.kind} on {m.target} failed to compile:[/red]")
            console.print(m.log_head, markup=False, highlight=False)
    for where, reasons in by_module.items():
        console.print(f"[bold]rejected in {where}[/bold] ({len(reasons)})")
        for reason in reasons:
            console.print(f"  - {reason}", markup=False, highlight=False)


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
    rejected = [{"module": s.module, "target": s.target, "symbol": s.name, "check": s.check, "reason": s.reason}
                for s in m.symbols if s.status == "rejected"]
    symbols = [{"symbol": s.name, "module": s.module, "target": s.target, "status": s.status, "block": s.block,
                "dynamic_smem": s.dynamic_smem, "resources": to_dict(s.resources) if s.resources else {},
                "fallback": s.fallback, "params": [to_dict(p) for p in s.params],
                "checks": [to_dict(c) for c in s.checks]}
               for s in m.symbols]
    artifacts = [{k: getattr(a, k) for k in ("path", "module", "target", "role", "code", "size", "sha256")}
                 for a in m.artifacts]
    return {"manifest": {k: getattr(m, k) for k in _HEAD}, "device": to_dict(m.device),
            "toolchain": to_dict(m.toolchain), "signature": _signature(doc.signature),
            "summary": qualified_summary(m), "rejected": rejected, "symbols": symbols, "artifacts": artifacts,
            "routes": [to_dict(r) for r in m.routes]}


def index_report(doc: Document) -> dict:
    """`report --json` of a release index: its body and its [signature] table."""
    return {**to_dict(doc.record), "signature": _signature(doc.signature)}


def _sig_line(sig: signing.Signature | None) -> str:
    if sig is None:
        return "unsigned"
    dev = " (development key)" if sig.development_key else ""
    return f"signed by key {sig.key_id[:16]}…{dev}; run `mamba-forge verify` to check it"


def render_qualified(doc: Document, console: Console) -> None:
    m: QualifiedManifest = doc.record  # type: ignore[assignment]
    dev = m.device
    console.print(
        f"[bold]qualified on {dev.name}[/bold] (cc {dev.cc}, {dev.sm_count} SMs, driver {dev.driver_version}, "
        f"{dev.count} GPU) level {m.level}, {m.qualification_seconds:.1f}s, created {m.created}, expires {m.expires}",
        highlight=False, soft_wrap=True,
    )
    console.print(_sig_line(doc.signature), markup=False, highlight=False, soft_wrap=True)
    table = Table(title="symbols per module kind")
    for col in ("module", "target", "role", "admitted", "rejected", "other"):
        table.add_column(col, justify="right" if col in ("admitted", "rejected", "other") else "left")
    for r in qualified_summary(m):
        table.add_row(r["module"], r["target"], r["role"], str(r["admitted"]), str(r["rejected"]), str(r["other"]),
                      style="yellow" if r["rejected"] else None)
    console.print(table)
    res = Table(title="resources and checks")
    for col in ("symbol", "target", "status", "regs", "smem", "dyn smem", "local", "blocks/SM", "checks"):
        res.add_column(col)
    for s in m.symbols:
        r = s.resources
        checks = " ".join(f"{c.name}{'' if c.passed else '✗'}" + (f":{c.digest[:8]}" if c.digest else "")
                          for c in s.checks)
        figures = [str(x) for x in (r.registers, r.static_smem)] if r else ["", ""]
        more = [str(x) for x in (r.local_bytes, r.blocks_per_sm)] if r else ["", ""]
        res.add_row(s.name, s.target, s.status, *figures, str(s.dynamic_smem), *more, checks,
                    style="red" if s.status == "rejected" else None)
    console.print(res)
    rejected = [s for s in m.symbols if s.status == "rejected"]
    if rejected:
        console.print(f"[bold]rejected[/bold] ({len(rejected)})")
        for s in rejected:
            console.print(f"  - {s.name} ({s.module}/{s.target}, check {s.check or '?'}): "
                          f"{s.reason or 'no reason recorded'}", markup=False, highlight=False, soft_wrap=True)
    art = Table(title="artifacts")
    for col in ("path", "role", "code", "size", "sha256"):
        art.add_column(col)
    for a in m.artifacts:
        art.add_row(a.path, a.role, a.code, str(a.size), a.sha256)
    console.print(art)


def render_index(doc: Document, console: Console) -> None:
    ix: ReleaseIndex = doc.record  # type: ignore[assignment]
    console.print(f"[bold]release index[/bold] created {ix.created}, expires {ix.expires}", highlight=False)
    console.print(_sig_line(doc.signature), markup=False, highlight=False)
    t = Table(title="entries")
    for col in ("device", "cc", "SMs", "level", "path", "size", "sha256"):
        t.add_column(col)
    for e in ix.entries:
        t.add_row(e.device_name, e.cc, str(e.sm_count), e.level, e.path, str(e.size), e.sha256)
    console.print(t)


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def qualified_markdown(doc: Document) -> str:
    """Release notes for a qualified manifest (or an index): device, counts, rejections with reasons, digests."""
    if isinstance(doc.record, ReleaseIndex):
        ix = doc.record
        lines = ["# mamba-forge release index", "", f"Created {ix.created}, expires {ix.expires}.", "",
                 "| device | cc | SMs | level | file | sha256 |", "| --- | --- | --- | --- | --- | --- |"]
        for e in ix.entries:
            lines.append(f"| {_md_escape(e.device_name)} | {e.cc} | {e.sm_count} | {e.level} | `{e.path}` | `{e.sha256}` |")
        return "\n".join(lines) + "\n"
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
    rejected = [s for s in m.symbols if s.status == "rejected"]
    if rejected:
        lines += ["", "## Rejected", "", "| symbol | module | check | reason |", "| --- | --- | --- | --- |"]
        for s in rejected:
            lines.append(f"| `{s.name}` | {s.module}/{s.target} | {s.check} | {_md_escape(s.reason)} |")
    lines += ["", "## Artifacts", "", "| path | role | size | sha256 |", "| --- | --- | ---: | --- |"]
    for a in m.artifacts:
        lines.append(f"| `{a.path}` | {a.role} | {a.size} | `{a.sha256}` |")
    return "\n".join(lines) + "\n"


def render_diff(d: dict, console: Console, a: str = "A", b: str = "B") -> None:
    def line(text: str) -> None:  # plain text, one line per change however long
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    if not d["changed"]:
        line(f"no differences between {a} and {b}")
        return
    line(f"changes from {a} to {b}")
    for key, title in (("added", "symbols added"), ("removed", "symbols removed"),
                       ("artifacts_added", "artifacts added"), ("artifacts_removed", "artifacts removed")):
        if d[key]:
            console.print(f"[bold]{title}[/bold] ({len(d[key])})")
            for x in d[key]:
                line(f"  + {x}" if "added" in key else f"  - {x}")
    for key, title in (("newly_rejected", "newly rejected"), ("newly_admitted", "newly admitted"),
                       ("status_changed", "status changed")):
        if d[key]:
            console.print(f"[bold]{title}[/bold] ({len(d[key])})")
            for x in d[key]:
                why = f": {x['reason']}" if x["reason"] else ""
                line(f"  {x['symbol']}: {x['old']} -> {x['new']}{why}")
    if d["resource_changes"]:
        console.print(f"[bold]resource changes[/bold] ({len(d['resource_changes'])})")
        for x in d["resource_changes"]:
            line(f"  {x['symbol']}: {x['field']} {x['old']} -> {x['new']}")
    if d["digest_changes"] or d["artifact_changes"]:
        console.print(f"[bold]digest changes[/bold] ({len(d['digest_changes']) + len(d['artifact_changes'])})")
        for x in d["artifact_changes"]:
            line(f"  {x['path']}: {x['old'][:16]} -> {x['new'][:16]}")
        for x in d["digest_changes"]:
            line(f"  {x['symbol']} {x['check']}: {x['old'][:16]} -> {x['new'][:16]}")
