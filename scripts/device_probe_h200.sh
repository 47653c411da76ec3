#!/usr/bin/env bash
# A short H200 session for the loader, sanitizer and flake questions (no kernel change needed): cold start of the
# committed bundle with the current loader, a sampled full-level qualification with the sanitizer tools run at
# once, the M=1 GEMM under ncu, and the NVRTC reproducibility loop (Fixed, ASLR on and off).
# Carried: .whl, .bundle (h200.tar.gz = the committed bundle, sample.txt = the sampled symbols).
set -uo pipefail
WHL=${WHL:-.whl}
source "$(dirname "$0")/device_common.sh"
archive_results
install_wheels "$WHL" || exit 1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv,noheader; nproc
TAILN=14 run cold_start 90 python3 benchmarks/bench_cold_start.py --bundle .bundle/h200.tar.gz --key manifests/keys
K=$(sed 's/^/--kernels /' .bundle/sample.txt | tr '\n' ' ')
run build_sample 150 mamba-forge build --arch sm_90a --out build -q -j 16 $K
TAILN=6 run qualify_sanitize_sample 200 mamba-forge qualify --device 0 --build build --level full --sanitize $K \
  --out /tmp/res/sample.toml
grep -E "^(sanitizer|qualification_seconds|level) " /tmp/res/sample.toml
TAILN=20 run ncu_m1 150 ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
  --section Occupancy --section WarpStateStats --section LaunchStats --launch-skip 4 --launch-count 1 \
  -k regex:skinny python3 benchmarks/profile_m1.py
TAILN=4 run flake_aslr 200 python3 scripts/repro_loop.py --module Fixed --runs 14 -j 14 --keep /tmp/res/ptx_aslr
TAILN=4 run flake_noaslr 200 python3 scripts/repro_loop.py --module Fixed --runs 14 -j 14 --no-aslr --keep /tmp/res/ptx_noaslr
echo done
