#!/usr/bin/env bash
# One batched session on the GPU machine: install, GPU tests, benchmarks, qualification. Everything it makes
# lands in one archive under $OUT (the device tool brings back few files). Steps are chosen by name:
#   bash scripts/device_run.sh tests bench qualify peers
# Each step has its own time limit so one slow step cannot eat the others.
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES=/tmp/mf-results
mkdir -p "$RES" "$OUT"
export PYTHONUNBUFFERED=1 MAMBA_FORGE_CACHE=/tmp/mf-cache
mkdir -p -m 700 "$MAMBA_FORGE_CACHE"
python3 -m pip install -q --no-index --find-links .whl --no-build-isolation -e . >"$RES/install.log" 2>&1 || {
  cat "$RES/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv >"$RES/gpu.txt" 2>&1

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$RES/$name.log" 2>&1
  local rc=$?
  echo "step $name rc=$rc $((SECONDS - t0))s" | tee -a "$RES/steps.txt"
  tail -n 25 "$RES/$name.log"
}

peer_pid=""
for s in "$@"; do
  case "$s" in
    peers)  # build mamba-ssm on the CPUs while the GPU steps run
      if [ -f benchmarks/peers/build_mamba_ssm.sh ]; then
        (timeout 400 bash benchmarks/peers/build_mamba_ssm.sh >"$RES/peers.log" 2>&1; echo "peers rc=$?" >>"$RES/steps.txt") &
        peer_pid=$!
      fi ;;
    build) step build 300 mamba-forge build --arch sm_90a --out build -q ;;
    tests) step tests 420 python3 -m pytest -m gpu -q -x --timeout=120 -p no:cacheprovider \
             --junitxml="$RES/gpu-tests.xml" tests ;;
    tests-all) step tests 540 python3 -m pytest -m gpu -q --timeout=120 -p no:cacheprovider \
             --junitxml="$RES/gpu-tests.xml" tests ;;
    bench)
      for b in benchmarks/bench_*.py; do
        case "$b" in *bench_build.py|*bench_scan.py) continue ;; esac
        step "$(basename "$b" .py)" 240 python3 "$b"
      done ;;
    bench-scan)
      [ -n "$peer_pid" ] && wait "$peer_pid"
      step bench_scan 300 python3 benchmarks/bench_scan.py ;;
    qualify) step qualify 420 mamba-forge qualify --device 0 --build build --level quick --out "$RES/h200.toml" ;;
    qualify-full) step qualify 540 mamba-forge qualify --device 0 --build build --level full --out "$RES/h200.toml" ;;
    *) echo "unknown step $s" ;;
  esac
done
[ -n "$peer_pid" ] && wait "$peer_pid" 2>/dev/null
cp -r benchmarks/results "$RES/bench-results" 2>/dev/null
tar -czf "$OUT/results.tar.gz" -C /tmp mf-results
cat "$RES/steps.txt"
