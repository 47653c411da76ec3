"""What keeps the split class's prefill rungs at ~0.7x cuBLAS: launch them (and the whole-K 128x256 rung and
cuBLAS) once each at out_proj d_model 2560, M 16384, for Nsight Compute to read. A dev probe, not a benchmark
(nothing timed or recorded). On the H200 (twenty-second session, docs/gpu-sessions.md):

    ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \
        -k regex:gemm_bi python3 scripts/probe_split_ncu.py --bundle /tmp/h200.tar.gz --key manifests/keys

gave splitk8_m128n128_s4 747 us with the tensor pipe busy 62.7% of elapsed cycles (L2 59%, DRAM 22%); the
twenty-third session added the smt rung (splitk8_smt_m128n256_s3) to the list.
"""

from __future__ import annotations

import argparse

SYMBOLS = ("gemm_bi_nn_sm90a_wgmma_splitk8_m128n128_s4_bf16", "gemm_bi_nn_sm90a_wgmma_splitk8_pair_m64n256_s2_bf16",
           "gemm_bi_nn_sm90a_wgmma_splitk8_smt_m128n256_s3_bf16", "gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4_bf16")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True, help="signed bundle or manifest qualified on this GPU")
    p.add_argument("--key", required=True, help="trusted public key (file or folder of *.pub)")
    p.add_argument("--mnk", default="16384,2560,5120", help="M,N,K (default: out_proj at d_model 2560, b8 L2048)")
    a = p.parse_args(argv)
    import torch

    from mamba_forge.runtime import load

    kernels = load(a.bundle, trusted_keys=[a.key])
    M, N, K = (int(x) for x in a.mnk.split(","))
    A = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    B = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    C = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for sym in SYMBOLS:
        kernels.gemm(A, B, C, symbol=sym)
    torch.matmul(A, B)
    torch.cuda.synchronize()
    print("launched:", ", ".join(SYMBOLS), "and torch.matmul")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
