"""The one launch path: kernel parameters packed as the driver reads them, and cuLaunchKernel.

Every caller (the qualifier, the runtime backend, the GPU tests and benchmarks) packs its arguments into a
:class:`PackedParams` and calls :func:`launch`. By-value blobs (a CUtensorMap, a descriptor struct) are
``("bytes", data)`` entries with their own alignment.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mamba_forge.gpu.core import bindings, check

if TYPE_CHECKING:
    from mamba_forge.gpu.driver import Function, Stream

# scalar type -> struct format (little-endian), for packing by-value parameters
PACK_FORMATS = {"ptr": "<Q", "i32": "<i", "u32": "<I", "i64": "<q", "u64": "<Q", "f32": "<f", "f64": "<d"}
DEFAULT_ALIGN = 16  # every scalar and, unless told otherwise, every blob


class PackedParams:
    """Kernel parameters as the driver wants them: a void*[] whose entries point at each value's bytes.

    `values` are (type, value) pairs: a type of PACK_FORMATS with an int or float, or ("bytes", data) for a
    by-value blob. Each value lives in its own buffer aligned to 16 bytes; `blob_align[i]` (0 = 16) raises a
    blob's alignment (a CUtensorMap wants 64: its buffer is over-allocated and offset). Keep the object alive
    until the launch is enqueued (a graph capture copies the values when it records the node).
    """

    def __init__(self, values: Sequence[tuple[str, object]], blob_align: Sequence[int] | None = None):
        if blob_align is not None and len(blob_align) != len(values):
            raise ValueError(f"{len(blob_align)} alignments for {len(values)} parameters")
        self._bufs = []
        n = len(values)
        self._array = (ctypes.c_void_p * max(1, n))()
        for i, (typ, val) in enumerate(values):
            if typ == "bytes":
                if not isinstance(val, (bytes, bytearray, memoryview)):
                    raise TypeError(f"parameter {i}: a bytes parameter takes bytes, not {type(val).__name__}")
                data = bytes(val)
                align = (blob_align[i] if blob_align else 0) or DEFAULT_ALIGN
                if align & (align - 1):
                    raise ValueError(f"parameter {i}: alignment {align} is not a power of two")
            elif typ in PACK_FORMATS:
                try:
                    data = struct.pack(PACK_FORMATS[typ], val)
                except struct.error as exc:
                    raise ValueError(f"parameter {i}: {val!r} does not fit {typ} ({exc})") from None
                align = DEFAULT_ALIGN
            else:
                known = ", ".join([*PACK_FORMATS, "bytes"])
                raise ValueError(f"parameter {i}: unknown type {typ!r} (known: {known})")
            raw = ctypes.create_string_buffer(len(data) + align)
            base = ctypes.addressof(raw)
            at = (base + align - 1) // align * align
            ctypes.memmove(at, data, len(data))
            self._bufs.append(raw)
            self._array[i] = at

    def __len__(self) -> int:
        return len(self._bufs)

    @property
    def address(self) -> int:
        """The void** kernelParams argument of cuLaunchKernel."""
        return ctypes.addressof(self._array)


def _dims3(v: Sequence[int], what: str) -> list[int]:
    dims = list(v)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {v!r}")
    return dims + [1] * (3 - len(dims))


def launch(
    fn: Function,
    grid: Sequence[int],
    block: Sequence[int],
    params: PackedParams,
    *,
    smem: int = 0,
    stream: Stream | None = None,
) -> None:
    """cuLaunchKernel on `stream` (None: the legacy default stream) with `smem` bytes of dynamic shared memory.

    Above 48 KB the function must have been allowed that much first (Function.set_max_dynamic_smem).
    """
    g, b = _dims3(grid, "grid"), _dims3(block, "block")
    d = bindings()
    h = stream.handle if stream is not None else d.CUstream(0)
    check(
        f"cuLaunchKernel({fn.name})",
        d.cuLaunchKernel(fn.handle, g[0], g[1], g[2], b[0], b[1], b[2], smem, h, params.address, 0),
    )
