#!/usr/bin/env bash
# The release session on the GPU machine, in phases that each fit one device call:
#   bash scripts/device_final.sh tests     # install, build for sm_90a, every GPU test (and the peer build)
#   bash scripts/device_final.sh bench     # every benchmark, each against its baseline in the same run
#   bash scripts/device_final.sh qualify   # full qualification (all GPUs), bundle, verify, loader tests, cold start
# Needs: .whl (wheels the machine lacks), .peers (the peer sdist), .keys/release.key (never committed).
# Results land in $OUT; benchmark tables are appended under benchmarks/results/ and copied to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
WHL=${WHL:-.whl}
export PYTHONUNBUFFERED=1 MAMBA_FORGE_CACHE=/tmp/mf-cache NCCL_NVLS_ENABLE=0
mkdir -p -m 700 "$MAMBA_FORGE_CACHE"
mkdir -p "$OUT"

run() {  # run NAME LIMIT_S CMD...: log to $OUT/NAME.txt, print the tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - t0))s"
  grep -v -e "DeprecationWarning" -e "fn = lambda" "$OUT/$name.txt" | tail -n "${TAILN:-12}"
}

install() {
  python3 -m pip install -q --no-index --find-links "$WHL" --no-build-isolation -e . >/tmp/install.log 2>&1 \
    || { tail /tmp/install.log; exit 1; }
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv,noheader
  [ -f build/manifest.toml ] || run build 300 mamba-forge build --arch sm_90a --out build -q -j 16
}

case "${1:-}" in
  tests)
    install
    (bash benchmarks/peers/build_mamba_ssm.sh >/tmp/peer_build.log 2>&1 &)
    for t in fixed_elementwise conv_optim gemm_portable scan gemm_sm90a qualify_gpu; do
      TAILN=4 run "test_$t" 300 python3 -m pytest -q -p no:cacheprovider --maxfail=20 "tests/gpu/test_$t.py"
    done
    ;;
  bench)
    install
    while pgrep -f build_mamba_ssm >/dev/null; do sleep 3; done
    tail -1 /tmp/peer_build.log 2>/dev/null
    TAILN=30 run bench_memory_bound 150 python3 benchmarks/bench_memory_bound.py
    TAILN=20 run bench_conv_optim 150 python3 benchmarks/bench_conv_optim.py
    TAILN=70 run bench_gemm 200 python3 benchmarks/bench_gemm.py --iters 20
    TAILN=25 run bench_gemm_sm90a 150 python3 benchmarks/bench_gemm_sm90a.py --iters 20 --dtype both
    TAILN=22 run bench_scan 200 python3 benchmarks/bench_scan.py
    cp benchmarks/results/*.md "$OUT/"
    ;;
  qualify)
    install
    devices=all
    TAILN=40 run qualify 420 mamba-forge qualify --device "$devices" --build build --level full \
      --sign-key .keys/release.key --out manifests/h200.toml
    cp manifests/h200.toml "$OUT/"
    run bundle 60 mamba-forge bundle manifests/h200.toml --build build -o /tmp/h200.tar.gz
    run verify 60 mamba-forge verify /tmp/h200.tar.gz
    MF_RUNTIME_BUNDLE=/tmp/h200.tar.gz MF_RUNTIME_KEY=manifests/keys \
      TAILN=6 run test_runtime_gpu 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_runtime_gpu.py
    run bench_cold_start 150 python3 benchmarks/bench_cold_start.py --bundle /tmp/h200.tar.gz \
      --key manifests/keys --compile-runs 2
    cp benchmarks/results/cold_start.md "$OUT/" 2>/dev/null
    sha256sum /tmp/h200.tar.gz
    ;;
  *) echo "usage: $0 tests|bench|qualify"; exit 2 ;;
esac
