# Shared by the device session scripts (sourced): where results go, the environment, installing the carried
# wheels, running a step with a time limit.
OUT=${OUT:-/tmp/out}
WHL=${WHL:-../.whl}
export PYTHONUNBUFFERED=1 MAMBA_FORGE_CACHE=/tmp/mf-cache NCCL_NVLS_ENABLE=0
mkdir -p -m 700 "$MAMBA_FORGE_CACHE"
mkdir -p "$OUT"

archive_results() {  # a session's results: steps log to /tmp/res (OUT from here on), and on exit that folder,
  # with the benchmark tables, is packed into res.tar.gz in the caller's OUT (a call brings back at most 8 files)
  RES=/tmp/res OUT_FINAL=$OUT
  OUT=$RES
  mkdir -p "$OUT"
  trap 'cp benchmarks/results/*.md benchmarks/results/summary.json "$RES/" 2>/dev/null
        tar -czf "$OUT_FINAL/res.tar.gz" -C /tmp res' EXIT
}

left() { echo $((DEADLINE - SECONDS)); }  # seconds of the call left (the caller sets DEADLINE)

install_wheels() {  # install_wheels WHEEL_DIR: this package, editable, with wheels the machine lacks
  python3 -m pip install -q --no-index --find-links "$1" --no-build-isolation -e . >/tmp/install.log 2>&1 \
    || { tail /tmp/install.log; return 1; }
}

run() {  # run NAME LIMIT_S CMD...: log to $OUT/NAME.txt, print the tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - t0))s"
  grep -v -e "DeprecationWarning" -e "fn = lambda" "$OUT/$name.txt" | tail -n "${TAILN:-8}"
  return $rc
}

bench() {  # bench NAME [LIMIT_S]: one benchmark (they append to benchmarks/results/*.md and summary.json);
  # the bundle ones need BUNDLE (a signed bundle) and manifests/keys
  local b=$1 lim=${2:-}
  case $b in
    decode_step) TAILN=16 run bench_decode_step "${lim:-90}" python3 benchmarks/bench_decode_step.py ;;
    decode_gemm) TAILN=12 run bench_decode_gemm "${lim:-120}" python3 benchmarks/bench_decode_gemm.py ;;
    cold_start) TAILN=16 run bench_cold_start "${lim:-160}" python3 benchmarks/bench_cold_start.py ${COLD_FLAGS:-} --bundle "$BUNDLE" \
      --key manifests/keys ;;
    launch) TAILN=14 run bench_launch "${lim:-60}" python3 benchmarks/bench_launch_overhead.py --bundle "$BUNDLE" \
      --key manifests/keys ;;
    conv1d) TAILN=12 run bench_conv1d "${lim:-60}" python3 benchmarks/bench_conv1d.py ;;
    gemm_f32) TAILN=12 run bench_gemm_f32 "${lim:-60}" python3 benchmarks/bench_gemm_f32.py --iters 20 ;;
    sm120_tma) TAILN=20 run bench_sm120_tma "${lim:-60}" python3 benchmarks/bench_sm120_tma.py --iters 20 ;;
    *) echo "unknown benchmark $b" ;;
  esac
}

session_start() {  # the start of a session script: results packed on exit, the carried wheels (WHL) installed,
  # the GPU named in the log
  archive_results
  install_wheels "$WHL" || exit 1
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv,noheader
}
