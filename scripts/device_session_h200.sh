#!/usr/bin/env bash
# One device call on one H200 (under 10 minutes), most important first (the session script since the tenth
# session; the older per-session scripts were folded into it): build for sm_90a, full qualification signed with the
# release key (.keys/release.key) into manifests/h200.toml + .runtime.json, bundle, verify; the token-scan benchmark;
# the route tuner (TUNE); the GPU tests named by TESTS; the decode step against Triton (DECODE_STEP); the peers
# (mamba-ssm and causal-conv1d from .peers/) built in the background meanwhile, or loaded from .peers/prebuilt/ where
# benchmarks/peers/prebuild.sh left them and they load with this torch (their sm_90 builds are over what a call
# brings back); then BENCHES (python files under benchmarks/, with their arguments,
# ';'-separated) while time is left.
# Results: every step's log and the outputs, packed on exit into $OUT/res.tar.gz (the call's one file): run it as the
# call's last command; anything writing $OUT/res.tar.gz after it replaces them (call 4 of the seventeenth session).
# Carried: .whl, .keys, .peers. Env: QUALIFY_FLAGS, DEADLINE, TESTS, TESTS_K (pytest -k), TEST_N (workers), TEST_S, TEST_TIMEOUT,
# BENCHES, BUILD_DIR (a carried build), PEER_CONV=0; 0 turns off: QUALIFY, PEERS, SCAN (late: after the tests),
# PROFILE; 1 turns on: NCU_SCAN, TUNE, DECODE_STEP, PROBE_DECODE (PROBE_BATCHES), SANITIZE_TIMING.
set -uo pipefail
WHL=${WHL:-.whl}
DEADLINE=${DEADLINE:-570}
source "$(dirname "$0")/device_common.sh"
session_start
mamba_pid=
if [ "${PEERS:-1}" != 0 ]; then  # PEER_CONV=0: mamba-ssm only (causal-conv1d takes 5.5 min, for the block benchmarks)
  [ "${PEER_CONV:-1}" != 0 ] && ( MAX_JOBS=8 bash benchmarks/peers/build_mamba_ssm.sh causal_conv1d-1.7.0 \
    >"$OUT/peer_conv.txt" 2>&1 ) &
  ( MAX_JOBS=8 bash benchmarks/peers/build_mamba_ssm.sh >"$OUT/peer_mamba.txt" 2>&1 ) &
  mamba_pid=$!
fi
# BUILD_DIR: a carried build (the CPU machine's cubins reproduce the device's byte for byte) instead of building here
BUILD=${BUILD_DIR:-build}
[ -n "${BUILD_DIR:-}" ] || run build 240 mamba-forge build --arch sm_90a --out build -q -j 16 || exit 1
if [ "${QUALIFY:-1}" != 0 ]; then  # QUALIFY=0: bundle the committed manifest (the kernels did not change)
  TAILN=30 run qualify 330 mamba-forge qualify --device 0 --build "$BUILD" --level full ${QUALIFY_FLAGS:-} \
    --sign-key .keys/release.key --out manifests/h200.toml
  cp manifests/h200.toml manifests/h200.runtime.json "$OUT/"
fi
# a bundle left by an earlier call on a warm machine must never stand in for this one (the eighteenth session's
# call 2 verified and benchmarked call 1's after its own bundle failed)
rm -f /tmp/h200.tar.gz
run bundle 60 mamba-forge bundle manifests/h200.toml --build "$BUILD" -o /tmp/h200.tar.gz || exit 1
run verify 60 mamba-forge verify /tmp/h200.tar.gz || exit 1
export MF_RUNTIME_BUNDLE=/tmp/h200.tar.gz MF_RUNTIME_KEY=manifests/keys
# SANITIZE_TIMING=1: a full qualification with the sanitizer passes, into /tmp (not committed): its time only
[ "${SANITIZE_TIMING:-0}" != 0 ] && TAILN=20 run qualify_sanitize ${SANITIZE_S:-150} mamba-forge qualify --device 0 --build "$BUILD" \
  --level full --sanitize ${QUALIFY_FLAGS_SAN:-} --out /tmp/sanitize/h200-full-sanitize.toml
scan_bench() { [ -n "$mamba_pid" ] && wait "$mamba_pid"
  TAILN=12 run bench_scan 60 python3 benchmarks/bench_scan_tokens.py --bundle /tmp/h200.tar.gz --key manifests/keys; }
# SCAN=late: after the GPU tests (the peer's build has finished by then), else right here, waiting for the peer
[ "${SCAN:-1}" != 0 ] && [ "${SCAN:-1}" != late ] && scan_bench
# TUNE=1: the GEMM route tuner on this bundle, writing kernels/route_tuning.toml (re-qualify to carry it)
if [ "${TUNE:-0}" != 0 ]; then
  TAILN=30 run tune_routes 240 python3 benchmarks/tune_routes.py --bundle /tmp/h200.tar.gz --key manifests/keys --write
  cp kernels/route_tuning.toml "$OUT/" ; cp -r benchmarks/results/route_tuning "$OUT/" 2>/dev/null
fi
TAILN=60 run tests_gpu $(( $(left) - 15 < ${TEST_S:-150} ? $(left) - 15 : ${TEST_S:-150} )) python3 -m pytest -p no:cacheprovider \
  -n ${TEST_N:-4} -v --timeout ${TEST_TIMEOUT:-120} -rfE --tb=short ${TESTS:-tests/gpu/test_mamba_layer_gpu.py} \
  ${TESTS_K:+-k "$TESTS_K"}
[ "${SCAN:-1}" = late ] && scan_bench
[ "${PROFILE:-1}" != 0 ] && TAILN=8 run profile_host 60 python3 scripts/profile_host_path.py --bundle /tmp/h200.tar.gz \
  --key manifests/keys --calls ${PROFILE_CALLS:-2000}
# NCU_SCAN=1: the token scan's first launch (B8 D2048 L2048) under Nsight Compute: throughput, stall reasons, occupancy
[ "${NCU_SCAN:-0}" != 0 ] && command -v ncu >/dev/null && TAILN=80 run ncu_scan 120 ncu --section SpeedOfLight \
  --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats -k regex:ssm_scan_tokens \
  -c 1 python3 benchmarks/bench_scan_tokens.py --bundle /tmp/h200.tar.gz --key manifests/keys --reps 1
# DECODE_STEP=1: the decode step against Triton's selective_state_update (mamba-ssm's source, by file path)
[ "${DECODE_STEP:-0}" != 0 ] && TAILN=20 run bench_decode_step 120 python3 benchmarks/bench_decode_step.py
# PROBE_DECODE=1: the step launched plainly and with programmatic dependent launch, beside an empty kernel
[ "${PROBE_DECODE:-0}" != 0 ] && TAILN=40 run probe_decode 120 python3 scripts/probe_decode_latency.py \
  --batches "${PROBE_BATCHES:-1,16,32,64,256}"
IFS=';' read -ra benches <<<"${BENCHES:-}"
for b in "${benches[@]}"; do
  [ -z "$b" ] && continue
  case $b in *bench_mamba*) wait ;; esac  # the peers
  [ "$(left)" -gt 40 ] || { echo "no time left for $b"; continue; }
  name=$(basename "${b%% *}" .py)
  TAILN=60 run "$name" $(( $(left) - 15 )) python3 benchmarks/$b --bundle /tmp/h200.tar.gz --key manifests/keys
done
ls -la "$OUT_FINAL"
echo done
