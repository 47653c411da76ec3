"""Decode (skinny-M) GEMM benchmark: the skinny rungs (and the exact-f32 decode rungs), the current large rungs,
matvec_bi_* at M = 1 and cuBLAS (torch `a @ b`, TF32 off for f32) in the same run, plus device-to-device copy
bandwidth (a 1 GiB torch copy).

bf16 (f16 with --f16 or briefly by default at two shapes) and exact f32; M in {1, 2, 4, ..., 256}; (N, K) in
{(4096, 4096), (8192, 8192), (8192, 2048), (2048, 4096)}. CUDA-event timing of 10 back-to-back launches per
sample (timing.median_ms_queued: the host's launch overhead stays out of a 20 us kernel's time), warm-up first,
median of --iters.
Each of our symbols is built here (benchmarks/built.py) and launches through the runtime (`kernels.gemm(...,
symbol=NAME)`: tensor maps, grid and arguments from its contract), checked once per shape against torch in
float64 (a wrong result aborts the run). Prints a
table, appends it to benchmarks/results/decode_gemm.md and records to benchmarks/results/summary.json
(benchmarks/summary.py). Not a test.

    python benchmarks/bench_decode_gemm.py [--quick] [--iters 30] [--smoke]

--smoke: bf16 and f32 at M = 1, N 2048, K 4096, 5 samples per figure; seconds, nothing recorded.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from built import built_kernels  # benchmarks/built.py
from common import append_table, cuda_device, smoke, utc_stamp  # benchmarks/common.py
from summary import append, record  # benchmarks/summary.py
from timing import copy_seconds, median_ms_queued  # benchmarks/timing.py

RESULTS = Path(__file__).parent / "results" / "decode_gemm.md"
HEADER = ("| date | GPU | dtype | symbol | M | N | K | ms | GB/s | cuBLAS ms | vs cuBLAS | % copy BW |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
MS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
NKS = ((4096, 4096), (8192, 8192), (8192, 2048), (2048, 4096))
SMOKE_MS, SMOKE_NKS = (1,), ((2048, 4096),)
WG_SKINNY = ("gemm_bi_nn_sm90a_wgmma_skinny_m64n64_s12", "gemm_bi_nn_sm90a_wgmma_skinny_m64n32_s18",
             "gemm_bi_nn_sm90a_wgmma_skinny_m64n128_s8", "gemm_bi_nn_sm90a_wgmma_skinny_m128n64_s8")
WG_LARGE = "gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4"
F32_SKINNY = ("gemm_bi_f32_f32_skinny_n64", "gemm_bi_f32_f32_skinny_n32")
F32_DECODE = ("gemm_bi_f32_f32_decode_n64", "gemm_bi_f32_f32_decode_n32")  # mf/decode_f32.cuh, routed at M <= 8
F32_LARGE = "gemm_bi_f32_f32_s2"
F32_ROUTED = ("gemm_bi_f32_f32_async_m128n128_bk16_s3", "gemm_bi_f32_f32_n128_s2")  # the f32 route's large-M rungs
ROUTE_FAMILY = "gemm_route"  # summary rows for the rung the route table serves at each (M, N, K)


def route_records(kernels, times: dict, dt: str, M: int, N: int, K: int, ms_ref: float, gpu: str) -> list[dict]:
    """The issue's figure for this (M, N, K): the rung the route table serves here (kernels.gemm_route, every built
    rung serving, as on a device that admitted them all), timed above; the record's baseline name says which."""
    rung = kernels.gemm_route(M, N, K, dt).symbol
    if rung not in times:
        print(f"     route picks {rung}, not timed here")
        return []
    ms = times[rung]
    headline = M == 1 and (N, K) == (8192, 8192)
    goal = ">=1.0x cuBLAS" if headline else ">=0.9x cuBLAS"
    return [record(family=ROUTE_FAMILY, symbol=f"nn {dt} route", shape=f"M{M}xN{N}xK{K}", dtype=dt,
                   ours=round(ms, 5), baseline=round(ms_ref, 5), baseline_name=f"cuBLAS (torch); served by {rung}",
                   unit="ms", goal=goal, met=ms_ref / ms >= (1.0 if headline else 0.9), gpu=gpu)]


def check(torch, name, C, A, B, tol):
    ref = A.double() @ B.double()
    rel = float((C.double() - ref).norm() / ref.norm().clamp_min(1e-30))
    if not math.isfinite(rel) or rel > tol:
        raise SystemExit(f"WRONG: {name} M={A.shape[0]} N={B.shape[1]} K={A.shape[1]}: relative error {rel:.3e}")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="M in {1, 8, 64, 256}, fewer iterations, no f16")
    ap.add_argument("--f16", action="store_true", help="f16 at every shape (default: M = 1 and 64 only)")
    ap.add_argument("--no-record", action="store_true", help="print only: no results/*.md or summary.json rows")
    ap.add_argument("--smoke", action="store_true",
                    help="bf16 and f32 at M 1, N 2048, K 4096, 5 samples; seconds, nothing recorded")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    return smoke(parser().parse_args(argv), no_record=True)


BANDWIDTH_GOAL = 0.85  # of the device copy's bandwidth, every M = 1 bandwidth row (not the headline alone)


def bandwidth_record(fam: str, name: str, shape: str, dt: str, tbs: float, copy_tbs: float, gpu: str) -> dict:
    """The M = 1 bandwidth row: TB/s against the device copy, met at BANDWIDTH_GOAL of it, the goal saying so."""
    return record(family=fam, symbol=name, shape=shape + "-bandwidth", dtype=dt, ours=round(tbs, 3),
                  baseline=round(copy_tbs, 3), baseline_name="device copy", unit="TB/s",
                  goal=f">={BANDWIDTH_GOAL:.0%} copy", speedup=round(tbs / copy_tbs, 3),
                  met=tbs / copy_tbs >= BANDWIDTH_GOAL, gpu=gpu)


