"""conv1d forward (nosave, save) and backward: the production kernels (and any candidate families named in KINDS)
against a torch device-to-device copy of the same bytes, measured in the same run. The forward's layout was picked
this way on 2026-12-01 from four candidates, and two f32-accumulating ones (results in summary.json: the f32
accumulation reached 0.77-0.82 nosave / 0.91-0.95 save in 16-bit, the f64 contract's best 0.64-0.68 / 0.84-0.90);
the candidate families were then dropped from the catalog.

    python benchmarks/bench_conv1d.py [--reps 25] [--only SUBSTRING] [--no-write] [--smoke]

--smoke: one small shape (SMOKE_SHAPE), 5 launches per figure; seconds, nothing recorded.

Shapes (width 4): B4 D4096 L4096 (Mamba-1 2.8B's d_inner at a 4k context) and B8 D1536 L6144. Byte floor =
every buffer read plus every buffer written once: nosave 2 n sizeof(T) (x in, out), save 3 n sizeof(T), backward
4 n sizeof(T) (x, pre, dout in, dx out), plus the f32 weight/bias (and dweight/dbias) arrays. Baseline: torch's
copy of half those bytes (a copy reads and writes each byte: the same total). Timing: CUDA events around each
launch, 3 warm-up launches, median of --reps (at least 20); the copy is re-timed per (shape, dtype, kind). The
families are built here (benchmarks/built.py) and each kernel launches through the runtime: its keyword call,
grid, block and arguments from its contract at the shape.
Ratio = kernel GB/s / copy GB/s; goal >= 0.85 for the forwards, >= 0.70 for the backward. Prints a table and the
best symbol per (kind, dtype, shape), and appends records to benchmarks/results/summary.json (benchmarks/summary.py:
ours = GB/s, baseline = copy GB/s, speedup = the ratio).
Before it is timed, each kernel is launched once from NaN-poisoned outputs (out, pre; dx, dweight, dbias) and every
output compared with the float64 reference of mamba_forge/references/conv1d.py its catalog family names, within the
qualifier's tolerance for the output's dtype (bench_memory_bound.py check_output: f32 rtol 1e-5 atol 1e-6, bf16
1e-2 / 1e-2, f16 1e-2 / 1e-3): a kernel that fails is still timed, printed WRONG, recorded as not met and left out
of the best per (kind, dtype, shape), and the run exits 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench_memory_bound import check_output  # benchmarks/bench_memory_bound.py
from built import built_kernels, bytes_moved, contract_kwargs, uniform_tensors  # benchmarks/built.py
from common import bandwidth_parser, cuda_device  # benchmarks/common.py
from timing import copy_seconds, time_events  # benchmarks/timing.py

ROOT = Path(__file__).resolve().parent.parent

SHAPES = [{"batch": 4, "d": 4096, "L": 4096, "width": 4}, {"batch": 8, "d": 1536, "L": 6144, "width": 4}]
SMOKE_SHAPE = {"batch": 1, "d": 256, "L": 1024, "width": 4}
SMOKE_REPS = 5
# kind -> (production family, candidate families, T-sized buffers moved, goal)
KINDS = {
    "fwd_nosave": ("conv1d_burnin_forward_nosave_tiled", (), 2, 0.85),
    "fwd_save": ("conv1d_burnin_forward_tiled", (), 3, 0.85),
    "bwd": ("conv1d_bwd_tiled", (), 4, 0.70),
}
FILLS = {"x": (-2.0, 2.0), "pre": (-4.0, 4.0), "dout": (-1.0, 1.0), "weight": (-1.0, 1.0), "bias": (-1.0, 1.0)}


def shape_text(dims: dict) -> str:
    return f"B{dims['batch']} D{dims['d']} L{dims['L']} w{dims['width']}"


def parser() -> argparse.ArgumentParser:
    return bandwidth_parser(__doc__, "one small shape, 5 launches; seconds, nothing recorded",
                            "benchmarks/results/summary.json", reps=SMOKE_REPS)


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)

    import summary  # benchmarks/summary.py
    import torch

    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    gpu = cuda_device().name
    fixed = load_catalog(default_catalog_path()).module("Fixed")
    families = [f for prod, cands, _, _ in KINDS.values() for f in (prod, *cands)]
    k = built_kernels(("Fixed",), kernels=[f"{f}_*" for f in families], prefix="mf-bench-conv1d-")
    rows, records, wrong = [], [], set()
    print(f"{'kind':10} {'symbol':42} {'shape':20} {'MB':>8} {'us':>8} {'GB/s':>6} {'copy GB/s':>9} {'ratio':>6} goal")
    for dims in [SMOKE_SHAPE] if a.smoke else SHAPES:
        for kind, (prod, cands, _, goal) in KINDS.items():
            for dt in ("bf16", "f16", "f32"):
                syms = [k.symbol(n) for n in sorted(k.admitted()) if a.only in n]
                syms = [s for fam in (prod, *cands) for s in syms if s.family == fam and s.dtype == dt]
                copy_t = None
                for sym in syms:
                    kern = k.function(sym.name)
                    kwargs = contract_kwargs(kern, dims, uniform_tensors(FILLS))
                    moved = bytes_moved(kern, kwargs)
                    ok, check = check_output(kern, fixed.family(sym.family), kwargs, dims)  # before timing
                    t = time_events(lambda kern=kern, kwargs=kwargs: kern(**kwargs), a.reps)
                    del kwargs
                    torch.cuda.empty_cache()
                    if copy_t is None:  # the same bytes for every symbol of this (shape, kind, dtype)
                        copy_t = copy_seconds(moved // 2, a.reps)
                    ratio = copy_t / t
                    r = {"kind": kind, "symbol": sym.name, "family": sym.family, "dtype": dt,
                         "shape": shape_text(dims), "mb": moved / 1e6, "us": t * 1e6, "gbs": moved / t / 1e9,
                         "copy_gbs": moved / copy_t / 1e9, "ratio": ratio, "goal": goal, "ok": ok, "check": check}
                    rows.append(r)
                    print(f"{kind:10} {sym.name:42} {r['shape']:20} {r['mb']:8.1f} {r['us']:8.1f} {r['gbs']:6.0f} "
                          f"{r['copy_gbs']:9.0f} {ratio:6.3f} "
                          f"{'WRONG' if not ok else 'met' if ratio >= goal else '-'}", flush=True)
                    if not ok:
                        wrong.add((sym.name, r["shape"]))
                        print(f"WRONG: {sym.name} {r['shape']}: output differs from the float64 reference: {check}",
                              flush=True)
                    records.append(summary.record(
                        family=sym.family, symbol=sym.name, shape=r["shape"], dtype=dt, ours=round(r["gbs"], 1),
                        baseline=round(r["copy_gbs"], 1), baseline_name="torch device-to-device copy, same bytes",
                        unit="GB/s", goal=f">= {goal} of copy bandwidth",
                        met=ratio >= goal and (sym.name, r["shape"]) not in wrong, gpu=gpu,
                        speedup=round(ratio, 3)))
    print("\nbest per (kind, dtype, shape):")
    best: dict[tuple, dict] = {}
    for r in [row for row in rows if row["ok"]]:  # a wrong kernel is no one's best
        key = (r["kind"], r["dtype"], r["shape"])
        if key not in best or r["ratio"] > best[key]["ratio"]:
            best[key] = r
    for (kind, dt, shape), r in sorted(best.items()):
        prod = next((p for p in rows if (p["kind"], p["dtype"], p["shape"]) == (kind, dt, shape)
                     and p["family"] == KINDS[kind][0]), None)
        was = f"(production {prod['ratio']:.3f})" if prod else ""
        print(f"  {kind:10} {dt:5} {shape:20} {r['symbol']:42} {r['ratio']:.3f} {was}")
    if not a.no_write and records:
        summary.append(records)
        print(f"appended {len(records)} records to {summary.SUMMARY.relative_to(ROOT)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
