#!/usr/bin/env bash
# The remaining benchmarks on the GPU machine, in one device call (about 8 minutes on one H200): the scan
# against mamba-ssm built from its sdist in the background, the GEMM ladders (portable and wgmma) against
# cuBLAS, the conv1d and optimiser kernels. Needs (carried): .whl, .peers (the mamba-ssm sdist). Results in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_common.sh"

install_wheels "$WHL" || exit 1
(bash benchmarks/peers/build_mamba_ssm.sh >/tmp/peer_build.log 2>&1 &)
run build 200 mamba-forge build --arch sm_90a --out build -q -j 16  # warms the cache the benchmarks build through
TAILN=45 run bench_gemm 170 python3 benchmarks/bench_gemm.py --iters 20
TAILN=20 run bench_gemm_sm90a 100 python3 benchmarks/bench_gemm_sm90a.py
TAILN=20 run bench_conv_optim 100 python3 benchmarks/bench_conv_optim.py
while pgrep -f build_mamba_ssm >/dev/null; do sleep 2; done
TAILN=22 run bench_scan 120 python3 benchmarks/bench_scan.py
cp benchmarks/results/*.md "$OUT/" 2>/dev/null
echo done
