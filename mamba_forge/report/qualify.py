"""The summary `mamba-forge qualify` prints after a run: symbol counts by status per module and target, then
the rejections."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from mamba_forge.manifest.schema import QualifiedManifest

MAX_LISTED_REJECTIONS = 40  # the rest: `mamba-forge report`


def render_qualify_summary(m: QualifiedManifest, console: Console) -> None:
    t = Table(title=f"{m.device.name} (cc {m.device.cc}, {m.device.sm_count} SMs, x{m.device.count}) — {m.level}")
    for col in ("module", "target", "admitted", "checked", "rejected", "built only"):
        t.add_column(col, justify="left" if col in ("module", "target") else "right")
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for s in m.symbols:
        r = rows.setdefault((s.module, s.target), {"admitted": 0, "checked": 0, "rejected": 0, "built-only": 0})
        r[s.status] += 1
    for (mod, tgt), r in rows.items():
        t.add_row(mod, tgt, str(r["admitted"]), str(r["checked"]), str(r["rejected"]), str(r["built-only"]))
    console.print(t)
    rej = [s for s in m.symbols if s.status == "rejected"]
    for s in rej[:MAX_LISTED_REJECTIONS]:
        console.print(f"  {s.name} [{s.check}] {s.reason}", markup=False, highlight=False)
    if len(rej) > MAX_LISTED_REJECTIONS:
        console.print(f"  and {len(rej) - MAX_LISTED_REJECTIONS} more rejected (mamba-forge report)", markup=False)


__all__ = ["render_qualify_summary"]
