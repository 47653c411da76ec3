"""The GEMM route tuning table's pure parts (benchmarks/tune_routes.py measures, these decide and write): the winner
per M (a near tie keeps the previous winner), M ranges, the table's text, and merging a run's shapes into the
committed table (--merge)."""

from __future__ import annotations

import math
import re
import tomllib

TIMINGS = "route_tuning_timings.json"
HEADER = """\
# GEMM route tuning: which rung of a route class (kernels/routes.toml) serves first at which (N, K, M).
# Schema: mamba_forge/catalog/route_tuning.py (every rule below is checked when the catalog loads).
#
# The rungs of a class compute the same bits (proven on the device by the qualifier's route-equivalence check),
# so the rung may depend on N, K and M freely; the class is still chosen from (N, K, bias) and admission alone.
# [[tune]]: a route key (layout, a, b, c), one of its classes (`class`), and `rules`: each an auto rung of that
#   class (`symbol`) with ranges n, k, m = [lo, hi] (hi = 0: unbounded; default [1, 0]); rules of a class never
#   overlap. Having chosen the class, the selector takes the rule holding (N, K, M) when its rung serves there
#   (admitted, divisibility, bias), else the class's own order (routes.toml). The table reaches the runtime
#   through the qualified manifest's routes (re-qualify after changing it).
"""


def pick_winners(times: dict[int, dict[str, float]], tie: float) -> dict[int, str]:
    """M -> the fastest rung (ties by name); a rung within `tie` of the fastest that won the previous M keeps
    winning, so noise between near-equal rungs does not split the M ranges."""
    winners: dict[int, str] = {}
    prev = None
    for m in sorted(times):
        t = times[m]
        if not t:
            continue
        best = min(sorted(t), key=t.__getitem__)
        if prev in t and t[prev] <= t[best] * (1 + tie):
            best = prev
        winners[m] = prev = best
    return winners


def merge_ranges(winners: dict[int, str]) -> list[tuple[int, int, str]]:
    """(lo, hi, rung) covering M >= 1 (hi 0: unbounded): adjacent measured M with one winner merged; a change
    between measured M values a < b is placed at isqrt(a * b) (a <= it < b)."""
    ms = sorted(winners)
    out, lo = [], 1
    for i, m in enumerate(ms):
        last = i + 1 == len(ms)
        if last or winners[ms[i + 1]] != winners[m]:
            hi = 0 if last else math.isqrt(m * ms[i + 1])
            out.append((lo, hi, winners[m]))
            lo = hi + 1
    return out


def shape_times(shape: dict, dropped) -> dict[int, dict[str, float]]:
    """M -> {rung: ms} of a measured shape (JSON keys are text), leaving out the rungs in `dropped`."""
    return {int(m): {s: t for s, t in row["rungs"].items() if s not in dropped} for m, row in shape["M"].items()}


def _us(ms: float) -> str:
    return f"{ms * 1e3:.1f} us"


def render_table(results: dict) -> str:
    """The tuning table for a run's results (what route_tuning_timings.json holds): the same text for the same
    results; entries sorted by key and class, rules by (N, K, M)."""
    lines = [HEADER.rstrip("\n"),
             f"# Measured on {results['gpu']} at {results['date']} by benchmarks/tune_routes.py: GPU time in CUDA",
             f"#   graphs ({results['inner']} calls per replay, median of {results['reps']} replays), ties within "
             f"{results['tie']:.0%} kept; every rung bit-identical to its class reference on the same inputs.",
             f"#   All timings: {TIMINGS} of that run. Per M below: the winner and cuBLAS (torch.matmul)."]
    for e in sorted(results["entries"], key=lambda e: (*e["key"], e["class"])):
        rules = []
        for shape in sorted(e["shapes"], key=lambda s: (s["N"], s["K"])):
            times = shape_times(shape, e["dropped"])
            winners = pick_winners(times, results["tie"])
            if not winners:
                continue
            rules.append(f"  # {shape['name']} (N {shape['N']}, K {shape['K']})")
            for m, sym in winners.items():
                ref = shape["M"][str(m)]["cublas"]
                rules.append(f"  #   M {m}: {sym} {_us(times[m][sym])}, cuBLAS {_us(ref)} ({ref / times[m][sym]:.2f}x)")
            for lo, hi, sym in merge_ranges(winners):
                rules.append(f'  {{ symbol = "{sym}", n = [{shape["N"]}, {shape["N"]}], '
                             f'k = [{shape["K"]}, {shape["K"]}], m = [{lo}, {hi}] }},')
        if rules:
            layout, a, b, c = e["key"]
            lines += ["", "[[tune]]", f'layout = "{layout}"', f'a = "{a}"', f'b = "{b}"', f'c = "{c}"',
                      f'class = "{e["class"]}"', "rules = [", *rules, "]"]
    return "\n".join(lines) + "\n"


_BLOCK = re.compile(r"^  # .* \(N (\d+), K (\d+)\)")


def _sections(text: str) -> tuple[list[str], list[dict]]:
    """A table's text as (header lines, sections): each section its [[tune]] lines up to `rules = [` (preamble),
    its key and class, and its rule blocks in order: {(N, K): lines}, a block being a shape's comment line
    (`  # name (N n, K k)...`) with every line up to the next such line or the list's end."""
    lines = text.splitlines()
    header, sections, cur, block = [], [], None, None
    for line in lines:
        if line == "[[tune]]":
            cur = {"preamble": [line], "blocks": {}, "in_rules": False}
            sections.append(cur)
            block = None
        elif cur is None:
            header.append(line)
        elif not cur["in_rules"]:
            cur["preamble"].append(line)
            cur["in_rules"] = line.startswith("rules = [")
        elif line == "]":
            cur["in_rules"] = None  # closed: blank lines after it belong to no block
        elif cur["in_rules"] is None:
            continue
        elif (m := _BLOCK.match(line)) is not None:
            block = cur["blocks"].setdefault((int(m[1]), int(m[2])), [])
            block.append(line)
        elif block is not None:
            block.append(line)
        else:
            cur["preamble"].append(line)
    for sec in sections:
        (doc,) = tomllib.loads("\n".join(x for x in sec["preamble"] if not x.startswith("rules = [")))["tune"]
        sec["id"] = (doc["layout"], doc["a"], doc["b"], doc["c"], doc["class"])
    return header, sections


def merge_tables(old: str, new: str) -> str:
    """The committed table with a run's measured shapes merged in: each (key, class, N, K) the run measured
    replaces that shape's rules (or joins its class's section, or a new section), every other shape's rules and
    comments stay as they were; the run's "Measured on" lines join the header."""
    old_header, old_secs = _sections(old)
    new_header, new_secs = _sections(new)
    measured = [x for x in new_header[len(HEADER.rstrip("\n").splitlines()):] if x.strip()]
    by_id = {sec["id"]: sec for sec in old_secs}
    for sec in new_secs:
        if sec["id"] in by_id:
            by_id[sec["id"]]["blocks"].update(sec["blocks"])
        else:
            old_secs.append(sec)
            by_id[sec["id"]] = sec
    head = [x for x in old_header if x.strip()]
    shapes = ", ".join(f"N {n} K {k}" for sec in new_secs for n, k in sec["blocks"])
    head += [x.replace("# Measured on", "# Merged in (tune_routes.py --merge): measured on", 1) for x in measured]
    head.append(f"#   Shapes merged: {shapes}.")
    out = [*head]
    for sec in old_secs:
        out += ["", *sec["preamble"]]
        for lines in sec["blocks"].values():
            out += lines
        out.append("]")
    return "\n".join(out) + "\n"
