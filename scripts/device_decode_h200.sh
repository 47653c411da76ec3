#!/usr/bin/env bash
# The decode-path session on one H200 in one device call (about 9 minutes): build for sm_90a, the skinny-M GEMM
# and decode-step GPU tests, the qualifier's negative controls (route-equivalence included), a quick qualification
# of the GEMM modules (route classes proven on the device), then the decode benchmarks (they append to
# benchmarks/results/*.md and summary.json, copied back). Needs (carried): .whl, .peers (the mamba-ssm sdist:
# Triton's selective_state_update is read from it). Results: $OUT/res.tar.gz.
set -uo pipefail
WHL=${WHL:-.whl}
source "$(dirname "$0")/device_common.sh"
archive_results

install_wheels "$WHL" || exit 1
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv,noheader
run build 200 mamba-forge build --arch sm_90a --out build -q -j 16
TAILN=25 run test_decode "${TEST_LIMIT:-170}" python3 -m pytest -q -p no:cacheprovider -n 4 -x \
  tests/gpu/test_gemm_skinny.py tests/gpu/test_decode_step.py tests/gpu/test_qualify_gpu.py
TAILN=20 run qualify_gemm 120 mamba-forge qualify --device 0 --build build --level quick --no-sanitize \
  --module TriadSm90a --module TriadScalar --module Fixed --out /tmp/q/gemm.toml
python3 - <<'PY' > "$OUT/route_equivalence.txt" 2>&1
import tomllib
m = tomllib.load(open("/tmp/q/gemm.toml", "rb"))
for s in m["symbols"]:
    eq = [c for c in s.get("checks", []) if c["name"] == "route-equivalence"]
    if eq or s.get("check") == "route-equivalence":
        print(s["name"], s["status"], s.get("check", ""), (eq[-1]["detail"] if eq else s.get("reason", ""))[:160])
PY
cat "$OUT/route_equivalence.txt" | head -30
TAILN=30 run bench_decode_step 120 python3 benchmarks/bench_decode_step.py ${STEP_FLAGS:-}
TAILN=60 run bench_decode_gemm "${GEMM_LIMIT:-200}" python3 benchmarks/bench_decode_gemm.py ${GEMM_FLAGS:-}
echo done
