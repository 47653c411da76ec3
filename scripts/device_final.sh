#!/usr/bin/env bash
# The release session on the GPU machine, in one device call (about 8 minutes on one H200):
# build for the device, full qualification signed with the release key, bundle, verify, the loader's GPU
# tests, the remaining GPU tests and benchmarks, the cold-start benchmark. Most important first: a call cut
# short at its time limit still brings back the manifest.
# Needs (carried, never committed): .whl (wheels the machine lacks), .peers (the peer sdist),
# .keys/release.key. Results land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
WHL=${WHL:-../.whl}
export PYTHONUNBUFFERED=1 MAMBA_FORGE_CACHE=/tmp/mf-cache NCCL_NVLS_ENABLE=0
mkdir -p -m 700 "$MAMBA_FORGE_CACHE"
mkdir -p "$OUT"

run() {  # run NAME LIMIT_S CMD...: log to $OUT/NAME.txt, print the tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - t0))s"
  grep -v -e "DeprecationWarning" -e "fn = lambda" "$OUT/$name.txt" | tail -n "${TAILN:-8}"
  return $rc
}

python3 -m pip install -q --no-index --find-links "$WHL" --no-build-isolation -e . >/tmp/install.log 2>&1 \
  || { tail /tmp/install.log; exit 1; }
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv,noheader
(bash benchmarks/peers/build_mamba_ssm.sh >/tmp/peer_build.log 2>&1 &)
run build 300 mamba-forge build --arch sm_90a --out build -q -j 16
TAILN=4 run test_scan 150 python3 -m pytest -q -p no:cacheprovider --maxfail=10 tests/gpu/test_scan.py
TAILN=30 run qualify 330 mamba-forge qualify --device all --build build --level full \
  --sign-key .keys/release.key --out manifests/h200.toml
cp manifests/h200.toml "$OUT/"
run bundle 60 mamba-forge bundle manifests/h200.toml --build build -o "$OUT/h200.tar.gz"
run verify 60 mamba-forge verify "$OUT/h200.tar.gz"
MF_RUNTIME_BUNDLE="$OUT/h200.tar.gz" MF_RUNTIME_KEY=manifests/keys \
  TAILN=4 run test_runtime_gpu 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runtime_gpu.py
TAILN=4 run test_qualify_gpu 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_qualify_gpu.py
while pgrep -f build_mamba_ssm >/dev/null; do sleep 2; done
TAILN=22 run bench_scan 120 python3 benchmarks/bench_scan.py
TAILN=45 run bench_gemm 150 python3 benchmarks/bench_gemm.py --iters 20
run bench_cold_start 200 python3 benchmarks/bench_cold_start.py --bundle "$OUT/h200.tar.gz" --key manifests/keys \
  --compile-runs 1
cp benchmarks/results/*.md "$OUT/" 2>/dev/null
echo done
