#!/usr/bin/env bash
# The Mamba layer's development call on one H200 (under 10 minutes): build for sm_90a, a quick qualification of
# Fixed + TriadSm90a signed with a throwaway key, bundle; the token kernels' and the layer's GPU tests; the peers
# (mamba-ssm and causal-conv1d from .peers/) built in the background; the scan and block benchmarks.
# Carried: .whl, .peers. Results: $OUT/res.tar.gz.
set -uo pipefail
WHL=${WHL:-.whl}
DEADLINE=${DEADLINE:-570}
source "$(dirname "$0")/device_common.sh"
archive_results
install_wheels "$WHL" || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
run build 240 mamba-forge build --arch sm_90a --out build -q -j 16
( MAX_JOBS=12 bash benchmarks/peers/build_mamba_ssm.sh >"$OUT/peer_mamba.txt" 2>&1
  MAX_JOBS=12 bash benchmarks/peers/build_mamba_ssm.sh causal_conv1d-1.7.0 >"$OUT/peer_conv.txt" 2>&1 ) &
PEERS=$!
mamba-forge keygen --out /tmp/devkey --name dev >/dev/null
TAILN=20 run qualify 200 mamba-forge qualify --device 0 --build build --module Fixed --module TriadSm90a \
  --level quick --sign-key /tmp/devkey/dev.key --out "$OUT/dev.toml" -q
grep -B2 -A4 'status = "rejected"' "$OUT/dev.toml" | grep -E '^name|^reason|^check' | head -40
run bundle 60 mamba-forge bundle "$OUT/dev.toml" --build build -o /tmp/dev.tar.gz
export MF_RUNTIME_BUNDLE=/tmp/dev.tar.gz MF_RUNTIME_KEY=/tmp/devkey/dev.pub
TAILN=30 run tests 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/gpu/test_mamba_layer_gpu.py
wait $PEERS
tail -3 "$OUT/peer_mamba.txt" "$OUT/peer_conv.txt"
TAILN=12 run bench_scan 60 python3 benchmarks/bench_scan_tokens.py --bundle /tmp/dev.tar.gz --key /tmp/devkey/dev.pub
[ "$(left)" -gt 30 ] && TAILN=80 run bench_block $(( $(left) - 15 )) python3 benchmarks/bench_mamba_block.py \
  --bundle /tmp/dev.tar.gz --key /tmp/devkey/dev.pub --reps 10
echo done
