#!/usr/bin/env bash
# The eighth session's release call on one H200 (under 10 minutes), most important first: build for sm_90a, full
# qualification signed with the release key (manifests/h200.toml + .runtime.json), bundle, verify; the GPU tests of
# what changed (token kernels and the Mamba layer; the qualifier's placement controls); the peers (mamba-ssm and
# causal-conv1d from .peers/) built in the background meanwhile; then the scan and block benchmarks while time
# is left. The bundle stays at /tmp/h200.tar.gz and the peers under /tmp/peers for a chained call.
# Carried: .whl, .keys, .peers. Env: QUALIFY_FLAGS, DEADLINE, BENCH (0: none).
set -uo pipefail
WHL=${WHL:-.whl}
DEADLINE=${DEADLINE:-575}
source "$(dirname "$0")/device_common.sh"
archive_results
install_wheels "$WHL" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
( MAX_JOBS=8 bash benchmarks/peers/build_mamba_ssm.sh >"$OUT/peer_mamba.txt" 2>&1 ) &
( MAX_JOBS=8 bash benchmarks/peers/build_mamba_ssm.sh causal_conv1d-1.7.0 >"$OUT/peer_conv.txt" 2>&1 ) &
run build 240 mamba-forge build --arch sm_90a --out build -q -j 16
TAILN=30 run qualify 330 mamba-forge qualify --device 0 --build build --level full ${QUALIFY_FLAGS:-} \
  --sign-key .keys/release.key --out manifests/h200.toml
cp manifests/h200.toml manifests/h200.runtime.json "$OUT/"
run bundle 60 mamba-forge bundle manifests/h200.toml --build build -o /tmp/h200.tar.gz
run verify 60 mamba-forge verify /tmp/h200.tar.gz
export MF_RUNTIME_BUNDLE=/tmp/h200.tar.gz MF_RUNTIME_KEY=manifests/keys
TAILN=12 run bench_scan 60 python3 benchmarks/bench_scan_tokens.py --bundle /tmp/h200.tar.gz --key manifests/keys
TAILN=40 run tests_gpu $(( $(left) > 300 ? ${TEST_S:-120} : $(left) - 150 )) python3 -m pytest -q -p no:cacheprovider -n 4 \
  -rfE --tb=line ${TESTS:-tests/gpu/test_mamba_layer_gpu.py}
if [ "${BENCH:-1}" != 0 ] && [ "$(left)" -gt 60 ]; then
  wait
  [ "$(left)" -gt 40 ] && TAILN=60 run bench_block $(( $(left) - 15 )) python3 benchmarks/bench_mamba_block.py \
    --bundle /tmp/h200.tar.gz --key manifests/keys --d-models 1024 --reps 10
fi
echo done
