"""The summary `mamba-forge qualify` prints after a run: symbol counts by status per module and target, then
the rejections grouped by the class of their reason (classes.py), with a count per class first."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from mamba_forge.core.errors import printable
from mamba_forge.core.schema import QualifiedManifest
from mamba_forge.report.classes import counts_line, group_rejections

MAX_LISTED_REJECTIONS = 40  # the rest: `mamba-forge report`


def render_qualify_summary(m: QualifiedManifest, console: Console) -> None:
    # the device's name is the driver's and the reasons quote symbol names: escaped, never markup
    t = Table(title=Text(printable(f"{m.device.name} (cc {m.device.cc}, {m.device.sm_count} SMs, x{m.device.count}) "
                                   f"— {m.level}")))
    for col in ("module", "target", "admitted", "checked", "rejected", "built only"):
        t.add_column(col, justify="left" if col in ("module", "target") else "right")
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for s in m.symbols:
        r = rows.setdefault((s.module, s.target), {"admitted": 0, "checked": 0, "rejected": 0, "built-only": 0})
        r[s.status] += 1
    for (mod, tgt), r in rows.items():
        t.add_row(Text(printable(mod)), Text(printable(tgt)), str(r["admitted"]), str(r["checked"]), str(r["rejected"]),
                  str(r["built-only"]))
    console.print(t)
    for indent, line in rejection_lines([s for s in m.symbols if s.status == "rejected"], MAX_LISTED_REJECTIONS):
        console.print(" " * indent + printable(line, limit=1 << 20), markup=False, highlight=False)


def rejection_lines(rejected: list, limit: int | None = None) -> list[tuple[int, str]]:
    """(indent, text) lines: the count per class, then each class with its symbols; at most `limit` symbols."""
    if not rejected:
        return []
    groups = group_rejections(rejected)
    out = [(2, counts_line(groups))]
    shown = 0
    for cls, members in groups:
        out.append((2, f"{cls} ({len(members)})"))
        for s in members:
            if limit is not None and shown >= limit:
                break
            out.append((4, f"{s.name} ({s.module}/{s.target}) [{s.check}] {s.reason or 'no reason recorded'}"))
            shown += 1
    if limit is not None and len(rejected) > limit:
        out.append((2, f"and {len(rejected) - limit} more rejected (mamba-forge report)"))
    return out


__all__ = ["rejection_lines", "render_qualify_summary"]
