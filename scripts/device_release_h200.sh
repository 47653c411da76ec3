#!/usr/bin/env bash
# The release session on one H200 in one device call (under 10 minutes): install (carried wheels), build for
# sm_90a, full qualification signed with the release key, bundle, verify, the decode and runtime benchmarks
# (they append to benchmarks/results/*.md and summary.json, copied back), then the GPU tests: the files of the
# kernels that changed first, the rest while time is left. Most important first: a call cut short still brings
# back the signed manifest. Needs (carried, never committed): .whl (wheels the machine lacks), .keys/release.key,
# .peers (the mamba-ssm sdist, for the decode-step baseline). Results: $OUT/res.tar.gz (at most 8 files return).
# Env: QUALIFY_FLAGS (e.g. --no-sanitize), QUALIFY_S (its limit), BENCHES, COLD_FLAGS (e.g. --no-compile),
# FIRST_TESTS (test files run first),
# DEADLINE (seconds of the call).
set -uo pipefail
WHL=${WHL:-.whl}
DEADLINE=${DEADLINE:-570}
source "$(dirname "$0")/device_common.sh"
session_start
run build 240 mamba-forge build --arch sm_90a --out build -q -j 16
TAILN=30 run qualify ${QUALIFY_S:-330} mamba-forge qualify --device 0 --build build --level full ${QUALIFY_FLAGS:-} \
  --sign-key .keys/release.key --out manifests/h200.toml
cp manifests/h200.toml manifests/h200.runtime.json "$OUT/"
run bundle 60 mamba-forge bundle manifests/h200.toml --build build -o "$OUT/h200.tar.gz"
run verify 60 mamba-forge verify "$OUT/h200.tar.gz"
# BENCHES: which benchmarks run after the signed manifest
BUNDLE="$OUT/h200.tar.gz"
for b in ${BENCHES:-decode_step decode_gemm cold_start launch}; do bench "$b"; done
export MF_RUNTIME_BUNDLE="$OUT/h200.tar.gz" MF_RUNTIME_KEY=manifests/keys
FIRST=${FIRST_TESTS:-tests/gpu/test_gemm_skinny.py tests/gpu/test_decode_step.py tests/gpu/test_runtime_gpu.py tests/gpu/test_gemm_sm90a.py tests/gpu/test_scan.py}
TAILN=12 run test_gpu_changed $(( $(left) > 60 ? $(left) - 40 : 20 )) python3 -m pytest -q -p no:cacheprovider -n 4 $FIRST
REST=$(ls tests/gpu/test_*.py | grep -v -F -x -f <(tr ' ' '\n' <<<"$FIRST"))
[ "$(left)" -gt 40 ] && TAILN=12 run test_gpu_rest $(( $(left) - 15 )) python3 -m pytest -q -p no:cacheprovider -n 4 $REST
echo done
