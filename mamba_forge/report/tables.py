"""Readable tables of build (and, via qualify, qualified) manifests."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.table import Table

from mamba_forge.manifest.records import BuildManifest


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


# ---- qualified manifests, indexes and diffs (plain dicts, as tomllib reads them) ---------------------------


def _artifact_roles(body: dict) -> dict[tuple[str, str], str]:
    return {(a["module"], a["target"]): a.get("role", "") for a in body.get("artifacts", [])}


def qualified_summary(body: dict) -> list[dict]:
    """One row per module kind and target: role and symbol counts by status."""
    roles = _artifact_roles(body)
    rows: dict[tuple[str, str], dict] = {}
    for s in body.get("symbols", []):
        key = (s["module"], s["target"])
        r = rows.setdefault(key, {"module": key[0], "target": key[1], "role": roles.get(key, ""),
                                  "admitted": 0, "rejected": 0, "other": 0})
        r[s["status"] if s["status"] in ("admitted", "rejected") else "other"] += 1
    return list(rows.values())


def qualified_report(body: dict) -> dict:
    """Everything `report --json` prints for a qualified manifest."""
    head = {k: body.get(k) for k in ("kind", "schema_version", "manifest_version", "created", "expires", "tool_version",
                                      "level", "qualification_seconds", "development_key", "catalog_sha256",
                                      "state_capacity") if k in body}
    rejected = [{"module": s["module"], "target": s["target"], "symbol": s["name"], "check": s.get("check", ""),
                 "reason": s.get("reason", "")} for s in body.get("symbols", []) if s["status"] == "rejected"]
    symbols = [{"symbol": s["name"], "module": s["module"], "target": s["target"], "status": s["status"],
                "block": s.get("block", []), "dynamic_smem": s.get("dynamic_smem", 0),
                "resources": s.get("resources", {}), "fallback": s.get("fallback", []),
                "checks": [{"name": c["name"], "passed": c.get("passed"), "digest": c.get("digest", ""),
                            "detail": c.get("detail", "")} for c in s.get("checks", [])]}
               for s in body.get("symbols", [])]
    artifacts = [{k: a.get(k) for k in ("path", "module", "target", "role", "code", "size", "sha256")}
                 for a in body.get("artifacts", [])]
    return {"manifest": head, "device": body.get("device", {}), "toolchain": body.get("toolchain", {}),
            "signature": body.get("signature", {}), "summary": qualified_summary(body), "rejected": rejected,
            "symbols": symbols, "artifacts": artifacts, "routes": body.get("routes", [])}


def _sig_line(body: dict) -> str:
    sig = body.get("signature") or {}
    if not sig:
        return "unsigned"
    dev = " (development key)" if sig.get("development_key") else ""
    return f"signed by key {str(sig.get('key_id', ''))[:16]}…{dev}; run `mamba-forge verify` to check it"


def render_qualified(body: dict, console: Console) -> None:
    dev = body.get("device", {})
    console.print(
        f"[bold]qualified on {dev.get('name')}[/bold] (cc {dev.get('cc')}, {dev.get('sm_count')} SMs, driver "
        f"{dev.get('driver_version')}, {dev.get('count', 1)} GPU) level {body.get('level')}, "
        f"{body.get('qualification_seconds', 0):.1f}s, created {body.get('created')}, expires {body.get('expires')}",
        highlight=False, soft_wrap=True,
    )
    console.print(_sig_line(body), markup=False, highlight=False, soft_wrap=True)
    table = Table(title="symbols per module kind")
    for col in ("module", "target", "role", "admitted", "rejected", "other"):
        table.add_column(col, justify="right" if col in ("admitted", "rejected", "other") else "left")
    for r in qualified_summary(body):
        table.add_row(r["module"], r["target"], r["role"], str(r["admitted"]), str(r["rejected"]), str(r["other"]),
                      style="yellow" if r["rejected"] else None)
    console.print(table)
    res = Table(title="resources and checks")
    for col in ("symbol", "target", "status", "regs", "smem", "dyn smem", "local", "blocks/SM", "checks"):
        res.add_column(col)
    for s in body.get("symbols", []):
        r = s.get("resources") or {}
        checks = " ".join(f"{c['name']}{'' if c.get('passed') else '✗'}:{c.get('digest', '')[:8]}" if c.get("digest")
                          else f"{c['name']}{'' if c.get('passed') else '✗'}" for c in s.get("checks", []))
        res.add_row(s["name"], s["target"], s["status"], str(r.get("registers", "")), str(r.get("static_smem", "")),
                    str(s.get("dynamic_smem", 0)), str(r.get("local_bytes", "")), str(r.get("blocks_per_sm", "")),
                    checks, style="red" if s["status"] == "rejected" else None)
    console.print(res)
    rejected = [s for s in body.get("symbols", []) if s["status"] == "rejected"]
    if rejected:
        console.print(f"[bold]rejected[/bold] ({len(rejected)})")
        for s in rejected:
            console.print(f"  - {s['name']} ({s['module']}/{s['target']}, check {s.get('check') or '?'}): "
                          f"{s.get('reason') or 'no reason recorded'}", markup=False, highlight=False, soft_wrap=True)
    art = Table(title="artifacts")
    for col in ("path", "role", "code", "size", "sha256"):
        art.add_column(col)
    for a in body.get("artifacts", []):
        art.add_row(a["path"], a.get("role", ""), a.get("code", ""), str(a.get("size", "")), a.get("sha256", ""))
    console.print(art)


def render_index(body: dict, console: Console) -> None:
    console.print(f"[bold]release index[/bold] created {body.get('created')}, expires {body.get('expires')}", highlight=False)
    console.print(_sig_line(body), markup=False, highlight=False)
    t = Table(title="entries")
    for col in ("device", "cc", "SMs", "level", "path", "size", "sha256"):
        t.add_column(col)
    for e in body.get("entries", []):
        t.add_row(e["device_name"], e["cc"], str(e["sm_count"]), e.get("level", ""), e["path"], str(e["size"]), e["sha256"])
    console.print(t)


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def qualified_markdown(body: dict) -> str:
    """Release notes for a qualified manifest (or an index): device, counts, rejections with reasons, digests."""
    if body.get("kind") == "index":
        lines = ["# mamba-forge release index", "", f"Created {body.get('created')}, expires {body.get('expires')}.", "",
                 "| device | cc | SMs | level | file | sha256 |", "| --- | --- | --- | --- | --- | --- |"]
        for e in body.get("entries", []):
            lines.append(f"| {_md_escape(e['device_name'])} | {e['cc']} | {e['sm_count']} | {e.get('level', '')} | "
                         f"`{e['path']}` | `{e['sha256']}` |")
        return "\n".join(lines) + "\n"
    dev = body.get("device", {})
    lines = [
        f"# mamba-forge kernels qualified on {dev.get('name')}", "",
        f"Compute capability {dev.get('cc')}, {dev.get('sm_count')} SMs, driver {dev.get('driver_version')}; "
        f"level `{body.get('level')}`, tool {body.get('tool_version')}, created {body.get('created')}, "
        f"expires {body.get('expires')}.",
    ]
    sig = body.get("signature") or {}
    if sig:
        lines.append(f"Signed by key `{sig.get('key_id')}`" + (" (development key)." if sig.get("development_key") else "."))
    lines += ["", "## Symbols", "", "| module | target | role | admitted | rejected | other |",
              "| --- | --- | --- | ---: | ---: | ---: |"]
    for r in qualified_summary(body):
        lines.append(f"| {r['module']} | {r['target']} | {r['role']} | {r['admitted']} | {r['rejected']} | {r['other']} |")
    rejected = [s for s in body.get("symbols", []) if s["status"] == "rejected"]
    if rejected:
        lines += ["", "## Rejected", "", "| symbol | module | check | reason |", "| --- | --- | --- | --- |"]
        for s in rejected:
            lines.append(f"| `{s['name']}` | {s['module']}/{s['target']} | {s.get('check', '')} | "
                         f"{_md_escape(s.get('reason', ''))} |")
    lines += ["", "## Artifacts", "", "| path | role | size | sha256 |", "| --- | --- | ---: | --- |"]
    for a in body.get("artifacts", []):
        lines.append(f"| `{a['path']}` | {a.get('role', '')} | {a.get('size', '')} | `{a.get('sha256', '')}` |")
    return "\n".join(lines) + "\n"


def render_diff(d: dict, console: Console, a: str = "A", b: str = "B") -> None:
    def line(text: str) -> None:  # plain text, one line per change however long
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    if not d.get("changed"):
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
                why = f": {x['reason']}" if x.get("reason") else ""
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
