"""f32-storage GEMM benchmark on the H200: the TF32 wgmma rungs (TriadSm90a, layout NT) against cuBLAS TF32
(torch.matmul with torch.backends.cuda.matmul.allow_tf32 = True), and the exact-f32 cp.async rung (Fixed, NN)
against cuBLAS fp32 (allow_tf32 = False), in the same run; the portable TF32 rung triad_sm80_nt_tf32 and the
exact-f32 class reference gemm_bi_f32_f32_n128_s2 beside them for reference (timed, not recorded). The rungs are
built here (benchmarks/built.py) and launch through the runtime (`kernels.gemm(..., symbol=NAME)`: tensor maps,
grid and arguments from each rung's contract).

CUDA-event timing, warm-up first, median of --iters (>= 20) launches on random data; every result is checked
against an f32 cuBLAS product (TF32 off) first, so a fast wrong kernel cannot post a number. Prints a table,
appends rows to benchmarks/results/gemm_f32.md and records (one per rung and shape) to
benchmarks/results/summary.json (goal >= 0.85x cuBLAS TF32, resp. fp32). Not a test.

    python benchmarks/bench_gemm_f32.py [--iters 30] [--shapes 4096x4096x4096,8192x8192x8192,16384x4096x2048] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import summary  # benchmarks/summary.py
from built import built_kernels  # benchmarks/built.py
from common import cuda_device, gemm_parser, shapes, table_lines, utc_stamp, write_results  # benchmarks/common.py
from timing import median_ms  # benchmarks/timing.py

RESULTS = Path(__file__).parent / "results" / "gemm_f32.md"
HEADER = ("| date | GPU | symbol | math | M | N | K | ms | TFLOP/s | cuBLAS TFLOP/s | ratio |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
DEFAULT_SHAPES = "4096x4096x4096,8192x8192x8192,16384x4096x2048"
SMOKE_SHAPES = "1024x1024x1024"
TF32_RUNGS = ["gemm_bi_nt_sm90a_wgmma_tf32_m128n256_s4", "gemm_bi_nt_sm90a_wgmma_tf32_m128n128_s6"]
PORTABLE_TF32 = "triad_sm80_nt_tf32"  # timed for reference, not recorded
EXACT_RUNGS = ["gemm_bi_f32_f32_async_m128n128_bk16_s3"]
EXACT_REFERENCE = "gemm_bi_f32_f32_n128_s2"  # the fma-chain class reference: timed, not recorded; bits compared
GOAL = 0.85
BASELINES = {"tf32": "cuBLAS TF32 (torch, allow_tf32)", "f32": "cuBLAS fp32 (torch, TF32 off)"}


def parser() -> argparse.ArgumentParser:
    ap = gemm_parser(__doc__, DEFAULT_SHAPES, SMOKE_SHAPES)
    ap.add_argument("--no-summary", action="store_true", help="do not write benchmarks/results/summary.json")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    gpu = cuda_device().name
    names = TF32_RUNGS + [PORTABLE_TF32, EXACT_REFERENCE] + EXACT_RUNGS
    k = built_kernels(("TriadSm90a", "TriadSm80", "Fixed"), kernels=names, prefix="mf-bench-f32-")
    date = utc_stamp()
    torch.backends.cuda.matmul.allow_tf32 = False
    rows, records = [], []
    for M, N, K in shapes(args.shapes):
        g = torch.Generator(device="cuda").manual_seed(0)
        A = torch.randn((M, K), generator=g, device="cuda")
        B = torch.randn((N, K), generator=g, device="cuda")  # NT: B is [N, K] (torch Linear's weight)
        Bnn = B.t().contiguous()  # exact f32, NN: B is [K, N]
        exact = torch.matmul(A, Bnn)  # the check's f32 reference (TF32 off)
        torch.backends.cuda.matmul.allow_tf32 = True
        ms_tf32 = median_ms(lambda a=A, bt=B.t(): torch.matmul(a, bt), args.iters)
        torch.backends.cuda.matmul.allow_tf32 = False
        ms_fp32 = median_ms(lambda a=A, b=Bnn: torch.matmul(a, b), args.iters)
        # (math, rungs, recorded rungs, layout, B operand, cuBLAS ms and its name, the check's relative error bound:
        # TF32 inputs ~1e-3 on randn data, f32 sums in another order ~1e-6 at K = 8192)
        for kind, rungs, recorded, layout, b_op, ms_ref, base, tol in (
                ("tf32", TF32_RUNGS + [PORTABLE_TF32], TF32_RUNGS, "nt", B, ms_tf32, "cuBLAS TF32", 5e-3),
                ("f32", [EXACT_REFERENCE] + EXACT_RUNGS, EXACT_RUNGS, "nn", Bnn, ms_fp32, "cuBLAS fp32", 1e-4)):
            ref_bits = None  # the exact class reference's output: each exact rung must give its bits
            for name in rungs:
                if name not in k.admitted():
                    print(f"skip {name}: not in the build or not admitted")
                    continue
                C = torch.empty((M, N), dtype=torch.float32, device="cuda")

                def run(A=A, b_op=b_op, C=C, layout=layout, math="tf32" if kind == "tf32" else None, name=name):
                    k.gemm(A, b_op, out=C, layout=layout, math=math, symbol=name)

                run()
                torch.cuda.synchronize()
                rel = float((C - exact).norm() / exact.norm())
                if name == EXACT_REFERENCE:
                    ref_bits = C.view(torch.int32).clone()
                same = "" if ref_bits is None or name == EXACT_REFERENCE else (
                    " bits = class reference" if torch.equal(C.view(torch.int32), ref_bits)
                    else " BITS DIFFER from the class reference")
                if not rel < tol:
                    print(f"{name:48s} M{M}xN{N}xK{K}: WRONG (relative error {rel:.2e} against f32 cuBLAS); not timed")
                    continue
                ms = median_ms(run, args.iters)
                ratio = ms_ref / ms
                row = (date, gpu, name, kind, M, N, K, ms, flops(M, N, K) / ms / 1e9, flops(M, N, K) / ms_ref / 1e9,
                       ratio)
                rows.append(row)
                print(f"{name:48s} {M:6d} {N:6d} {K:6d}  {ms:8.3f} ms  {row[8]:7.1f} TFLOP/s  "
                      f"{base} {row[9]:7.1f}  ratio {ratio:.3f}  (rel err {rel:.1e}){same}")
                if name in recorded:
                    records.append(summary.record(
                        family=k.symbol(name).family, symbol=name, shape=f"M{M}xN{N}xK{K}", dtype=kind,
                        ours=round(ms, 5), baseline=round(ms_ref, 5), baseline_name=BASELINES[kind], unit="ms",
                        goal=f">={GOAL}x {base}", met=ratio >= GOAL and "DIFFER" not in same, gpu=gpu))
        del A, B, Bnn, exact
        torch.cuda.empty_cache()
    if args.smoke:
        return 0
    write_results(RESULTS, "# f32-storage GEMMs (TF32 wgmma) vs torch.matmul (cuBLAS), same run\n\n" + HEADER,
                  table_lines(rows, ("",) * 7 + (".3f", ".1f", ".1f", ".3f")), [] if args.no_summary else records)
    return 0


def flops(M: int, N: int, K: int) -> float:
    return 2.0 * M * N * K


if __name__ == "__main__":
    sys.exit(main())
