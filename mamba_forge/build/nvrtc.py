"""Small typed wrappers over cuda.bindings.nvrtc: compile one named program to cubin (and PTX).

No GPU and no libcuda are needed. Headers travel in memory (name -> bytes), so no filesystem path of this
machine enters the program or the option list; only the CUDA headers come through one ``-I`` to the
nvidia-cuda-runtime wheel, which the cache key records by package version, not by path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import stat
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mamba_forge.core.errors import BuildError

CUDA_INCLUDE_TOKEN = "-I<cuda-runtime-include>"


class NvrtcError(RuntimeError):
    """An NVRTC call failed; names the nvrtcResult."""

    def __init__(self, call: str, result: object, log: str = ""):
        self.call, self.result, self.log = call, result, log
        name = getattr(result, "name", str(result))
        super().__init__(f"{call} failed with {name}" + (f": {log.strip()[:400]}" if log else ""))


# NVRTC 13 on a machine with a CUDA driver keeps its own compute cache of compiled programs (~/.nv/ComputeCache,
# CUDA_CACHE_PATH): measured on the H200, a repeated compile of the same program takes 0.6 s instead of 7.8 s.
# That cache is shared, unkeyed by us and unchecked; ours names everything that affects the bytes and hashes its
# entries. So the build turns NVRTC's off (CUDA_CACHE_DISABLE=1 does, measured) unless the caller set it.
NVRTC_CACHE_ENV = "CUDA_CACHE_DISABLE"


def _nvrtc():
    os.environ.setdefault(NVRTC_CACHE_ENV, "1")
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:  # pragma: no cover - install problem
        raise BuildError("cuda-bindings is not installed", hint="pip install 'cuda-bindings>=13,<14'") from exc
    return nvrtc


def _check(call: str, ret):
    nvrtc = _nvrtc()
    res, *rest = ret if isinstance(ret, tuple) else (ret,)
    if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(call, res)
    return rest[0] if len(rest) == 1 else rest


@functools.lru_cache(maxsize=1)
def version() -> tuple[int, int]:
    return tuple(_check("nvrtcVersion", _nvrtc().nvrtcVersion()))  # type: ignore[return-value]


@functools.lru_cache(maxsize=1)
def supported_archs() -> tuple[int, ...]:
    return tuple(_check("nvrtcGetSupportedArchs", _nvrtc().nvrtcGetSupportedArchs()))


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=1)
def library_identity() -> dict[str, str]:
    """What identifies the compiler: NVRTC's own version, the wheels that provide it and the CUDA headers,
    and a digest of the loaded libnvrtc (so a different build of the same version changes cache keys).

    Hashing the 109 MB library and importing the NVRTC binding took 0.25 s of every build, a no-change rebuild
    included; so the library's (version, sha256) are remembered in the private cache under the file's identity
    (path, device, inode, size, mtime and ctime in ns) and the wheels' versions. Any write to the file changes its
    ctime, which no user can set back; a file changed less than SETTLE_NS before it was hashed is not remembered
    (a write within the same clock tick could leave both times as they were)."""
    lib = _loaded_library_path()
    dists = {name: _dist_version(name) for name in ("nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "cuda-bindings")}
    st = _stat(lib)
    remembered = _identity_memo(lib, st, dists, None) if st is not None else None
    if remembered is not None:
        return {"nvrtc_version": remembered["nvrtc_version"], **dists, "libnvrtc_sha256": remembered["libnvrtc_sha256"]}
    major, minor = version()
    ident = {"nvrtc_version": f"{major}.{minor}", **dists}
    if lib is not None:
        ident["libnvrtc_sha256"] = _file_digest(lib)
        after = _stat(lib)
        if (st is not None and after is not None and _file_key(after) == _file_key(st)
                and time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) > SETTLE_NS):
            _identity_memo(lib, st, dists, ident)
    return ident


SETTLE_NS = 2_000_000_000
_MEMO_KEYS = ("nvrtc_version", "libnvrtc_sha256")
_VERSION_TEXT = re.compile(r"[0-9]{1,4}\.[0-9]{1,4}")
_SHA_TEXT = re.compile(r"[0-9a-f]{64}")


def _file_key(st) -> tuple[int, ...]:
    """What says the file is the one hashed: device, inode, size, mtime and ctime in ns. Not the whole stat
    result: its equality includes the access time, which the hash's own read may move (relatime moves it when it
    is not newer than mtime, so a library hashed a second after it was written was never remembered)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stat(path: str | None) -> os.stat_result | None:
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def _identity_memo(lib: str, st: os.stat_result, dists: dict[str, str], store: dict[str, str] | None) -> dict | None:
    """The remembered (nvrtc_version, libnvrtc_sha256) of this exact library file, or None; with `store`, remember
    them. A cache that is off, unsafe or unwritable: None (the library is hashed), never an error."""
    from mamba_forge.core.cache import cache_key, memo_cache, memo_writes

    cache = memo_cache() if store is None or memo_writes() else None
    if cache is None:
        return None
    key = cache_key({"kind": "nvrtc-library", "format": 1, "path": os.path.realpath(lib), "device": st.st_dev,
                     "inode": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
                     "dists": dists})
    if store is not None:
        cache.put(key, {"identity": json.dumps({k: store[k] for k in _MEMO_KEYS}, sort_keys=True).encode()})
        return None
    found: list[dict] = []

    def accept(parts: dict[str, bytes]) -> str | None:
        try:
            value = json.loads(parts.get("identity", b""))
        except ValueError:
            return "not JSON"
        if (type(value) is not dict or sorted(value) != sorted(_MEMO_KEYS) or type(value["nvrtc_version"]) is not str
                or not _VERSION_TEXT.fullmatch(value["nvrtc_version"]) or type(value["libnvrtc_sha256"]) is not str
                or not _SHA_TEXT.fullmatch(value["libnvrtc_sha256"])):
            return "not a library identity"
        found.append(value)
        return None

    cache.get(key, accept)
    return found[0] if found else None


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _loaded_library_path() -> str | None:
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        lib = load_nvidia_dynamic_lib("nvrtc")
        return getattr(lib, "abs_path", None)
    except Exception:  # noqa: BLE001 - identity is best effort beyond the version numbers
        return None


