#!/usr/bin/env bash
# Build a peer for sm_90 only, on the GPU machine (no network: the PyPI sdists are carried in the repo-ignored
# .peers/ folder): mamba-ssm 2.3.2.post1 (selective_scan_cuda) by default, or causal-conv1d 1.7.0 (its fast path's
# conv; with it importable, mamba-ssm's Mamba runs mamba_inner_fn). With 16 cores about 2.5 minutes for mamba-ssm and
# 9.5 for causal-conv1d (one large translation unit: its backward).
#   bash benchmarks/peers/build_mamba_ssm.sh                          # -> /tmp/peers/mamba_ssm-2.3.2.post1
#   bash benchmarks/peers/build_mamba_ssm.sh causal_conv1d-1.7.0      # -> /tmp/peers/causal_conv1d-1.7.0
# With .peers/prebuilt/<name>.tar.gz (benchmarks/peers/prebuild.sh) it unpacks that instead where it loads.
# Then benchmarks/peers/mamba_peer.py imports selective_scan_cuda from there, and the Triton
# selective_state_update by file path (no compiled extension needed for that one).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PKG="${1:-mamba_ssm-2.3.2.post1}"
case $PKG in mamba_ssm-*) SO=selective_scan_cuda ;; causal_conv1d-*) SO=causal_conv1d_cuda ;; *) echo "unknown peer $PKG" >&2; exit 2 ;; esac
SDIST="$ROOT/.peers/$PKG.tar.gz"
DEST="${MAMBA_PEER_DIR:-/tmp/peers}"
SRC="$DEST/$PKG"
if ls "$SRC"/$SO*.so >/dev/null 2>&1; then echo "already built: $SRC"; exit 0; fi
[ -f "$SDIST" ] || { echo "missing $SDIST (download it on a networked machine; see the scan report)" >&2; exit 2; }
mkdir -p "$DEST"
rm -rf "$SRC"
tar xzf "$SDIST" -C "$DEST"
cd "$SRC"
# A prebuilt extension (.peers/prebuilt/$PKG.tar.gz: the .so files this script built in place elsewhere, against the
# same torch and CUDA; benchmarks/peers/prebuild.sh) saves the GPU machine the compile, if it loads with this torch;
# else it is removed and the build below runs.
PREBUILT="$ROOT/.peers/prebuilt/$PKG.tar.gz"
if [ -f "$PREBUILT" ]; then
  tar xzf "$PREBUILT" -C "$SRC" --wildcards '*.so' --no-same-owner
  if python3 - "$SRC" "$SO" <<'PY'
import glob, importlib.util, sys
import torch  # noqa: F401  (the extension links against it)
src, name = sys.argv[1], sys.argv[2]
so = glob.glob(f"{src}/{name}*.so")
if src not in sys.path:
    sys.path.insert(0, src)  # causal_conv1d_cuda is imported as a top-level module by the package
spec = importlib.util.spec_from_file_location(name, so[0])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(f"prebuilt {so[0]} loads with torch {torch.__version__}")
PY
  then exit 0; fi
  rm -f "$SRC"/*.so
  # PREBUILT_ONLY=1: stop here (a short call that only unpacks; a later one builds in the background)
  [ "${PREBUILT_ONLY:-0}" = 1 ] && { echo "prebuilt $PREBUILT does not load here" >&2; exit 3; }
  echo "prebuilt $PREBUILT does not load here: building" >&2
fi
# gencode list: sm_90 only (the H200); every other -gencode pair goes.
python3 - <<'PY'
import re
p = "setup.py"
s = open(p).read()
s, n = re.subn(r'cc_flag\.append\("-gencode"\)\n\s*cc_flag\.append\("arch=compute_(?!90,)\d+,code=sm_\d+"\)\n', "pass\n", s)  # pass keeps emptied if-blocks valid
assert 'arch=compute_90,code=sm_90' in s and "compute_80" not in s, "gencode edit failed"
# setup.py imports wheel.bdist_wheel; newer setuptools carries it when the wheel package is absent
try:
    import wheel.bdist_wheel  # noqa: F401
except ImportError:
    s = s.replace("from wheel.bdist_wheel import bdist_wheel as _bdist_wheel",
                  "from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel")
open(p, "w").write(s)
print(f"setup.py: removed {n} gencode pairs; kept compute_90/sm_90")
PY
grep -n 'arch=compute' setup.py
export MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_FORCE_BUILD=TRUE MAX_JOBS="${MAX_JOBS:-16}" TORCH_CUDA_ARCH_LIST="9.0"
time python3 setup.py build_ext --inplace 2>&1 | tail -20
ls -la "$SRC"/$SO*.so
