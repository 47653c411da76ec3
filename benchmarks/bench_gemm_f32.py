"""f32-storage GEMM benchmark on the H200: the TF32 wgmma rungs (TriadSm90a, layout NT) against cuBLAS TF32
(torch.matmul with torch.backends.cuda.matmul.allow_tf32 = True), and the exact-f32 cp.async rung (Fixed, NN)
against cuBLAS fp32 (allow_tf32 = False), in the same run; the portable TF32 rung triad_sm80_nt_tf32 and the
exact-f32 class reference gemm_bi_f32_f32_n128_s2 beside them for reference (timed, not recorded).

CUDA-event timing, warm-up first, median of --iters (>= 20) launches on random data; every result is checked
against an f32 cuBLAS product (TF32 off) first, so a fast wrong kernel cannot post a number. Prints a table,
appends rows to benchmarks/results/gemm_f32.md and records (one per rung and shape) to
benchmarks/results/summary.json (goal >= 0.85x cuBLAS TF32, resp. fp32). Not a test.

    python benchmarks/bench_gemm_f32.py [--iters 30] [--shapes 4096x4096x4096,8192x8192x8192,16384x4096x2048] [--smoke]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import summary  # benchmarks/summary.py
from common import append_table, cuda_device, shapes, utc_stamp  # benchmarks/common.py
from timing import gemm_iters_or_smoke, median_ms  # benchmarks/timing.py

from mamba_forge.gpu import tma

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from gpu_support import bind, build_modules, load_cubin  # noqa: E402  (tests/gpu_support.py: cubins and the one launch path)

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


def launcher_wgmma_tf32(cat, cubin, name, A, B, C, M, N, K, sms, stream):
    sym = cat.symbols[name]
    maps = tma.gemm_tensor_maps_tf32("nt", A.data_ptr(), B.data_ptr(), M, N, K)
    kargs = [maps["tmA"], maps["tmB"], ("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr()),
             ("i32", M), ("i32", N), ("i32", K)]
    bm, bn = sym.params_env["BM"], sym.params_env["BN"]
    grid = (min(math.ceil(M / bm) * math.ceil(N / bn), sms),)
    return bind(load_cubin(cubin).function(name), grid, sym.block, kargs, smem=sym.dynamic_smem, stream=stream)


def launcher_triad(cat, cubin, name, A, B, C, M, N, K, stream):
    sym = cat.symbols[name]
    e = sym.params_env
    kargs = [("ptr", C.data_ptr()), ("ptr", A.data_ptr()), ("ptr", B.data_ptr()), ("ptr", 0), ("i32", M),
             ("i32", N), ("i32", K)]  # bias = null: none
    grid = (math.ceil(N / e["BN"]), math.ceil(M / e["BM"]))
    return bind(load_cubin(cubin).function(name), grid, sym.block, kargs, smem=sym.dynamic_smem, stream=stream)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--shapes", default=DEFAULT_SHAPES)
    ap.add_argument("--no-summary", action="store_true", help="do not write benchmarks/results/summary.json")
    ap.add_argument("--smoke", action="store_true", help=f"{SMOKE_SHAPES} only, 5 samples; nothing written")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    ap = parser()
    return gemm_iters_or_smoke(ap, ap.parse_args(argv), SMOKE_SHAPES)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    props = cuda_device()
    gpu, sms = props.name, props.multi_processor_count
    cat, where = build_modules(("TriadSm90a", "TriadSm80", "Fixed"), prefix="mf-bench-f32-", on_rejected=print)
    date = utc_stamp()
    stream = torch.cuda.current_stream().cuda_stream
    rows, records = [], []
    for M, N, K in shapes(args.shapes):
        g = torch.Generator(device="cuda").manual_seed(0)
        A = torch.randn((M, K), generator=g, device="cuda")
        B = torch.randn((N, K), generator=g, device="cuda")  # NT: B is [N, K] (torch Linear's weight)
        flops = 2.0 * M * N * K
        torch.backends.cuda.matmul.allow_tf32 = False
        exact = torch.matmul(A, B.t())  # the check's f32 reference
        torch.backends.cuda.matmul.allow_tf32 = True
        ms_ref = median_ms(lambda a=A, bt=B.t(): torch.matmul(a, bt), args.iters)
        torch.backends.cuda.matmul.allow_tf32 = False
        shape = f"M{M}xN{N}xK{K}"
        for name in TF32_RUNGS + [PORTABLE_TF32]:
            if name not in where:
                print(f"skip {name}: not in the build or not admitted")
                continue
            C = torch.empty((M, N), dtype=torch.float32, device="cuda")
            if name == PORTABLE_TF32:
                run = launcher_triad(cat, where[name], name, A, B, C, M, N, K, stream)
            else:
                run = launcher_wgmma_tf32(cat, where[name], name, A, B, C, M, N, K, sms, stream)
            run()
            torch.cuda.synchronize()
            rel = float((C - exact).norm() / exact.norm())  # TF32 inputs: ~1e-3 on randn data
            if not rel < 5e-3:
                print(f"{name:48s} {shape}: WRONG (relative error {rel:.2e} against f32 cuBLAS); not timed")
                continue
            ms = median_ms(run, args.iters)
            ratio = ms_ref / ms
            row = (date, gpu, name, "tf32", M, N, K, ms, flops / ms / 1e9, flops / ms_ref / 1e9, ratio)
            rows.append(row)
            print(f"{name:48s} {M:6d} {N:6d} {K:6d}  {ms:8.3f} ms  {row[8]:7.1f} TFLOP/s  "
                  f"cuBLAS TF32 {row[9]:7.1f}  ratio {ratio:.3f}  (rel err {rel:.1e})")
            if name != PORTABLE_TF32:
                records.append(summary.record(
                    family=cat.symbols[name].family, symbol=name, shape=shape, dtype="tf32", ours=round(ms, 5),
                    baseline=round(ms_ref, 5), baseline_name="cuBLAS TF32 (torch, allow_tf32)", unit="ms",
                    goal=f">={GOAL}x cuBLAS TF32", met=ratio >= GOAL, gpu=gpu))
        # exact f32, NN: B is [K, N]; the baseline is cuBLAS fp32 with TF32 off
        Bnn = B.t().contiguous()
        ms_fp32 = median_ms(lambda a=A, b=Bnn: torch.matmul(a, b), args.iters)
        ref_bits = None
        for name in [EXACT_REFERENCE] + EXACT_RUNGS:
            if name not in where:
                print(f"skip {name}: not in the build or not admitted")
                continue
            C = torch.empty((M, N), dtype=torch.float32, device="cuda")
            run = launcher_triad(cat, where[name], name, A, Bnn, C, M, N, K, stream)  # same ABI: C, A, B, bias, M, N, K
            run()
            torch.cuda.synchronize()
            rel = float((C - exact).norm() / exact.norm())
            if ref_bits is None and name == EXACT_REFERENCE:
                ref_bits = C.view(torch.int32).clone()
            same = "" if ref_bits is None else (" bits = class reference" if torch.equal(C.view(torch.int32), ref_bits)
                                                else " BITS DIFFER from the class reference")
            if not rel < 1e-4:  # f32 sums in another order: ~1e-6 at K = 8192
                print(f"{name:48s} {shape}: WRONG (relative error {rel:.2e} against f32 cuBLAS); not timed")
                continue
            ms = median_ms(run, args.iters)
            ratio = ms_fp32 / ms
            row = (date, gpu, name, "f32", M, N, K, ms, flops / ms / 1e9, flops / ms_fp32 / 1e9, ratio)
            rows.append(row)
            print(f"{name:48s} {M:6d} {N:6d} {K:6d}  {ms:8.3f} ms  {row[8]:7.1f} TFLOP/s  "
                  f"cuBLAS fp32 {row[9]:7.1f}  ratio {ratio:.3f}{same}")
            if name != EXACT_REFERENCE:
                records.append(summary.record(
                    family=cat.symbols[name].family, symbol=name, shape=shape, dtype="f32", ours=round(ms, 5),
                    baseline=round(ms_fp32, 5), baseline_name="cuBLAS fp32 (torch, TF32 off)", unit="ms",
                    goal=f">={GOAL}x cuBLAS fp32", met=ratio >= GOAL and "DIFFER" not in same, gpu=gpu))
        del A, B, Bnn, exact
        torch.cuda.empty_cache()
    if args.smoke:
        return 0
    append_table(RESULTS, "# f32-storage GEMMs (TF32 wgmma) vs torch.matmul (cuBLAS), same run\n\n" + HEADER,
                 (f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]:.3f} | {r[8]:.1f} | "
                  f"{r[9]:.1f} | {r[10]:.3f} |\n" for r in rows))
    print(f"wrote {len(rows)} rows to {RESULTS}")
    if records and not args.no_summary:
        summary.append(records)
        print(f"recorded {len(records)} results in {summary.SUMMARY}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
