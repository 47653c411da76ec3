"""Resolve a launch's stream argument to a CUstream handle (an int).

Accepted: an int handle (0, the legacy stream, only when asked for explicitly); any object with
``__cuda_stream__`` (the CUDA Python protocol: returns ``(version, handle)``); torch streams (``.cuda_stream``);
CuPy streams (``.ptr``); mamba_forge.gpu.driver.Stream (``.handle``, a cuda-bindings CUstream) and bare
cuda-bindings CUstream objects (``getPtr()``).

With no stream given, the launch goes where the framework owning the tensors is enqueueing work, so it is
ordered after what produced its inputs: torch's ``torch.cuda.current_stream(device).cuda_stream`` (torch looked
up through ``sys.modules``, only when the tensors are torch tensors, never imported here) or CuPy's
``cupy.cuda.get_current_stream().ptr``. Whatever that framework's current stream is (its default may be the
legacy stream) is used as is. Without such a framework, the per-thread default stream
(CU_STREAM_PER_THREAD), never the legacy stream 0 implicitly. Standard library only.
"""

from __future__ import annotations

import os
import sys

from mamba_forge.runtime.errors import LaunchRefused

CU_STREAM_LEGACY = 1
CU_STREAM_PER_THREAD = 2
_HANDLE_LIMIT = 1 << 64


def _checked(v, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise LaunchRefused(f"{what} gave a {type(v).__name__} ({v!r}), not an integer CUstream handle")
    if not 0 <= v < _HANDLE_LIMIT:
        raise LaunchRefused(f"{what} = {v} is not a 64-bit CUstream handle")
    return v


def _pointer_of(h, what: str) -> int:
    """An int from a handle attribute: an int, or a cuda-bindings CUstream (getPtr())."""
    get_ptr = getattr(h, "getPtr", None)
    return _checked(int(get_ptr()) if get_ptr is not None else h, what)


def stream_handle(stream) -> int:
    """The CUstream handle of an explicit stream argument."""
    if type(stream) is int:
        return _checked(stream, "stream")
    if isinstance(stream, bool):
        raise LaunchRefused("stream is a bool, not a CUDA stream")
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is not None:
        v = protocol() if callable(protocol) else protocol
        if not (isinstance(v, tuple) and len(v) == 2):
            raise LaunchRefused(f"stream of type {type(stream).__name__}: __cuda_stream__ returned {v!r}, "
                                "not (version, handle)")
        return _pointer_of(v[1], f"__cuda_stream__ of {type(stream).__name__}")
    if isinstance(stream, int):  # int subclasses (IntEnum, numpy ints are not int)
        return _checked(int(stream), "stream")
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, mamba_forge.gpu.driver.Stream
        h = getattr(stream, attr, None)
        if h is not None:
            return _pointer_of(h, f"stream.{attr} of {type(stream).__name__}")
    if hasattr(stream, "getPtr"):
        return _pointer_of(stream, f"stream of type {type(stream).__name__}")
    raise LaunchRefused(f"stream of type {type(stream).__name__} is not a CUDA stream (pass a torch/CuPy stream, "
                        "an object with __cuda_stream__, a mamba_forge Stream or an int handle)")


def _cupy_current(cupy, ordinal: int) -> int:
    try:
        return cupy.cuda.get_current_stream(ordinal).ptr
    except TypeError:  # CuPy before device_id= : the current device's stream
        return cupy.cuda.get_current_stream().ptr


_torch_reader: tuple = (None, None, None)  # (torch module, its torch.cuda.current_stream, the raw reader or None)


def _forget_torch_reader() -> None:
    global _torch_reader
    _torch_reader = (None, None, None)


if hasattr(os, "register_at_fork"):  # a forked child asks torch again (torch refuses CUDA there: a bad fork)
    os.register_at_fork(after_in_child=_forget_torch_reader)


def _raw_reader(torch, current):
    """torch._C._cuda_getCurrentRawStream (device -> the current stream's raw handle: what
    ``torch.cuda.current_stream(device).cuda_stream`` returns, without making a Stream object) where the
    current_stream asked for is torch's own and CUDA is initialised in this process; else None (ask current_stream)."""
    raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
    if raw is None or getattr(current, "__module__", None) != "torch.cuda" \
            or getattr(current, "__name__", None) != "current_stream":
        return None  # a CPU build, or a current_stream replaced by someone: theirs is asked
    initialized = getattr(torch.cuda, "is_initialized", None)
    return raw if initialized is not None and initialized() else None


def _torch_current(torch, ordinal: int) -> int:
    """torch's current stream on the device, as a raw handle. Which reader serves is decided once per (torch module,
    its current_stream function); the stream itself is read on every call (it changes: torch.cuda.stream(s))."""
    global _torch_reader
    current = torch.cuda.current_stream
    mod, fn, raw = _torch_reader
    if mod is not torch or fn is not current:
        raw = _raw_reader(torch, current)
        if raw is not None:
            _torch_reader = (torch, current, raw)
    h = raw(ordinal) if raw is not None else current(ordinal).cuda_stream
    if type(h) is int and 0 <= h < _HANDLE_LIMIT:
        return h
    return _checked(h, "torch.cuda.current_stream")


def default_stream(owner: str, ordinal: int) -> int:
    """The stream a launch with no stream argument goes to: the owning framework's current one, else
    CU_STREAM_PER_THREAD. owner: the tensors' framework ("torch", "cupy", "" when none); ordinal: their device."""
    if owner == "torch":
        torch = sys.modules.get("torch")
        if torch is not None:
            return _torch_current(torch, ordinal)
    elif owner == "cupy":
        cupy = sys.modules.get("cupy")
        if cupy is not None:
            return _checked(_cupy_current(cupy, ordinal), "cupy.cuda.get_current_stream")
    return CU_STREAM_PER_THREAD


def resolve_stream(stream, owner: str = "", ordinal: int = 0) -> int:
    """stream_handle(stream), or default_stream(owner, ordinal) when stream is None."""
    if stream is None:
        return default_stream(owner, ordinal)
    return stream_handle(stream)


__all__ = ["CU_STREAM_LEGACY", "CU_STREAM_PER_THREAD", "default_stream", "resolve_stream", "stream_handle"]
