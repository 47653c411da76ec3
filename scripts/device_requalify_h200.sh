#!/usr/bin/env bash
# The requalification call for docs/pending/next-qualification.patch on one H200 (under 10 minutes; written in the
# twenty-ninth session, whose starts were all refused: never run yet). On the CPU machine first: `git apply` the
# patch, `mamba-forge keygen --out .keys --name release` where no release key was kept (then its .pub into
# manifests/keys/release-<id16>.pub), `mamba-forge build --arch sm_90a --out .artifacts` and
# `tar czf .snap/art.tgz .artifacts`, `bash ../shared/device/wheels.sh` (move numpy's wheel out: the machine has
# it), and benchmarks/peers/prebuild.sh (causal-conv1d and mamba-ssm, ~20 minutes on 2 cores). The peers come in
# two calls on one warm machine (30 s idle release; both with the tree are over a call's 64 MiB): a first call that
# only runs `PREBUILT_ONLY=1 bash benchmarks/peers/build_mamba_ssm.sh causal_conv1d-1.7.0` (carry .peers with that
# prebuilt), then at once this one, carrying .whl .snap .keys and .peersm (the sdists and mamba-ssm's prebuilt).
# Steps: the sm90a nn rungs quick-qualified for the route tuner at d1024 / d2560 (merged into
# kernels/route_tuning.toml; TUNE=0 skips), a rebuild for the tuned catalog (compared with the carried build),
# the full qualification signed with .keys/release.key into manifests/h200.toml, bundle, verify, the GPU tests of
# the split class, layer, LM, training, runtime and optimizer, then the benchmarks while DEADLINE leaves time.
# Results: $OUT/res.tar.gz (and the signed manifest beside it as soon as it exists).
set -uo pipefail
WHL=.whl
DEADLINE=${DEADLINE:-525}
source scripts/device_common.sh
session_start
# .peersm (carried): the sdists and mamba-ssm's prebuilt; .peers (call 1's, causal-conv1d's) is not carried here
[ -d .peersm ] && { rm -rf .peers; cp -r .peersm .peers; }
( PREBUILT_ONLY=1 bash benchmarks/peers/build_mamba_ssm.sh >"$OUT/peer_mamba.txt" 2>&1;
  ls /tmp/peers/causal_conv1d-1.7.0/causal_conv1d_cuda*.so >/dev/null 2>&1 || PREBUILT_ONLY=1 bash benchmarks/peers/build_mamba_ssm.sh causal_conv1d-1.7.0 \
    >"$OUT/peer_conv.txt" 2>&1 ) &
peers_pid=$!
tar xzf .snap/art.tgz || { echo "no .snap/art.tgz (see the header)"; exit 1; }
mkdir -p /tmp/q /tmp/keep
BUILD=.artifacts
if [ "${TUNE:-1}" != 0 ]; then  # TUNE=0: the committed table (the new rungs qualified, served where the class order reaches them)
  TAILN=6 run qualify_tune 150 mamba-forge qualify --device 0 --build .artifacts --level quick --no-sanitize \
    --kernels 'gemm_bi_nn_sm90a_wgmma*' --sign-key .keys/release.key --out /tmp/q/tune.toml
  run bundle_tune 60 mamba-forge bundle /tmp/q/tune.toml --build .artifacts -o /tmp/tune.tar.gz \
    && TAILN=30 run tune_routes 170 python3 benchmarks/tune_routes.py --bundle /tmp/tune.tar.gz --key manifests/keys \
      --keys nn:bf16 --d-models 1024,2560 --ms 1,2,4,8,16,32,64,128,256,725,2048,4096,8192,16384 --reps 5 \
      --write --merge
  cp kernels/route_tuning.toml "$OUT/"; cp -r benchmarks/results/route_tuning "$OUT/" 2>/dev/null
  # the tuned table is part of the catalog's digest: build again (the cubins must come out byte for byte the same)
  BUILD=build
  run build 150 mamba-forge build --arch sm_90a --out build -q -j 16 || BUILD=.artifacts
  TAILN=6 run compare_builds 60 python3 scripts/compare_builds.py .artifacts build
fi
TAILN=30 run qualify 200 mamba-forge qualify --device 0 --build "$BUILD" --level full \
  --sign-key .keys/release.key --out manifests/h200.toml
cp manifests/h200.toml manifests/h200.runtime.json "$OUT/"; cp manifests/h200.toml manifests/h200.runtime.json "$OUT/qualify.txt" "$OUT_FINAL/" 2>/dev/null
rm -f /tmp/h200.tar.gz
run bundle 60 mamba-forge bundle manifests/h200.toml --build "$BUILD" -o /tmp/h200.tar.gz || exit 1
run verify 60 mamba-forge verify /tmp/h200.tar.gz || exit 1
export MF_RUNTIME_BUNDLE=/tmp/h200.tar.gz MF_RUNTIME_KEY=manifests/keys
wait $peers_pid
export PYTHONPATH=/tmp/peers/mamba_ssm-2.3.2.post1:/tmp/peers/causal_conv1d-1.7.0${PYTHONPATH:+:$PYTHONPATH}
TAILN=40 run tests_gpu $(( $(left) - 40 < 150 ? $(left) - 40 : 150 )) python3 -m pytest -p no:cacheprovider -n 4 -q \
  --timeout 120 -rfE --tb=short tests/gpu/test_gemm_splitk.py tests/gpu/test_mamba_layer_gpu.py \
  tests/gpu/test_mamba_lm_gpu.py tests/gpu/test_training_gpu.py tests/gpu/test_runtime_gpu.py \
  tests/gpu/test_torch_optim_gpu.py tests/gpu/test_train_tiny_gpu.py
B="--bundle /tmp/h200.tar.gz --key manifests/keys"
[ "$(left)" -gt 90 ] && TAILN=40 run bench_mamba_block $(( $(left) - 10 < 100 ? $(left) - 10 : 100 )) python3 benchmarks/bench_mamba_block.py $B
for s in bench_memory_bound bench_conv1d bench_conv_optim; do
  [ "$(left)" -gt 40 ] && TAILN=12 run "smoke_$s" 25 python3 benchmarks/$s.py --smoke
done
[ "$(left)" -gt 90 ] && TAILN=40 run bench_mamba_generate $(( $(left) - 10 < 150 ? $(left) - 10 : 150 )) python3 benchmarks/bench_mamba_generate.py $B \
  --models mamba-1.4b,mamba-2.8b --batches 1,16
[ "$(left)" -gt 70 ] && TAILN=30 run bench_mamba_train $(( $(left) - 10 )) python3 benchmarks/bench_mamba_train.py $B --runs 3
ls -la "$OUT_FINAL"; echo "done $SECONDS s"
