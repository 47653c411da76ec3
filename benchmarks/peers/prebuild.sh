#!/usr/bin/env bash
# Build the peers' extensions (causal-conv1d, mamba-ssm; sm_90 only) on a CPU machine with a network, for the GPU
# machine's torch and CUDA, so a device session loads them instead of compiling (about 10 minutes of its 30 there,
# beside the qualifier). Writes .peers/prebuilt/<sdist name>.tar.gz (the in-place .so files); build_mamba_ssm.sh
# uses one when it loads with the GPU machine's torch and builds from the sdist otherwise. About 22 MB packed each:
# carry .peers with .whl less its numpy wheel (the GPU machine has numpy) to stay within a call's 64 MiB.
#   bash benchmarks/peers/prebuild.sh            # PYTHON (a 3.12 interpreter), TORCH (2.11.0), CUDA (13.0.2), MAX_JOBS
# The GPU machine (../shared/notes/toolchain-facts.md): Python 3.12, torch 2.11 (cu130), nvcc 13.0. The toolkit comes
# from PyPI's cuda-toolkit wheels (nvcc, cicc, headers, cudart), laid out as one CUDA_HOME.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PYTHON="${PYTHON:-python3.12}"
TORCH="${TORCH:-2.11.0}"
CUDA="${CUDA:-13.0.2}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
"$PYTHON" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' \
  || { echo "PYTHON must be a 3.12 interpreter (the GPU machine's): set PYTHON=..." >&2; exit 2; }
"$PYTHON" -m venv "$WORK/venv"
# shellcheck disable=SC1091
source "$WORK/venv/bin/activate"
python -m pip install -q "torch==$TORCH" "cuda-toolkit[nvcc,cccl,crt,cudart,nvvm]==$CUDA" ninja packaging wheel numpy
CUDA_HOME="$(python -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13"))')"
[ -x "$CUDA_HOME/bin/nvcc" ] || { echo "no nvcc under $CUDA_HOME" >&2; exit 2; }
ln -sf libcudart.so.13 "$CUDA_HOME/lib/libcudart.so"  # the wheels ship the versioned name only; the link wants -lcudart
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH" MAMBA_PEER_DIR="$WORK/peers" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
mkdir -p "$ROOT/.peers/prebuilt"
for pkg in causal_conv1d-1.7.0 mamba_ssm-2.3.2.post1; do
  rm -f "$ROOT/.peers/prebuilt/$pkg.tar.gz"  # else build_mamba_ssm.sh would try the old one
  bash "$HERE/build_mamba_ssm.sh" "$pkg"
  tmp="$ROOT/.peers/prebuilt/.$pkg.tar.gz.tmp"
  # without the host code's debug sections (-g: a third of the bytes); the device code is untouched
  (cd "$MAMBA_PEER_DIR/$pkg" && strip --strip-debug ./*.so && tar czf "$tmp" --owner=0 --group=0 ./*.so)
  mv "$tmp" "$ROOT/.peers/prebuilt/$pkg.tar.gz"
  ls -la "$ROOT/.peers/prebuilt/$pkg.tar.gz"
done
