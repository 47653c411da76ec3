#!/usr/bin/env bash
# The release session on one H200 in one device call (about 8 minutes): install (carried wheels), build for
# sm_90a, full qualification signed with the release key, bundle, verify, then the whole GPU test suite with
# the fresh bundle. Most important first: a call cut short still brings back the signed manifest.
# Needs (carried, never committed): .whl (wheels the machine lacks), .keys/release.key.
# Results: $OUT/res.tar.gz (the device tool brings back at most 8 files).
set -uo pipefail
RES=/tmp/res
OUT_FINAL=${OUT:-/tmp/out}
OUT=$RES WHL=${WHL:-.whl}
source "$(dirname "$0")/device_common.sh"
pack() { tar -czf "$OUT_FINAL/res.tar.gz" -C /tmp res; }
trap pack EXIT

install_wheels "$WHL" || exit 1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv,noheader
run build 300 mamba-forge build --arch sm_90a --out build -q -j 16
# QUALIFY_FLAGS: e.g. --no-sanitize, to keep the call inside its 10 minutes (the sanitizer passes are long)
TAILN=30 run qualify 330 mamba-forge qualify --device 0 --build build --level full ${QUALIFY_FLAGS:-} \
  --sign-key .keys/release.key --out manifests/h200.toml
cp manifests/h200.toml manifests/h200.runtime.json "$OUT/"
run bundle 60 mamba-forge bundle manifests/h200.toml --build build -o "$OUT/h200.tar.gz"
run verify 60 mamba-forge verify "$OUT/h200.tar.gz"
MF_RUNTIME_BUNDLE="$OUT/h200.tar.gz" MF_RUNTIME_KEY=manifests/keys TAILN=25 \
  run test_gpu "${GPU_TEST_LIMIT:-420}" python3 -m pytest -q -p no:cacheprovider -n 4 -m gpu tests
[ -n "${COLD_START:-}" ] && TAILN=12 run bench_cold_start "$COLD_START" \
  python3 benchmarks/bench_cold_start.py --bundle "$OUT/h200.tar.gz" --key manifests/keys --out "$OUT/cold_start.md"
echo done