@functools.lru_cache(maxsize=1)
def cuda_include_dir() -> Path:
    """The CUDA headers (cuda_bf16.h, cuda_fp16.h) from the nvidia-cuda-runtime wheel; never a system CUDA."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
    except Exception as exc:  # noqa: BLE001
        raise BuildError(f"cannot locate the CUDA runtime headers: {exc}", hint="pip install 'nvidia-cuda-runtime==13.0.*'") from None
    if not found or not (Path(found) / "cuda_bf16.h").is_file():
        raise BuildError("the CUDA runtime headers (cuda_bf16.h) were not found", hint="pip install 'nvidia-cuda-runtime==13.0.*'")
    return Path(found)


@functools.lru_cache(maxsize=256)
def is_cuda_header(name: str) -> bool:
    """Whether an include name (already checked plain: relative, no '..') is a file of the pinned CUDA headers."""
    root = cuda_include_dir().resolve()
    p = (root / name).resolve()
    return p.is_relative_to(root) and p.is_file()


def is_cuda_header_path(path: str) -> bool:
    """Whether a file name in the compiler log is one of the pinned CUDA headers (NVRTC names them by full path)."""
    p = Path(path)
    if not p.is_absolute() or ".." in p.parts:
        return False
    try:
        return p.is_relative_to(cuda_include_dir()) or p.resolve().is_relative_to(cuda_include_dir().resolve())
    except BuildError:
        return False


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    log: str
    cubin: bytes
    ptx: bytes


def _get_bytes(nvrtc, prog, size_fn, get_fn, call: str) -> bytes:
    n = _check(call + "Size", size_fn(prog))
    if n == 0:
        return b""
    buf = bytearray(n)  # never an interned bytes object: NVRTC writes into it
    _check(call, get_fn(prog, buf))
    return bytes(buf).rstrip(b"\0") if call.endswith("Log") or call.endswith("PTX") else bytes(buf)


def compile_program(
    source: str, name: str, options: list[str], headers: dict[str, bytes], *, want_ptx: bool = True
) -> CompileResult:
    """Compile one program. `options` may carry CUDA_INCLUDE_TOKEN, replaced here by the real include path."""
    nvrtc = _nvrtc()
    real_opts = [str(cuda_include_dir()).join(("-I", "")) if o == CUDA_INCLUDE_TOKEN else o for o in options]
    hnames = sorted(headers)
    prog = _check(
        "nvrtcCreateProgram",
        nvrtc.nvrtcCreateProgram(
            source.encode(), name.encode(), len(hnames), [headers[h] for h in hnames], [h.encode() for h in hnames]
        ),
    )
    try:
        opts = [o.encode() for o in real_opts]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        log = _get_bytes(nvrtc, prog, nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog, "nvrtcGetProgramLog")
        log_text = log.decode(errors="replace")
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return CompileResult(False, log_text, b"", b"")
        cubin = _get_bytes(nvrtc, prog, nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN, "nvrtcGetCUBIN")
        ptx = (
            _get_bytes(nvrtc, prog, nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX, "nvrtcGetPTX") if want_ptx else b""
        )
        return CompileResult(True, log_text, cubin, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
