"""Hopper wgmma GEMM benchmark: every TriadSm90a rung against torch.matmul (cuBLAS) in the same run, bf16 and f16.

Each rung launches through the public runtime (`kernels.gemm(..., symbol=NAME)` on a signed bundle): its tensor
maps, grid and arguments come from the rung's signed contract, as an engine's launches do (a hand-built launch here
once hit an illegal address on the skinny rungs, whose A box differs).
CUDA-event timing, warm-up first, median of --iters (>= 20) launches on random data; prints a table and appends
rows (date, GPU, symbol, shape, TFLOP/s, ratio to cuBLAS) to benchmarks/results/gemm_sm90a.md and records (ms
against cuBLAS, goal >= 0.9x cuBLAS; summary_records below) to benchmarks/results/summary.json. Not a test.

    python benchmarks/bench_gemm_sm90a.py --bundle BUNDLE --key manifests/keys [--iters 30] [--dtype bf16]
        [--shapes 4096x4096x4096,8192x8192x8192] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import cuda_device, gemm_parser, load_signed, matching, shapes, table_lines, utc_stamp, write_results
from summary import record  # benchmarks/summary.py
from timing import median_ms  # benchmarks/timing.py

RESULTS = Path(__file__).parent / "results" / "gemm_sm90a.md"
HEADER = ("| date | GPU | symbol | layout | M | N | K | ms | TFLOP/s | cuBLAS TFLOP/s | ratio |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
DEFAULT_SHAPES = "4096x4096x4096,8192x8192x8192,16384x4096x2048"
SMOKE_SHAPES = "1024x1024x1024"
GOAL = 0.9  # large bf16/f16 tensor-core GEMMs: >= 0.9x cuBLAS (benchmarks/results/README.md)


def layout_of(name: str) -> str:
    return name.split("_")[2]  # gemm_bi_<layout>_sm90a_...


def rungs(kernels) -> list[tuple[str, str]]:
    """(symbol, family) of every admitted TriadSm90a rung in the bundle, in name order."""
    out = []
    for name in sorted(kernels.admitted()):
        sym = kernels.symbol(name)
        if sym.module == "TriadSm90a":
            out.append((name, sym.family))
    return out


def parser() -> argparse.ArgumentParser:
    ap = gemm_parser(__doc__, DEFAULT_SHAPES, SMOKE_SHAPES, signed=True, symbols="symbols")
    ap.add_argument("--dtype", choices=["bf16", "f16", "both"], default="bf16")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    gpu = cuda_device().name
    kernels = load_signed(args.bundle, args.key)
    admitted = rungs(kernels)
    if not admitted:
        raise SystemExit(f"{args.bundle}: no admitted TriadSm90a rung on {gpu}; qualify the module on this GPU first")
    dtypes = ["bf16", "f16"] if args.dtype == "both" else [args.dtype]
    date = utc_stamp()
    rows = []
    for dt in dtypes:
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16}[dt]
        picked = matching([n for n, _ in admitted if n.endswith("_" + dt)], args.symbols)
        names = [(n, fam) for n, fam in admitted if n in picked]
        for M, N, K in shapes(args.shapes):
            g = torch.Generator(device="cuda").manual_seed(0)
            flops = 2.0 * M * N * K
            cublas = {}
            for lay in sorted({layout_of(n) for n, _ in names}):
                a_shape = (M, K) if lay in ("nn", "nt") else (K, M)
                b_shape = (K, N) if lay in ("nn", "tn") else (N, K)
                A = torch.randn(a_shape, generator=g, device="cuda").to(tdt)
                B = torch.randn(b_shape, generator=g, device="cuda").to(tdt)
                a_op = A if lay != "tn" else A.t()
                b_op = B if lay != "nt" else B.t()
                ms_ref = median_ms(lambda a_op=a_op, b_op=b_op: torch.matmul(a_op, b_op), args.iters)
                cublas[lay] = (ms_ref, A, B)
            for name, family in names:
                lay = layout_of(name)
                ms_ref, A, B = cublas[lay]
                C = torch.empty((M, N), dtype=tdt, device="cuda")
                try:
                    kernels.gemm(A, B, out=C, layout=lay, symbol=name)
                except Exception as exc:  # a rung that refuses this shape (divisibility, TMA limits) says why
                    print(f"skip {name} {M}x{N}x{K}: {exc}")
                    continue

                def run(A=A, B=B, C=C, lay=lay, name=name):
                    kernels.gemm(A, B, out=C, layout=lay, symbol=name)

                ms = median_ms(run, args.iters)
                # a sanity check of the result so a fast wrong kernel cannot post a number
                ref = torch.matmul(A if lay != "tn" else A.t(), B if lay != "nt" else B.t())
                rel = float((C.float() - ref.float()).norm() / ref.float().norm())
                ok = "" if rel < 1e-2 else f" WRONG (rel err {rel:.2e})"
                row = (date, gpu, name, lay, M, N, K, ms, flops / ms / 1e9, flops / ms_ref / 1e9, ms_ref / ms, ms_ref,
                       family, rel < 1e-2)  # the table writes the first 11; the summary records use the rest
                rows.append(row)
                print(f"{name:48s} {lay} {M:6d} {N:6d} {K:6d}  {ms:8.3f} ms  {row[8]:7.1f} TFLOP/s  "
                      f"cuBLAS {row[9]:7.1f}  ratio {row[10]:.3f}{ok}")
    if args.smoke:
        return 0
    write_results(RESULTS, "# Hopper wgmma GEMM vs torch.matmul (cuBLAS), same run\n\n" + HEADER,
                  table_lines(rows, ("",) * 7 + (".3f", ".1f", ".1f", ".3f")), summary_records(rows, gpu))
    return 0


def summary_records(rows: list[tuple], gpu: str) -> list[dict]:
    """summary.json records for main()'s rows: ms against cuBLAS in the rung's dtype and layout (the symbol names
    both); a rung whose result failed the sanity check is recorded as not met, so it supersedes an older record."""
    return [record(family=family, symbol=name, shape=f"M{M}xN{N}xK{K}", dtype=name.rsplit("_", 1)[1],
                   ours=round(ms, 5), baseline=round(ms_ref, 5), baseline_name="cuBLAS (torch)", unit="ms",
                   goal=f">={GOAL}x cuBLAS", met=ok and ratio >= GOAL, gpu=gpu)
            for _date, _gpu, name, _lay, M, N, K, ms, _tf, _tf_ref, ratio, ms_ref, family, ok in rows]


if __name__ == "__main__":
    sys.exit(main())
