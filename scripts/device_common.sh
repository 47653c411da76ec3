# Shared by the device session scripts (sourced): where results go, the environment, installing the carried
# wheels, running a step with a time limit.
OUT=${OUT:-/tmp/out}
WHL=${WHL:-../.whl}
export PYTHONUNBUFFERED=1 MAMBA_FORGE_CACHE=/tmp/mf-cache NCCL_NVLS_ENABLE=0
mkdir -p -m 700 "$MAMBA_FORGE_CACHE"
mkdir -p "$OUT"

install_wheels() {  # install_wheels WHEEL_DIR: this package, editable, with wheels the machine lacks
  python3 -m pip install -q --no-index --find-links "$1" --no-build-isolation -e . >/tmp/install.log 2>&1 \
    || { tail /tmp/install.log; return 1; }
}

run() {  # run NAME LIMIT_S CMD...: log to $OUT/NAME.txt, print the tail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "== $name rc=$rc $((SECONDS - t0))s"
  grep -v -e "DeprecationWarning" -e "fn = lambda" "$OUT/$name.txt" | tail -n "${TAILN:-8}"
  return $rc
}
