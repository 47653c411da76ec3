"""Portable batch-invariant GEMM / matvec benchmark: each family against torch.matmul (cuBLAS) in the same run.

CUDA-event timing, warm-up first, median of --iters (>= 20) launches on random normal data (never zeros);
prints a table and appends rows (date, GPU, symbol, shape, TFLOP/s or GB/s, cuBLAS figure, ratio) to
benchmarks/results/gemm.md and records (ms against cuBLAS, one per symbol and shape; summary_records below) to
benchmarks/results/summary.json. Not a test.

    python benchmarks/bench_gemm.py [--iters 30] [--only tc128,f32_f32] [--skip-matvec] [--skip-gemm] [--smoke]

Rows: ``ROWS`` below lists (symbol, kind, baseline) entries; another family adds its rows by appending ``Row``
entries. The symbols are built here (benchmarks/built.py) and every one launches through the runtime
(`kernels.gemm(..., symbol=NAME)`: grid and arguments from its contract, the bias null).
Baselines: ``bf16`` / ``f16`` = torch.matmul in that dtype; ``f32`` = fp32 with TF32 off; ``tf32`` = fp32 with
TF32 on. Matvec rows also report the fraction of the device-to-device copy bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from built import built_kernels  # benchmarks/built.py
from common import cuda_device, matching, torch_dtype, utc_stamp, write_results  # benchmarks/common.py
from summary import record  # benchmarks/summary.py
from timing import copy_seconds, median_ms  # benchmarks/timing.py

RESULTS = Path(__file__).parent / "results" / "gemm.md"
HEADER = ("| date | GPU | symbol | M | N | K | ms | ours | cuBLAS | unit | ratio | copy fraction |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
GEMM_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 2048)]
MATVEC_SHAPES = [(1, 8192, 8192), (1, 4096, 4096), (2, 8192, 8192), (8, 8192, 8192), (16, 8192, 8192),
                 (32, 8192, 8192), (64, 8192, 8192)]
SMOKE_GEMM, SMOKE_MATVEC = (1024, 1024, 1024), (1, 4096, 4096)  # --smoke: one small shape per kind
MODULES = ("Fixed", "TriadScalar", "TriadSm80")
# the result's normwise relative error against float64 that a row's math may show (inputs as stored: only the
# accumulation and the output's rounding count); a wrong kernel is off by O(1)
TOL = {"f32": 1e-4, "tf32": 1e-2, "bf16": 1e-2, "f16": 1e-2}
BASELINE_NAMES = {"bf16": "cuBLAS (torch)", "f16": "cuBLAS (torch)", "f32": "cuBLAS fp32 (torch, TF32 off)",
                  "tf32": "cuBLAS TF32 (torch, allow_tf32)"}


@dataclass
class Row:
    symbol: str
    kind: str  # "gemm" (TFLOP/s, GEMM_SHAPES) or "matvec" (GB/s, MATVEC_SHAPES)
    baseline: str  # "bf16", "f16", "f32" (TF32 off), "tf32"
    a: str = ""  # storage dtype of A/B and of C (filled from the catalog when empty)
    c: str = ""
    shapes: list[tuple[int, int, int]] | None = None


ROWS: list[Row] = [
    Row("gemm_bi_f32_f32", "gemm", "f32"),
    Row("gemm_bi_f32_f32_s2", "gemm", "f32"),
    Row("gemm_bi_f32_f32_m128n64_s2", "gemm", "f32"),
    Row("gemm_bi_f32_f32_n128_s2", "gemm", "f32"),
    Row("triad_scalar_nn_f32", "gemm", "f32"),
    *[Row(f"gemm_bi_nn_tf32_v1_{t}", "gemm", "tf32") for t in
      ("m128n64_bk32_s2", "m128n64_bk32_s3", "m64n64_bk32_s2", "m64n64_bk32_s3", "m16n32_bk32_s4")],
    Row("gemm_bi_nn_fixed_rna_wide_tf32_v1_m128n128_bk32_s3", "gemm", "tf32"),
    Row("gemm_bi_nn_sm80_mma_tf32_v1_m128n128_bk32_s3", "gemm", "tf32"),
    *[Row(f"gemm_bi_nn_{t}_{d}", "gemm", d) for d in ("bf16", "f16")
      for t in ("tc128", "tcwn64", "tcw64", "tc64", "tc16")],
    *[Row(f"gemm_bi_nn_tc128_f32out_{d}", "gemm", d) for d in ("bf16", "f16")],
    *[Row(f"gemm_bi_{d}_{d}", "gemm", d) for d in ("bf16", "f16")],
    *[Row(f"triad_sm80_nn_{d}", "gemm", b) for d, b in (("tf32", "tf32"), ("bf16", "bf16"), ("f16", "f16"))],
    *[Row(f"matvec_bi_{d}_{d}", "matvec", d) for d in ("bf16", "f16")],
    Row("matvec_bi_f32_f32", "matvec", "f32"),
    *[Row(f"gemm_bi_nn_tc16_{d}", "matvec", d) for d in ("bf16",)],
]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--only", default="", help="comma-separated substrings: only matching symbols")
    ap.add_argument("--skip-gemm", action="store_true")
    ap.add_argument("--skip-matvec", action="store_true")
    ap.add_argument("--no-write", action="store_true", help="print only; do not append to the results file or summary.json")
    ap.add_argument("--smoke", action="store_true",
                    help=f"GEMMs at {SMOKE_GEMM}, matvecs at {SMOKE_MATVEC}, 5 samples; nothing recorded")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    ap = parser()
    a = ap.parse_args(argv)
    if a.smoke:
        a.iters, a.no_write = 5, True
    elif a.iters < 20:
        ap.error("--iters must be at least 20")
    return a


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    gpu = cuda_device().name
    picked = matching([row.symbol for row in ROWS], args.only)
    rows = [row for row in ROWS if row.symbol in picked
            and not (row.kind == "gemm" and args.skip_gemm) and not (row.kind == "matvec" and args.skip_matvec)]
    k = built_kernels(MODULES, kernels=sorted({row.symbol for row in rows}), prefix="mf-bench-gemm-")
    date = utc_stamp()
    copy_gbs = 2 * (1 << 30) / copy_seconds(1 << 30, args.iters) / 1e9  # 1 GiB device-to-device, read + write
    print(f"{gpu}: device-to-device copy {copy_gbs:.0f} GB/s (read + write)")
    results, wrong = [], set()
    for row in rows:
        if row.symbol not in k.admitted():
            print(f"{row.symbol}: not admitted here, skipped")
            continue
        sym = k.symbol(row.symbol)
        dtypes = {p.name: p.dtype for p in sym.params}  # the record's: the dtypes its contract holds tensors to
        a_dt, c_dt = row.a or dtypes["A"], row.c or dtypes["C"]
        shapes = row.shapes or (GEMM_SHAPES if row.kind == "gemm" else MATVEC_SHAPES)
        if args.smoke:
            shapes = [SMOKE_GEMM if row.kind == "gemm" else SMOKE_MATVEC]
        for m, n, kk in shapes:
            gen = torch.Generator(device="cuda").manual_seed(m * 7 + n * 3 + kk)
            A = torch.randn(m, kk, device="cuda", generator=gen).to(torch_dtype(a_dt))
            B = torch.randn(kk, n, device="cuda", generator=gen).to(torch_dtype(a_dt))
            C = torch.empty(m, n, device="cuda", dtype=torch_dtype(c_dt))

            def ours(A=A, B=B, C=C, math="tf32" if row.baseline == "tf32" else None, name=row.symbol):
                k.gemm(A, B, out=C, math=math, symbol=name)  # the rung's contract: grid, arguments, null bias

            base_dt = torch.float32 if row.baseline == "tf32" else torch_dtype(row.baseline)
            Ab, Bb = A.to(base_dt), B.to(base_dt)
            torch.backends.cuda.matmul.allow_tf32 = row.baseline == "tf32"
            ms = median_ms(ours, args.iters)
            base_ms = median_ms(lambda Ab=Ab, Bb=Bb: torch.matmul(Ab, Bb), args.iters)
            torch.backends.cuda.matmul.allow_tf32 = False
            if row.kind == "gemm":
                unit, ours_v, base_v = "TFLOP/s", 2 * m * n * kk / ms / 1e9, 2 * m * n * kk / base_ms / 1e9
                frac = ""
            else:
                nbytes = (m * kk + kk * n) * A.element_size() + m * n * C.element_size()
                unit, ours_v, base_v = "GB/s", nbytes / ms / 1e6, nbytes / base_ms / 1e6
                frac = f"{ours_v / copy_gbs:.2f}"
            rel = rel_error(C, A, B)  # C holds the timed launches' result: a fast wrong kernel posts no number
            if not result_ok(rel, row.baseline):
                wrong.add((row.symbol, m, n, kk))
                print(f"WRONG: {row.symbol} {m}x{n}x{kk}: relative error {rel:.3e} against float64 "
                      f"(tolerance {TOL[row.baseline]:.0e})")
            ratio = base_ms / ms
            results.append((row.symbol, m, n, kk, ms, ours_v, base_v, unit, ratio, frac, base_ms, sym.family,
                            row.kind, row.baseline))
            print(f"{row.symbol:52s} {m:6d}x{n:6d}x{kk:6d} {ms:9.4f} ms {ours_v:9.1f} {unit:8s} "
                  f"cuBLAS({row.baseline}) {base_v:9.1f}  ratio {ratio:5.2f} {frac}")
            del A, B, C, Ab, Bb
    if not args.no_write and results:
        write_results(RESULTS, "# Portable batch-invariant GEMM / matvec vs cuBLAS (benchmarks/bench_gemm.py)\n\n"
                      + HEADER, [f"| {date} | {gpu} | {sym_name} | {m} | {n} | {kk} | {ms:.4f} | {ov:.1f} | {bv:.1f} | "
                                 f"{unit} | {ratio:.2f} | {frac} |\n"
                                 for sym_name, m, n, kk, ms, ov, bv, unit, ratio, frac, *_ in results],
                      summary_records(results, gpu, copy_gbs, wrong))
    return 1 if wrong else 0


def rel_error(C, A, B) -> float:
    """Normwise relative error of C against A @ B computed in float64 (from A and B as stored)."""
    ref = A.double() @ B.double()
    return float((C.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def result_ok(rel: float, math: str) -> bool:
    """rel within TOL of the row's math (NaN and inf never are)."""
    return bool(rel <= TOL[math])


