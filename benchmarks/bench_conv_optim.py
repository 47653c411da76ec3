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
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import summary  # benchmarks/summary.py
from built import built_kernels, launcher_at, uniform_tensors  # benchmarks/built.py
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


# ---- cases: (kernel, shape text, setup(kernels) -> (launch callable, bytes moved)) ------------------------
# Each kernel is built here (benchmarks/built.py) and launches through the runtime: its keyword call, grid, block
# and arguments from its contract at the case's dims (literal scalars at their qualified values: AdamW's lr 1e-3,
# betas 0.9 / 0.999, eps 1e-8, weight decay 0.1, step 10).
FILLS = {"m": (-0.1, 0.1), "v": (1e-6, 1e-2), "lr": (1e-3, 1e-3)}  # the rest uniform in [-1, 1); counters zero


def contract_case(name: str, shape: str, dims: dict):
    return (name, shape, lambda k: launcher_at(k.function(name), dims, uniform_tensors(FILLS)))


def conv_cases(conv=CONV):
    shape = f"B{conv['batch']} D{conv['d']} L{conv['L']} w{conv['width']}"
    return [contract_case(f"{fam}_{dt}", shape, conv) for dt in ("bf16", "f16", "f32")
            for fam in ("conv1d_burnin_forward_nosave_tiled", "conv1d_burnin_forward_tiled", "conv1d_bwd_tiled")]


def optim_cases(millions: int):
    n = millions * 1_000_000
    shape = f"{millions}M params"

    def multi(dt):
        def setup(k):
            import torch

            # a Mamba-like spread of tensor sizes: many mid-sized matrices plus small vectors
            sizes, left, i = [], n, 0
            while left > 0:
                s = min(left, [4_194_304, 2_097_152, 4096, 1_048_576 + 17][i % 4])
                sizes.append(s)
                left -= s
                i += 1
            keep, desc = [], np.zeros(len(sizes), np.dtype([("param", "<u8"), ("grad", "<u8"), ("exp_avg", "<u8"),
                                                            ("exp_avg_sq", "<u8"), ("numel", "<i8"),
                                                            ("weight_decay", "<f4"), ("reserved", "<u4")]))
            for j, s in enumerate(sizes):
                t = (device_values(s, dt), device_values(s, dt), device_values(s, "f32", -0.1, 0.1),
                     device_values(s, "f32", 1e-6, 1e-2))
                keep.append(t)
                desc[j] = (*(x.data_ptr() for x in t), s, 0.1 if j % 4 else 0.0, 0)
            table = torch.from_numpy(desc.view(np.uint8)).cuda()
            launch, _ = launcher_at(k.function(f"adamw_step_multi_{dt}"), {"tensors": len(sizes)},
                                    lambda p, count: table)
            launch.keep = keep  # the tensors the descriptors point at live as long as the launcher
            # each tensor's param and grad (dt) and moments (f32): params and moments read and written, grads read
            return launch, n * (3 * SIZES[dt] + 16)

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

    gpu = cuda_device().name
    cases = [c for c in conv_cases(SMOKE_CONV if a.smoke else CONV) + optim_cases(a.params) if a.only in c[0]]
    k = built_kernels(("Fixed",), kernels=[c[0] for c in cases], prefix="mf-bench-conv-optim-")  # only those
    rows = []
    print(f"{'kernel':42} {'shape':22} {'MB':>9} {'us':>9} {'GB/s':>7} {'copy GB/s':>10} {'ratio':>6}")
    for name, shape, setup in cases:
        launch, moved = setup(k)
        t = time_events(launch, a.reps)
        del launch
        torch.cuda.empty_cache()
        tc = copy_seconds(moved // 2, a.reps)
        sym = k.function(name)
        r = {"kernel": name, "shape": shape, "mb": moved / 1e6, "us": t * 1e6, "gbs": moved / t / 1e9,
             "copy_gbs": moved / tc / 1e9, "ratio": tc / t, "family": sym.family, "dtype": sym.dtype or "-"}
        rows.append(r)
        print(f"{name:42} {shape:22} {r['mb']:9.1f} {r['us']:9.1f} {r['gbs']:7.0f} {r['copy_gbs']:10.0f} "
              f"{r['ratio']:6.2f}")
    if not a.no_write and rows:
        out = ROOT / "benchmarks" / "results" / "conv_optim.md"
        date = utc_stamp("%Y-%m-%d")
        append_table(out, "# conv1d and training-step kernels vs device-to-device copy (same run)\n\n"
                          "| date | GPU | kernel | shape | GB/s | copy GB/s | ratio |\n"
                          "| --- | --- | --- | --- | --- | --- | --- |\n",
                     (f"| {date} | {gpu} | {r['kernel']} | {r['shape']} | {r['gbs']:.0f} | {r['copy_gbs']:.0f} | "
                      f"{r['ratio']:.2f} |\n" for r in rows))
        print(f"appended {len(rows)} rows to {out.relative_to(ROOT)}")
        summary.append(summary_records(rows, gpu))
        print(f"appended {len(rows)} records to {summary.SUMMARY.relative_to(ROOT)}")
    return 0


def summary_records(rows: list[dict], gpu: str) -> list[dict]:
    """summary.json records for main()'s rows: bandwidth against the copy of the same bytes (speedup = the ratio of
    the two bandwidths); the goal from GOALS by family."""
    recs = []
    for r in rows:
        goal = GOALS.get(r["family"])
        recs.append(summary.record(
            family=r["family"], symbol=r["kernel"], shape=r["shape"], dtype=r["dtype"], ours=round(r["gbs"], 1),
            baseline=round(r["copy_gbs"], 1), baseline_name="torch device-to-device copy, same bytes", unit="GB/s",
            goal="" if goal is None else f">= {goal} of copy bandwidth",
            met=r["ratio"] >= (1.0 if goal is None else goal), gpu=gpu, speedup=round(r["ratio"], 3)))
    return recs


if __name__ == "__main__":
    raise SystemExit(main())
