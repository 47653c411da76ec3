"""The one launch path: kernel parameters packed as the driver reads them, and cuLaunchKernel.

Every caller (the qualifier, the runtime backend, the GPU tests and benchmarks) packs its arguments through a
:class:`ParamPacker` (the runtime keeps one per symbol; :class:`PackedParams` makes one for its values) and calls
:func:`launch`. By-value blobs (a CUtensorMap, a descriptor struct) are
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


class Packed:
    """One launch's parameter buffer: the values and the void*[] pointing at them; keep it referenced until the
    launch is enqueued (a graph capture copies the values when it records the node)."""

    __slots__ = ("_buf", "_shift", "address", "layout")

    def __init__(self, buf, address: int, layout: ParamPacker, shift: int = 0):
        self._buf, self.address, self.layout = buf, address, layout  # address: cuLaunchKernel's kernelParams
        self._shift = shift  # where the values start in _buf


class ParamPacker:
    """The layout of one parameter list, computed once: each value in its slot, 16-byte aligned (a blob at its
    own alignment, `blob_aligns[i]`, 0 = 16), then the void*[] of slot addresses.

    pack() is a new buffer per call (its void*[] written once, with the buffer) and one ``Struct.pack_into`` of
    the values. The runtime's launches use fill()/release(): a buffer from this packer's small pool, refilled in
    place: cuLaunchKernel copies the parameters when it enqueues (a graph capture when it records the node), so
    once the launch call returned its buffer serves the next one. A pooled buffer is held by one caller at a time
    (list.pop/append), so threads launching the same kernel never share one."""

    POOL = 8  # pooled buffers kept per packer (one per thread launching it at the same moment)

    def __init__(self, types: Sequence[str], blob_sizes: Sequence[int], blob_aligns: Sequence[int] | None = None):
        aligns = list(blob_aligns) if blob_aligns is not None else [0] * len(types)
        if len(aligns) != len(types):
            raise ValueError(f"{len(aligns)} alignments for {len(types)} parameters")
        fmt, at, slots, widths, base = "<", 0, [], [], 64
        for i, (t, size, a) in enumerate(zip(types, blob_sizes, aligns, strict=True)):
            if t == "bytes":
                code, width, align = f"{size}s", size, a or DEFAULT_ALIGN
                if align & (align - 1):
                    raise ValueError(f"parameter {i}: alignment {align} is not a power of two")
            elif t in PACK_FORMATS:
                code, align = PACK_FORMATS[t][1], DEFAULT_ALIGN
                width = struct.calcsize(PACK_FORMATS[t])
            else:
                raise ValueError(f"parameter {i}: unknown type {t!r} (known: {', '.join([*PACK_FORMATS, 'bytes'])})")
            base = max(base, align)
            pad = -at % align
            fmt += f"{pad}x{code}" if pad else code
            slots.append(at + pad)
            widths.append(width)
            at += pad + width
        self._array_at = at + -at % 8
        self._values = struct.Struct(fmt)  # the values, at their slots
        self._array = struct.Struct("<" + "Q" * len(slots))  # the void*[], at _array_at
        self._buftype = ctypes.c_char * (self._array_at + self._array.size + base)
        self._base = base  # the buffer start is rounded up to this: every slot alignment divides it
        self._slots = tuple(slots)
        self._pool: list[Packed] = []
        self.types, self.sizes = tuple(types), tuple(widths)  # what each slot holds, for readers of a Packed

    def _new(self) -> Packed:
        buf = self._buftype()
        at = ctypes.addressof(buf)
        shift = -at % self._base
        start = at + shift
        self._array.pack_into(buf, shift + self._array_at, *[start + s for s in self._slots])
        return Packed(buf, start + self._array_at, self, shift)

    def pack(self, values: Sequence[tuple[str, object]]) -> Packed:
        """values: (type, value) per parameter, in this layout's order (blobs as bytes). A new buffer."""
        p = self._new()
        self._fill(p, [v for _, v in values])
        return p

    def fill(self, values: Sequence) -> Packed:
        """The plain values (no types), in this layout's order, in a pooled buffer: hand it back with release()
        once the launch call returned (an exception on the way loses nothing: the pool refills)."""
        pool = self._pool
        p = pool.pop() if pool else self._new()
        self._fill(p, values)
        return p

    def release(self, p: Packed) -> None:
        if len(self._pool) < self.POOL:
            self._pool.append(p)

    def _fill(self, p: Packed, values: Sequence) -> None:
        try:
            self._values.pack_into(p._buf, p._shift, *values)
        except struct.error:
            self._name_the_misfit(values)
            raise

    def _name_the_misfit(self, values: Sequence) -> None:
        for i, (t, v) in enumerate(zip(self.types, values, strict=False)):
            if t in PACK_FORMATS:
                try:
                    struct.pack(PACK_FORMATS[t], v)
                except struct.error as exc:
                    raise ValueError(f"parameter {i}: {v!r} does not fit {t} ({exc})") from None