def main(argv=None) -> int:
    args = parse_args(argv)
    iters = 5 if args.smoke else 15 if args.quick else args.iters
    ms_list = SMOKE_MS if args.smoke else (1, 8, 64, 256) if args.quick else MS
    nks = SMOKE_NKS if args.smoke else NKS
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    props = cuda_device()
    gpu = props.name
    dtypes = ["bf16", "f32"] + ([] if args.quick or args.smoke else ["f16"])
    wanted = [f"{n}_{d}" for n in (*WG_SKINNY, WG_LARGE) for d in ("bf16", "f16")]
    wanted += [*F32_DECODE, *F32_SKINNY, F32_LARGE, *F32_ROUTED, "matvec_bi_bf16_bf16", "matvec_bi_f16_f16",
               "matvec_bi_f32_f32"]
    k = built_kernels(("TriadSm90a", "Fixed"), kernels=wanted, prefix="mf-bench-decode-")
    missing = [n for n in wanted if n not in k.admitted()]
    if missing:
        raise SystemExit(f"not built or not admitted: {missing}")

    copy_s = copy_seconds(1 << 30, 20)
    copy_tbs = 2 * (1 << 30) / copy_s / 1e12
    print(f"{gpu}: device copy {copy_tbs:.2f} TB/s (1 GiB, read + write)")
    date = utc_stamp()
    rows, recs = [], []
    for dt in dtypes:
        tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt]
        esz = 4 if dt == "f32" else 2
        if dt == "f32":
            ours = [*F32_DECODE, *F32_SKINNY, F32_LARGE, *F32_ROUTED]
        else:
            ours = [f"{n}_{dt}" for n in (*WG_SKINNY, WG_LARGE)]
        mv = f"matvec_bi_{dt}_{dt}"
        tol = 1e-5 if dt == "f32" else 1e-2
        for N, K in nks:
            g = torch.Generator(device="cuda").manual_seed(0)
            B = (torch.rand((K, N), generator=g, device="cuda") * 2 - 1).to(tdt)
            for M in ms_list:
                if dt == "f16" and not args.f16 and M not in (1, 64):
                    continue
                A = (torch.rand((M, K), generator=g, device="cuda") * 2 - 1).to(tdt)
                ms_ref = median_ms_queued(lambda A=A, B=B: A @ B, iters)
                nbytes = (M * K + K * N + M * N) * esz
                names = ours + ([mv] if M == 1 else [])
                best, times = None, {}
                for name in names:
                    C = torch.empty((M, N), dtype=tdt, device="cuda")

                    def run(A=A, B=B, C=C, name=name):
                        k.gemm(A, B, out=C, symbol=name)

                    ms = times[name] = median_ms_queued(run, iters)
                    check(torch, name, C, A, B, tol)
                    gbs = nbytes / ms / 1e6
                    row = (date, gpu, dt, name, M, N, K, ms, gbs, ms_ref, ms_ref / ms, gbs / 1e3 / copy_tbs)
                    rows.append(row)
                    print(f"{dt:4s} {name:48s} M={M:4d} N={N:5d} K={K:5d}  {ms * 1e3:8.1f} us  {gbs:7.0f} GB/s  "
                          f"cuBLAS {ms_ref * 1e3:8.1f} us  x{ms_ref / ms:5.2f}  {100 * row[11]:5.1f}% copy")
                    headline = M == 1 and (N, K) == (8192, 8192)
                    goal = ">=1.0x cuBLAS and >=85% copy" if headline else ">=0.9x cuBLAS"
                    met = (ms_ref / ms >= 1.0 and row[11] >= 0.85) if headline else ms_ref / ms >= 0.9
                    shape = f"M{M}xN{N}xK{K}"
                    fam = k.symbol(name).family
                    recs.append(record(family=fam, symbol=name, shape=shape, dtype=dt, ours=round(ms, 5),
                                       baseline=round(ms_ref, 5), baseline_name="cuBLAS (torch)", unit="ms",
                                       goal=goal, met=met, gpu=gpu))
                    if M == 1:
                        recs.append(bandwidth_record(fam, name, shape, dt, gbs / 1e3, copy_tbs, gpu))
                    if ("_skinny" in name or "_decode" in name) and (best is None or ms < best[1]):
                        best = (name, ms)
                    del C
                if best is not None:
                    print(f"     best skinny/decode {best[0]}: x{ms_ref / best[1]:.2f} cuBLAS")
                recs.extend(route_records(k, times, dt, M, N, K, ms_ref, gpu))
            del B
            torch.cuda.empty_cache()
    if args.no_record:
        return 0
    append_table(RESULTS, "# Decode (skinny-M) GEMMs vs torch (cuBLAS), same run\n\n",
                 [f"\n{date} {gpu}: device copy {copy_tbs:.2f} TB/s\n\n" + HEADER]
                 + [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]} | {r[6]} | {r[7]:.4f} | {r[8]:.0f} | "
                    f"{r[9]:.4f} | {r[10]:.3f} | {100 * r[11]:.1f} |\n" for r in rows])
    append(recs)
    print(f"wrote {len(rows)} rows to {RESULTS} and {len(recs)} records to the summary")
    return 0


if __name__ == "__main__":
    sys.exit(main())
