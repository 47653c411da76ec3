#!/usr/bin/env bash
# The release session on the GPU machine, in one device call (about 6 minutes on a host with two H200s):
# build for the device, full qualification on every GPU (--device all) signed with the release key, bundle,
# verify, the loader's and the qualifier's GPU tests, the cold-start and memory-bound benchmarks. Most important
# first: a call cut short at its time limit still brings back the manifest. The other benchmarks are in
# scripts/device_benchmarks.sh (a second call: one call may run 10 minutes).
# Needs (carried, never committed): .whl (wheels the machine lacks), .keys/release.key. Results land in $OUT;
# pack them into one archive afterwards (the device tool brings back at most 8 files).
set -uo pipefail
source "$(dirname "$0")/device_common.sh"

install_wheels "$WHL" || exit 1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv,noheader
run build 300 mamba-forge build --arch sm_90a --out build -q -j 16
TAILN=30 run qualify 330 mamba-forge qualify --device all --build build --level full \
  --sign-key .keys/release.key --out manifests/h200.toml
cp manifests/h200.toml manifests/h200.runtime.json "$OUT/"
run bundle 60 mamba-forge bundle manifests/h200.toml --build build -o "$OUT/h200.tar.gz"
run verify 60 mamba-forge verify "$OUT/h200.tar.gz"
MF_RUNTIME_BUNDLE="$OUT/h200.tar.gz" MF_RUNTIME_KEY=manifests/keys \
  TAILN=4 run test_runtime_gpu 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runtime_gpu.py
TAILN=4 run test_qualify_gpu 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_qualify_gpu.py
TAILN=16 run bench_cold_start 200 python3 benchmarks/bench_cold_start.py --bundle "$OUT/h200.tar.gz" --key manifests/keys
TAILN=20 run bench_memory_bound 120 python3 benchmarks/bench_memory_bound.py
cp benchmarks/results/*.md "$OUT/" 2>/dev/null
echo done
