#!/usr/bin/env bash
# A development session on one H200 (one device call, under 10 minutes): build for sm_90a, a quick qualification
# of the whole catalog (admission, float64 references, determinism, route-equivalence of the new rungs), the GPU
# test files of the kernels that changed, and their benchmarks; the NVRTC repro loop runs niced in the background.
# Carried: .whl. Results: $OUT/res.tar.gz. Env: TESTS (test files), BENCHES (names of device_common.sh's bench),
# DEADLINE.
set -uo pipefail
WHL=${WHL:-.whl}
DEADLINE=${DEADLINE:-560}
source "$(dirname "$0")/device_common.sh"
archive_results
install_wheels "$WHL" || exit 1
run build 240 mamba-forge build --arch sm_90a --out build -q -j 16
(nice -n 10 python3 scripts/repro_loop.py --kernels 'gemm_bi_f32_f32*' --runs 12 -j 3 --keep /tmp/res/ptx \
  > /tmp/res/repro_loop.txt 2>&1 &)
TAILN=40 run qualify_quick 200 mamba-forge qualify --device 0 --build build --level quick --out /tmp/res/quick.toml -q
grep -B1 -A3 'status = "rejected"' /tmp/res/quick.toml | grep -E '^name|^reason|^check' | head -60
TAILN=30 run tests $(( $(left) > 200 ? 200 : $(left) - 100 )) python3 -m pytest -q -p no:cacheprovider -n 6 --maxfail=40 ${TESTS}
for b in ${BENCHES:-gemm_f32 conv1d}; do [ "$(left)" -gt 40 ] && bench "$b" $(( $(left) - 20 < 120 ? $(left) - 20 : 120 )); done
echo done
