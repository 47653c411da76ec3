"""The M=1 decode GEMM under Nsight Compute (the decode-speed issue's limiter): our bf16 skinny rung, the exact
f32 skinny and decode rungs and cuBLAS at M=1, N=K=8192, each launched a few times for ncu to sample. Not a
benchmark: run it under ncu, e.g.

    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats --launch-skip 2 --launch-count 1 -k 'regex:skinny|decode' \
        python benchmarks/profile_m1.py

(`--clock-control none`: the H200 runs at its own clocks, as in the benchmarks.) Prints each kernel's time
(events, 10 queued launches) so the profile can be read next to the benchmark's figures.
"""

from __future__ import annotations

import sys

from bench_decode_gemm import F32_DECODE, F32_SKINNY, WG_SKINNY, build_symbols, launcher  # benchmarks/
from timing import median_ms_queued


def main() -> None:
    import torch

    N = K = 8192
    names = [f"{WG_SKINNY[0]}_bf16", F32_SKINNY[0], *F32_DECODE]
    cat, found = build_symbols(names)
    g = torch.Generator(device="cuda").manual_seed(0)
    for name in names:
        dt = torch.float32 if name.startswith("gemm_bi_f32") else torch.bfloat16
        A = torch.randn(1, K, device="cuda", generator=g).to(dt)
        B = torch.randn(K, N, device="cuda", generator=g).to(dt)
        C = torch.empty(1, N, device="cuda", dtype=dt)
        run = launcher(torch, cat, found, name, A, B, C)
        for _ in range(4):
            run()
        torch.cuda.synchronize()
        ms = median_ms_queued(run, reps=10)
        torch.backends.cuda.matmul.allow_tf32 = False
        for _ in range(4):
            torch.matmul(A, B, out=C)
        ref = median_ms_queued(lambda A=A, B=B, C=C: torch.matmul(A, B, out=C), reps=10)
        gbs = K * N * A.element_size() / ms / 1e6
        print(f"{name}: {ms * 1e3:.1f} us ({gbs:.0f} GB/s); cuBLAS {ref * 1e3:.1f} us", flush=True)


if __name__ == "__main__":
    sys.exit(main())
