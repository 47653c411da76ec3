"""Achieved bandwidth of the conv1d forward/backward and training-step kernels (AdamW, gradient norm) against a
torch device-to-device copy of the same bytes, measured in the same run.

    python benchmarks/bench_conv_optim.py [--reps 25] [--only SUBSTRING] [--params 200] [--no-write] [--smoke]

--smoke: conv1d at SMOKE_CONV, AdamW and the norm over 1M parameters, 5 launches per figure; nothing recorded.

Shapes: conv1d at B4 D4096 L4096 (Mamba-1 2.8B's d_inner at a 4k context; 128 MB per bf16 tensor), width 4;
AdamW and the gradient norm over --params million parameters (default 200M). Bytes moved = every buffer read
plus every buffer written (in/out buffers count twice; the tiny weight/bias/descriptor arrays are counted too).
Baseline: torch's copy of half those bytes (a copy reads and writes each byte, so it moves the same total).
Timing: CUDA events around each launch, 3 warm-up launches, median of --reps (at least 20). Ratio = kernel
GB/s / copy GB/s. Prints a table and appends rows to benchmarks/results/conv_optim.md (date, GPU, kernel,
shape, GB/s, copy GB/s, ratio) and records to benchmarks/results/summary.json (benchmarks/summary.py, as
bench_conv1d.py writes them: ours = GB/s, baseline = copy GB/s, speedup = the ratio). The goal is a ratio >= 0.85
for the conv1d forwards and AdamW (and >= 0.70 for the conv1d backward, bench_conv1d.py's goal for the same records).
Before it is timed, each kernel is launched once and its outputs compared with a float64 reference within the
qualifier's tolerance for their dtype: the conv1d kernels, AdamW and the norm from NaN-poisoned outputs against the
reference their catalog family names (mamba_forge/references/; bench_memory_bound.py check_output), the
multi-tensor AdamW (in place: nothing to poison) tensor by tensor against references/optim.py adamw with each
tensor's own weight decay (multi_check). A kernel that fails is still timed, printed WRONG, recorded as not met
(its ratio marked WRONG in the table), and the run exits 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import summary  # benchmarks/summary.py
from bench_memory_bound import check_output, host_array, output_check  # benchmarks/bench_memory_bound.py
from built import built_kernels, bytes_moved, contract_kwargs, uniform_tensors  # benchmarks/built.py
from common import append_table, bandwidth_parser, cuda_device, device_values, utc_stamp  # benchmarks/common.py
from timing import copy_seconds, time_events  # benchmarks/timing.py

ROOT = Path(__file__).resolve().parent.parent

SIZES = {"f32": 4, "bf16": 2, "f16": 2}
CONV = {"batch": 4, "d": 4096, "L": 4096, "width": 4}
SMOKE_CONV = {"batch": 1, "d": 256, "L": 1024, "width": 4}
SMOKE_REPS = 5
# family -> goal (a fraction of the copy's bandwidth): the docstring's 0.85 for the conv1d forwards and AdamW, and
# bench_conv1d.py's 0.70 for conv1d_bwd_tiled (its records have the same symbol, shape and dtype as ours).
# grad_sumsq_partial has no goal: goal "" and met = at least the copy's bandwidth (parity with the baseline, as
# bench_scan.py encodes its goal-less rows).
GOALS = {"conv1d_burnin_forward_nosave_tiled": 0.85, "conv1d_burnin_forward_tiled": 0.85, "conv1d_bwd_tiled": 0.70,
         "adamw_step": 0.85, "adamw_step_capturable": 0.85, "adamw_step_multi": 0.85}


# ---- cases: (kernel, shape text, setup(kernels, catalog module) -> (launch, bytes moved, check)) -------------
# check() launches once and compares the outputs with the float64 reference: (ok, what).
# Each kernel is built here (benchmarks/built.py) and launches through the runtime: its keyword call, grid, block
# and arguments from its contract at the case's dims (literal scalars at their qualified values: AdamW's lr 1e-3,
# betas 0.9 / 0.999, eps 1e-8, weight decay 0.1, step 10).
FILLS = {"m": (-0.1, 0.1), "v": (1e-6, 1e-2), "lr": (1e-3, 1e-3)}  # the rest uniform in [-1, 1); counters zero


def contract_case(name: str, shape: str, dims: dict):
    def setup(k, fixed):
        kern = k.function(name)
        kwargs = contract_kwargs(kern, dims, uniform_tensors(FILLS))
        return ((lambda: kern(**kwargs)), bytes_moved(kern, kwargs),
                lambda: check_output(kern, fixed.family(kern.family), kwargs, dims))

    return (name, shape, setup)


def multi_check(kern, fam, kwargs: dict, keep: list[tuple], decays: list[float]) -> tuple[bool, str]:
    """adamw_step_multi's check: one launch, then each tensor its descriptors point at (param, grad, exp_avg,
    exp_avg_sq in `keep`; updated in place) against references/optim.py adamw in float64 on its values before the
    launch, with its own weight decay and the launch's scalars, within the family's tolerances (output_check)."""
    import torch

    from mamba_forge.references.optim import adamw

    before = [[host_array(x) for x in t] for t in keep]
    kern(**kwargs)
    torch.cuda.synchronize()
    names = ("param", "exp_avg", "exp_avg_sq")
    dtypes = dict(zip(names, (kern.dtype, "f32", "f32"), strict=True))
    scalars = {s: kwargs[s] for s in ("lr", "beta1", "beta2", "eps")}
    for j, ((p, g, m, v), t, wd) in enumerate(zip(before, keep, decays, strict=True)):
        ref = adamw(p, g, m, v, **scalars, weight_decay=wd, step=int(kwargs["step"]))
        got = {"param": host_array(t[0]), "exp_avg": host_array(t[2]), "exp_avg_sq": host_array(t[3])}
        ok, what = output_check(fam.qualify, dtypes, got, dict(zip(names, ref, strict=True)))
        if not ok:
            return False, f"tensor {j} of {len(keep)} ({t[0].numel()} elements): {what}"
    return True, f"{len(keep)} tensors within tolerance"


def conv_cases(conv=CONV):
    shape = f"B{conv['batch']} D{conv['d']} L{conv['L']} w{conv['width']}"
    return [contract_case(f"{fam}_{dt}", shape, conv) for dt in ("bf16", "f16", "f32")
            for fam in ("conv1d_burnin_forward_nosave_tiled", "conv1d_burnin_forward_tiled", "conv1d_bwd_tiled")]


def optim_cases(millions: int):
    n = millions * 1_000_000
    shape = f"{millions}M params"

    def multi(dt):
        def setup(k, fixed):
            import torch

            # a Mamba-like spread of tensor sizes: many mid-sized matrices plus small vectors
            sizes, left, i = [], n, 0
            while left > 0:
                s = min(left, [4_194_304, 2_097_152, 4096, 1_048_576 + 17][i % 4])
                sizes.append(s)
                left -= s
                i += 1
            decays = []  # each tensor's weight decay, as its descriptor holds it
            keep, desc = [], np.zeros(len(sizes), np.dtype([("param", "<u8"), ("grad", "<u8"), ("exp_avg", "<u8"),
                                                            ("exp_avg_sq", "<u8"), ("numel", "<i8"),
                                                            ("weight_decay", "<f4"), ("reserved", "<u4")]))
            for j, s in enumerate(sizes):
                t = (device_values(s, dt), device_values(s, dt), device_values(s, "f32", -0.1, 0.1),
                     device_values(s, "f32", 1e-6, 1e-2))
                keep.append(t)
                decays.append(0.1 if j % 4 else 0.0)
                desc[j] = (*(x.data_ptr() for x in t), s, decays[-1], 0)
            table = torch.from_numpy(desc.view(np.uint8)).cuda()
            kern = k.function(f"adamw_step_multi_{dt}")
            kwargs = contract_kwargs(kern, {"tensors": len(sizes)}, lambda p, count: table)

            def launch():
                kern(**kwargs)

            launch.keep = keep  # the tensors the descriptors point at live as long as the launcher
            # each tensor's param and grad (dt) and moments (f32): params and moments read and written, grads read
            return launch, n * (3 * SIZES[dt] + 16), lambda: multi_check(kern, fixed.family(kern.family), kwargs,
                                                                         keep, decays)

        return setup

    return [contract_case(name, shape, {"n": n})
            for name in ("adamw_step_f32", "adamw_step_f32_capturable", "grad_sumsq_partial_f32")] + [
        ("adamw_step_multi_bf16", shape, multi("bf16")),
        ("adamw_step_multi_f32", shape, multi("f32")),
    ]


def parser() -> argparse.ArgumentParser:
    ap = bandwidth_parser(__doc__, "small conv1d shape, 1M parameters, 5 launches; seconds, nothing recorded",
                          "benchmarks/results/conv_optim.md or summary.json", reps=SMOKE_REPS, params=1)
    ap.add_argument("--params", type=int, default=200, help="millions of parameters for AdamW and the norm")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)

    import torch

    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    gpu = cuda_device().name
    fixed = load_catalog(default_catalog_path()).module("Fixed")
    cases = [c for c in conv_cases(SMOKE_CONV if a.smoke else CONV) + optim_cases(a.params) if a.only in c[0]]
    k = built_kernels(("Fixed",), kernels=[c[0] for c in cases], prefix="mf-bench-conv-optim-")  # only those
    rows, wrong = [], set()
    print(f"{'kernel':42} {'shape':22} {'MB':>9} {'us':>9} {'GB/s':>7} {'copy GB/s':>10} {'ratio':>6}")
    for name, shape, setup in cases:
        launch, moved, check = setup(k, fixed)
        ok, what = check()  # before timing: a fast wrong kernel posts no met figure
        t = time_events(launch, a.reps)
        del launch, check
        torch.cuda.empty_cache()
        tc = copy_seconds(moved // 2, a.reps)
        sym = k.function(name)
        r = {"kernel": name, "shape": shape, "mb": moved / 1e6, "us": t * 1e6, "gbs": moved / t / 1e9,
             "copy_gbs": moved / tc / 1e9, "ratio": tc / t, "family": sym.family, "dtype": sym.dtype or "-",
             "ok": ok, "check": what}
        rows.append(r)
        print(f"{name:42} {shape:22} {r['mb']:9.1f} {r['us']:9.1f} {r['gbs']:7.0f} {r['copy_gbs']:10.0f} "
              f"{r['ratio']:6.2f}")
        if not ok:
            wrong.add((name, shape))
            print(f"WRONG: {name} {shape}: output differs from the float64 reference: {what}", flush=True)
    if not a.no_write and rows:
        out = ROOT / "benchmarks" / "results" / "conv_optim.md"
        date = utc_stamp("%Y-%m-%d")
        append_table(out, "# conv1d and training-step kernels vs device-to-device copy (same run)\n\n"
                          "| date | GPU | kernel | shape | GB/s | copy GB/s | ratio |\n"
                          "| --- | --- | --- | --- | --- | --- | --- |\n",
                     (f"| {date} | {gpu} | {r['kernel']} | {r['shape']} | {r['gbs']:.0f} | {r['copy_gbs']:.0f} | "
                      f"{r['ratio']:.2f}{' WRONG (output check failed)' if (r['kernel'], r['shape']) in wrong else ''}"
                      " |\n" for r in rows))
        print(f"appended {len(rows)} rows to {out.relative_to(ROOT)}")
        summary.append(summary_records(rows, gpu, wrong))
        print(f"appended {len(rows)} records to {summary.SUMMARY.relative_to(ROOT)}")
    return 1 if wrong else 0


def summary_records(rows: list[dict], gpu: str, wrong: set = frozenset()) -> list[dict]:
    """summary.json records for main()'s rows: bandwidth against the copy of the same bytes (speedup = the ratio of
    the two bandwidths); the goal from GOALS by family. A (kernel, shape) in `wrong` (its output failed the check)
    is recorded as not met, superseding an older record."""
    recs = []
    for r in rows:
        goal = GOALS.get(r["family"])
        recs.append(summary.record(
            family=r["family"], symbol=r["kernel"], shape=r["shape"], dtype=r["dtype"], ours=round(r["gbs"], 1),
            baseline=round(r["copy_gbs"], 1), baseline_name="torch device-to-device copy, same bytes", unit="GB/s",
            goal="" if goal is None else f">= {goal} of copy bandwidth",
            met=r["ratio"] >= (1.0 if goal is None else goal) and (r["kernel"], r["shape"]) not in wrong, gpu=gpu,
            speedup=round(r["ratio"], 3)))
    return recs


if __name__ == "__main__":
    raise SystemExit(main())
