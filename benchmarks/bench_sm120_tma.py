"""CC 12.x TMA tiles (gemm_bi_nn_sm120_tma_*) against the cp.async tiles of the same math, through their sm_90a
check builds (run on the H200; the CC 12.x numbers need a CC 12.x GPU). Per symbol: median ms, TFLOP/s, and the
ratio to its cp.async twin (bf16/f16 -> gemm_bi_nn_fixed_sm89_tc128_s3_v1, TF32 -> the Ada RNA tile, exact f32 ->
the Sm120 copyplan tile), with a bitwise check against the twin so a fast wrong kernel cannot post a number. The
modules are built here (benchmarks/built.py) and every tile launches through the runtime (`kernels.gemm(...,
symbol=NAME)`: tensor maps, grid and arguments from its contract).
Appends rows to benchmarks/results/sm120_tma.md and records (ms against the twin; summary_records below) to
benchmarks/results/summary.json. Not a test.

    python benchmarks/bench_sm120_tma.py [--iters 30] [--shapes 4096x4096x4096,1024x4096x4096] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from built import built_kernels  # benchmarks/built.py
from common import cuda_device, gemm_parser, matching, shapes, table_lines, utc_stamp, write_results
from summary import record  # benchmarks/summary.py
from timing import median_ms  # benchmarks/timing.py

RESULTS = Path(__file__).parent / "results" / "sm120_tma.md"
HEADER = ("| date | GPU | symbol | M | N | K | ms | TFLOP/s | twin | twin ms | ratio to twin |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
SMOKE_SHAPES = "1024x1024x1024"
MODULES = ("Sm120", "TriadSm89Half", "TriadSm89Tf32Joint")
TWINS = {"half": "gemm_bi_nn_fixed_sm89_tc128_s3_v1_{dtype}", "tf32": "gemm_bi_nn_fixed_sm89_rna_tf32_v1_m128n96_bk32_s3",
         "fma": "gemm_bi_nn_fixed_sm120_f32_n64_copyplan_v1"}
DTYPES = {"half": "bf16", "tf32": "tf32", "fma": "f32"}  # the math of each kind as run here (no _f16 symbol is run)


def kind_of(name: str) -> str:
    return "tf32" if "_tf32_" in name else "fma" if "_fma_" in name else "half"


def parser() -> argparse.ArgumentParser:
    return gemm_parser(__doc__, "4096x4096x4096,1024x4096x4096", SMOKE_SHAPES, symbols="TMA symbols")


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    gpu = cuda_device().name
    k = built_kernels(MODULES, prefix="mf-bench-sm120-")  # the check builds: every rung launched as k.gemm's
    names = matching(sorted(n for n in k.admitted() if n.startswith("gemm_bi_nn_sm120_tma_") and "_f16" not in n),
                     args.symbols)
    date = utc_stamp()
    rows = []

    def runner(name, A, B, C, bias):
        """The rung through the runtime's GEMM call (its tensor maps, grid and arguments from its contract); the
        postbias rungs add the zero bias (their chain then gives the nobias bits)."""
        mode = "tf32" if kind_of(name) == "tf32" else None
        b = bias if "postbias" in name else None
        return lambda: k.gemm(A, B, out=C, bias=b, math=mode, symbol=name)

    for M, N, K in shapes(args.shapes):
        flops = 2.0 * M * N * K
        g = torch.Generator(device="cuda").manual_seed(0)
        A32, B32 = torch.randn((M, K), generator=g, device="cuda"), torch.randn((K, N), generator=g, device="cuda")
        bias = torch.zeros(N, device="cuda")  # + 0.0: postbias symbols give the nobias chain's bits
        twin_ms = {}
        for name in names:
            kind = kind_of(name)
            A, B = (A32, B32) if kind != "half" else (A32.bfloat16(), B32.bfloat16())
            out_dt = torch.bfloat16 if kind == "half" and "f32out" not in name else torch.float32
            twin = TWINS[kind].format(dtype="bf16")
            if twin not in twin_ms:
                Ct = torch.empty((M, N), dtype=torch.bfloat16 if kind == "half" else torch.float32, device="cuda")
                run_t = runner(twin, A, B, Ct, bias)
                twin_ms[twin] = (median_ms(run_t, args.iters), Ct)
            ms_t, Ct = twin_ms[twin]
            C = torch.empty((M, N), dtype=out_dt, device="cuda")
            ms = median_ms(runner(name, A, B, C, bias), args.iters)
            same = torch.equal((C.to(Ct.dtype) if C.dtype != Ct.dtype else C).view(torch.int16 if Ct.dtype == torch.bfloat16
                               else torch.int32), Ct.view(torch.int16 if Ct.dtype == torch.bfloat16 else torch.int32))
            flag = "" if same else "  NOT BITWISE EQUAL TO THE TWIN"
            rows.append((date, gpu, name, M, N, K, ms, flops / ms / 1e9, twin, ms_t, ms_t / ms, k.symbol(name).family,
                         same))  # the table writes the first 11; the summary records use the rest
            print(f"{name:58s} {M:5d} {N:5d} {K:5d} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s  twin {ms_t:8.3f} ms"
                  f"  ratio {ms_t / ms:.3f}{flag}")
    if args.smoke:
        return 0
    write_results(RESULTS, "# CC 12.x TMA tiles vs their cp.async twins (sm_90a check builds), same run\n\n" + HEADER,
                  table_lines(rows, ("",) * 6 + (".3f", ".1f", "", ".3f", ".3f")), summary_records(rows, gpu))
    return 0


def summary_records(rows: list[tuple], gpu: str) -> list[dict]:
    """summary.json records for main()'s rows: ms against the cp.async twin. No goal is stated for these tiles, and
    on the H200 they run as sm_90a check builds (the CC 12.x figures need a CC 12.x GPU): goal "" and met = bitwise
    equal to the twin and at least as fast (ours <= twin time), the parity encoding bench_scan.py gives its
    goal-less rows; a tile that differs from its twin is never met."""
    return [record(family=family, symbol=name, shape=f"M{M}xN{N}xK{K}", dtype=DTYPES[kind_of(name)],
                   ours=round(ms, 5), baseline=round(ms_t, 5),
                   baseline_name=f"{twin} (cp.async twin, same math; sm_90a check build)", unit="ms", goal="",
                   met=same and ratio >= 1.0, gpu=gpu)
            for _date, _gpu, name, M, N, K, ms, _tflops, twin, ms_t, ratio, family, same in rows]


if __name__ == "__main__":
    sys.exit(main())
