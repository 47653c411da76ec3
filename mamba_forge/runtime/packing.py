"""Pack a checked launch's parameters in one buffer with one precompiled struct: the fast twin of
mamba_forge.gpu.driver.PackedParams (same result: a void*[] whose entries point at each value's bytes, every
value 16-byte aligned, blobs of 64 bytes or more 64-byte aligned), for the per-launch path.

PackedParams allocates a ctypes buffer and runs struct.pack per value; here the layout is computed once per
symbol (ParamPacker), and each launch is one allocation and one ``Struct.pack_into`` writing the values and the
pointer array together. ``Packed.address`` is what cuLaunchKernel's kernelParams takes (driver.launch reads only
``.address``). Standard library only.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence

_CODES = {"ptr": "Q", "i32": "i", "u32": "I", "i64": "q", "u64": "Q", "f32": "f", "f64": "d"}
_BASE_ALIGN = 64  # the buffer's start is rounded up to this: every slot alignment divides it


class Packed:
    """One launch's parameter buffer; keep it referenced until the launch is enqueued."""

    __slots__ = ("_buf", "address", "layout")

    def __init__(self, buf, address: int, layout: ParamPacker):
        self._buf, self.address, self.layout = buf, address, layout  # layout: the types and sizes, for readers


class ParamPacker:
    """The layout for one parameter list: types (ptr, i32, ..., "bytes") and each blob's size (0 otherwise)."""

    def __init__(self, types: Sequence[str], blob_sizes: Sequence[int]):
        fmt, at, slots = "<", 0, []
        for t, size in zip(types, blob_sizes, strict=True):
            if t == "bytes":
                code, width, align = f"{size}s", size, 64 if size >= 64 else 16
            else:
                code, align = _CODES[t], 16
                width = struct.calcsize("<" + code)
            pad = -at % align
            fmt += f"{pad}x{code}" if pad else code
            at += pad
            slots.append(at)
            at += width
        pad = -at % 8
        self._array_at = at + pad
        fmt += (f"{pad}x" if pad else "") + "Q" * len(slots)
        self._struct = struct.Struct(fmt)
        self._size = self._struct.size + _BASE_ALIGN
        self._slots = tuple(slots)
        self.types = tuple(types)
        self.sizes = tuple(size if t == "bytes" else struct.calcsize("<" + _CODES[t]) for t, size in
                           zip(types, blob_sizes, strict=True))

    def pack(self, values: Sequence[tuple[str, object]]) -> Packed:
        """values: (type, value) per parameter as Contract.bind / args.typed_params return them (already checked)."""
        buf = ctypes.create_string_buffer(self._size)
        base = ctypes.addressof(buf)
        shift = -base % _BASE_ALIGN
        start = base + shift
        self._struct.pack_into(buf, shift, *[v for _, v in values], *[start + s for s in self._slots])
        return Packed(buf, start + self._array_at, self)


__all__ = ["Packed", "ParamPacker"]