def summary_records(results: list[tuple], gpu: str, copy_gbs: float, wrong: set = frozenset()) -> list[dict]:
    """summary.json records for main()'s rows, ms against cuBLAS in the row's math (dtype = bf16, f16, f32 = TF32 off,
    tf32). Goals: matvec rows (skinny M) >= 0.9x cuBLAS, and at M=1 8192x8192 the headline >= 1.0x cuBLAS and
    >= 85% of the copy bandwidth, as bench_decode_gemm.py records the same symbols and shapes; exact f32 >= 0.85x
    cuBLAS fp32; the mma.sync TF32 ladder >= 0.8x cuBLAS TF32 (benchmarks/results/README.md: the 0.85x TF32 goal
    is the wgmma rungs', bench_gemm_f32.py); bf16/f16 tensor-core GEMMs >= 0.9x cuBLAS. A (symbol, m, n, k) in
    `wrong` (its result failed rel_error / result_ok) is recorded as not met, superseding an older record."""
    recs = []
    for sym_name, m, n, k, ms, ours_v, _base_v, _unit, ratio, _frac, base_ms, family, kind, math in results:
        if kind == "matvec" and m == 1 and (n, k) == (8192, 8192):
            goal, met = ">=1.0x cuBLAS and >=85% copy", ratio >= 1.0 and ours_v / copy_gbs >= 0.85  # ours_v: GB/s
        elif kind == "matvec":
            goal, met = ">=0.9x cuBLAS", ratio >= 0.9
        elif math == "f32":
            goal, met = ">=0.85x cuBLAS fp32", ratio >= 0.85
        elif math == "tf32":
            goal, met = ">=0.8x cuBLAS TF32", ratio >= 0.8
        else:
            goal, met = ">=0.9x cuBLAS", ratio >= 0.9
        recs.append(record(family=family, symbol=sym_name, shape=f"M{m}xN{n}xK{k}", dtype=math, ours=round(ms, 5),
                           baseline=round(base_ms, 5), baseline_name=BASELINE_NAMES[math], unit="ms", goal=goal,
                           met=met and (sym_name, m, n, k) not in wrong, gpu=gpu))
    return recs


if __name__ == "__main__":
    sys.exit(main())