class PackedParams:
    """Kernel parameters as the driver wants them, from (type, value) pairs: a type of PACK_FORMATS with an int or
    float, or ("bytes", data) for a by-value blob with `blob_align[i]` (0 = 16; a CUtensorMap wants 64). The
    general entry: it checks the values and packs them through a ParamPacker made for them."""

    def __init__(self, values: Sequence[tuple[str, object]], blob_align: Sequence[int] | None = None):
        if blob_align is not None and len(blob_align) != len(values):
            raise ValueError(f"{len(blob_align)} alignments for {len(values)} parameters")
        for i, (typ, val) in enumerate(values):
            if typ == "bytes" and not isinstance(val, (bytes, bytearray, memoryview)):
                raise TypeError(f"parameter {i}: a bytes parameter takes bytes, not {type(val).__name__}")
        values = [(t, bytes(v)) if t == "bytes" else (t, v) for t, v in values]
        packer = ParamPacker([t for t, _ in values], [len(v) if t == "bytes" else 0 for t, v in values], blob_align)
        self._packed = packer.pack(values)
        self._n = len(values)

    def __len__(self) -> int:
        return self._n

    @property
    def address(self) -> int:
        """The void** kernelParams argument of cuLaunchKernel."""
        return self._packed.address


def _dims3(v: Sequence[int], what: str) -> list[int]:
    dims = list(v)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {v!r}")
    return dims + [1] * (3 - len(dims))


_PDL_CONFIGS: dict = {}  # (grid, block, smem, stream) -> CUlaunchConfig with the PDL attribute (2.7 us to build)
PDL_CONFIG_ENTRIES = 256


def _pdl_config(d, g, b, smem: int, h):
    """The cuLaunchKernelEx configuration of a programmatic dependent launch (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
    SERIALIZATION): the grid may start launching before the grid before it on the stream has finished; the kernel
    waits for it (mf::pdl_wait) before its first global access. Built once per launch shape and stream."""
    key = (g, b, smem, int(h))
    cfg = _PDL_CONFIGS.get(key)
    if cfg is None:
        cfg = d.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = b
        cfg.sharedMemBytes = smem
        cfg.hStream = h
        attr = d.CUlaunchAttribute()
        attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        cfg.attrs = [attr]
        cfg.numAttrs = 1
        if len(_PDL_CONFIGS) >= PDL_CONFIG_ENTRIES:  # bounded: shapes and streams of a long run do not pile up
            _PDL_CONFIGS.clear()
        _PDL_CONFIGS[key] = cfg
    return cfg


def launch(
    fn: Function,
    grid: Sequence[int],
    block: Sequence[int],
    params: PackedParams | Packed,
    *,
    smem: int = 0,
    stream: Stream | None = None,
    pdl: bool = False,
) -> None:
    """cuLaunchKernel on `stream` (None: the legacy default stream) with `smem` bytes of dynamic shared memory;
    `pdl`: cuLaunchKernelEx with programmatic dependent launch (sm_90+; the kernel must call mf::pdl_wait before
    its first global access: the catalog's pdl_max_blocks, held to it by the build).

    Above 48 KB the function must have been allowed that much first (Function.set_max_dynamic_smem).
    """
    g = grid if type(grid) is tuple and len(grid) == 3 else _dims3(grid, "grid")  # the runtime passes 3-tuples
    b = block if type(block) is tuple and len(block) == 3 else _dims3(block, "block")
    d = bindings()
    h = stream.handle if stream is not None else d.CUstream(0)
    if pdl:
        ret = d.cuLaunchKernelEx(_pdl_config(d, tuple(g), tuple(b), smem, h), fn.handle, params.address, 0)
        if type(ret) is not tuple or len(ret) != 1 or ret[0] != d.CUresult.CUDA_SUCCESS:
            check(f"cuLaunchKernelEx({fn.name}, programmatic dependent launch)", ret)
        return
    ret = d.cuLaunchKernel(fn.handle, g[0], g[1], g[2], b[0], b[1], b[2], smem, h, params.address, 0)
    if type(ret) is not tuple or len(ret) != 1 or ret[0] != d.CUresult.CUDA_SUCCESS:
        check(f"cuLaunchKernel({fn.name})", ret)  # raises naming the function (the name is formatted only here)
