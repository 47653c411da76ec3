"""Readable tables of build (and, via qualify, qualified) manifests."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.table import Table

from .records import BuildManifest


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
