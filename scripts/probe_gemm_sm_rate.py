"""What limits the decode GEMM rungs at M = 1: each SM's own rate of streaming B, or the GPU's aggregate? A dev
probe, not a benchmark (nothing recorded). It times existing skinny rungs (kernels.gemm with symbol=, CUDA graphs)
on B matrices sized so the rung runs a chosen number of CTAs, each streaming the same bytes of B:

* at 80, 132 and (for the two-CTA-an-SM rung) 264 CTAs: a per-SM limit keeps the time flat as CTAs are added
  up to one an SM; an aggregate (DRAM) limit makes it grow with the total bytes;
* per tile width (BN 32 / 64 / 128: B rows of 64 / 128 / 256 bytes a k-row): an SM's rate by box width, the number
  a tile of 80 or 96 columns (a 64-column box plus a 16- or 32-column one) would run at.

    python scripts/probe_gemm_sm_rate.py --bundle /tmp/h200.tar.gz --key manifests/keys

Measured on the H200, 2026-12-04 (K 2560, GB/s a CTA): m64n128_s8 33.3 at 80 CTAs, 28.8 at 132 (3.80 TB/s, cuBLAS
22.3 against our 22.8 us); m64n64_s12 37.4 / 35.0 (4.63 TB/s at 132, cuBLAS 10.2 against 9.4 us); m64n32_s18 (64-byte
box rows) 19.2 / 19.0; m64n64_s6 37.5 at 80, 14.2 at 264 (two an SM share one SM's rate). So an SM streams ~35 GB/s
of B whatever the CTA count, the TMA by box rows; the decode GEMMs' limit is how evenly N splits over the SMs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

SKINNY = "gemm_bi_nn_sm90a_wgmma_skinny_{}_bf16"
# (rung, BN, CTAs an SM it is sized for)
RUNGS = [("m64n128_s8", 128, 1), ("m64n64_s12", 64, 1), ("m64n32_s18", 32, 1), ("m64n64_s6", 64, 2),
         ("lsu1_m64n128_s8", 128, 1), ("lsu2_m64n128_s8", 128, 1), ("tail_m64n80_s8", 80, 1)]  # B on the LSU too
INNER = 20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--k", default="2560,5120")
    p.add_argument("--rungs", default="", help="comma-separated names from RUNGS (default: all)")
    a = p.parse_args(argv)
    import torch
    from timing import capture_graph, median_ms

    from mamba_forge.runtime import load

    kernels = load(a.bundle, trusted_keys=[a.key])
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def gpu_us(fn) -> float:
        g = capture_graph(fn, INNER)
        return median_ms(g.replay, a.reps, warmup=2) / INNER * 1e3

    print(f"{'rung':12s} {'K':>5s} {'CTAs':>5s} {'N':>6s} {'us':>7s} {'KB/CTA':>7s} {'GB/s/CTA':>9s} {'TB/s':>6s} "
          f"{'cuBLAS us':>9s}")
    for K in (int(k) for k in a.k.split(",")):
        for rung, bn, cps in [r for r in RUNGS if not a.rungs or r[0] in a.rungs.split(",")]:
            for ctas in sorted({80, sms, sms * cps}):
                N = ctas * bn
                g = torch.Generator(device="cuda").manual_seed(N + K)
                A = (torch.rand((1, K), generator=g, device="cuda") * 2 - 1).to(torch.bfloat16)
                B = (torch.rand((K, N), generator=g, device="cuda") * 2 - 1).to(torch.bfloat16)
                C = torch.empty((1, N), dtype=torch.bfloat16, device="cuda")
                us = gpu_us(lambda A=A, B=B, C=C, s=SKINNY.format(rung): kernels.gemm(A, B, C, symbol=s))
                cu = gpu_us(lambda A=A, B=B, C=C: torch.matmul(A, B, out=C))
                kb = bn * K * 2 / 1024
                print(f"{rung:12s} {K:5d} {ctas:5d} {N:6d} {us:7.2f} {kb:7.0f} {kb * 1.024 / us:9.1f} "
                      f"{N * K * 2 / us / 1e6:6.2f} {cu:9.2f}", flush=True)
                del A, B, C
    return 0


if __name__ == "__main__":
    sys.exit(main())
