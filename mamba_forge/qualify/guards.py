"""Guards around every buffer the qualifier allocates, checked on the device after each launch.

Each buffer gets a guard region before and after it (GUARD_BYTES each, the user pointer stays 256-byte aligned)
filled with the CANARY byte; each `in` buffer gets a pristine device copy. After a launch, one small kernel
(mf_guard_check) compares every guard with the canary and every input with its copy, and one copy of
24 bytes per region tells the host the first and last differing byte and their count:

    a guard changed  -> check "bounds"         ("wrote 16384 bytes past the end of y at +0..+16383")
    an input changed -> check "input-written"  (the buffer and its first differing element)

Reads of never-written memory are found by running a launch twice with outputs and scratch poisoned with two
byte patterns (POISON, POISON_ALT) and comparing the outputs bit for bit (:func:`poison_difference`).
Under compute-sanitizer (which knows each allocation's exact bounds) the guards are off.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from mamba_forge.core.vocab import DTYPE_SIZES
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import spec as S
from mamba_forge.qualify.helper_kernels import compile_helper

GUARD_BYTES = 64 << 10  # per side: a multiple of 256, so the user pointer keeps the allocation's alignment
CANARY = 0xA5  # guard bytes; neither poison pattern, nor zero, nor a small float
POISON = 0xFF  # outputs and scratch before a launch: NaN for floats, all ones for integers
POISON_ALT = 0x3F  # the second run's poison: ~0.75 for f32/bf16, ~1.8 for f16, so min/max/+= reads all show
REGION = struct.Struct("<QQQII")  # ptr, expect (0: compare with the canary byte), nbytes, canary, pad
CHECK_SOURCE = r"""
// The qualifier's guard check: per region (blockIdx.y), the first and last byte that differs from the expected
// bytes (a pristine copy, or the canary byte when there is none) and how many differ. Each thread keeps its own
// tally and adds it once, so a fully overwritten region costs three atomics per thread, not per byte.
struct MfGuardRegion { unsigned long long ptr, expect, nbytes; unsigned int canary, pad; };

__device__ __forceinline__ unsigned char mf_want(const unsigned char* e, unsigned char c, unsigned long long k) {
  return e ? e[k] : c;
}

__device__ __forceinline__ void mf_note(unsigned long long k, unsigned long long& first, unsigned long long& last,
                                        unsigned long long& count) {
  first = k < first ? k : first;
  last = k > last ? k : last;
  ++count;
}

extern "C" __global__ void __launch_bounds__(256) mf_guard_check(const MfGuardRegion* regions,
                                                                 unsigned long long* found, int nregions) {
  const MfGuardRegion r = regions[blockIdx.y];
  const unsigned char* p = reinterpret_cast<const unsigned char*>(r.ptr);
  const unsigned char* e = reinterpret_cast<const unsigned char*>(r.expect);
  const unsigned char c = (unsigned char)r.canary;
  const unsigned long long n = r.nbytes;
  const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long first = ~0ull, last = 0, count = 0;
  // the unaligned head and tail byte by byte; the 16-byte aligned body as uint4 (expect is aligned like ptr)
  unsigned long long head = (16 - (r.ptr & 15)) & 15;
  if (head > n) head = n;
  const unsigned long long words = (n - head) / 16, tail = head + words * 16;
  for (unsigned long long i = tid; i < head + (n - tail); i += stride) {
    const unsigned long long k = i < head ? i : tail + (i - head);
    if (p[k] != mf_want(e, c, k)) mf_note(k, first, last, count);
  }
  const unsigned int cw = 0x01010101u * c;
  const uint4* pw = reinterpret_cast<const uint4*>(p + head);
  const uint4* ew = e ? reinterpret_cast<const uint4*>(e + head) : nullptr;
  for (unsigned long long w = tid; w < words; w += stride) {
    const uint4 a = pw[w];
    uint4 b;
    if (ew) b = ew[w]; else b.x = b.y = b.z = b.w = cw;
    if (a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w) {
      for (int j = 0; j < 16; ++j) {
        const unsigned long long k = head + w * 16 + j;
        if (p[k] != mf_want(e, c, k)) mf_note(k, first, last, count);
      }
    }
  }
  if (count) {
    atomicMin(&found[blockIdx.y], first);
    atomicMax(&found[nregions + blockIdx.y], last);
    atomicAdd(&found[2 * nregions + blockIdx.y], count);
  }
}
"""
CHECK_THREADS = 256
MAX_CHECK_BLOCKS = 1024  # per region (grid x); larger regions are walked grid-stride


class GuardViolation(Exception):
    """A launch wrote outside a buffer or into an input; `check` is the verdict's check name."""

    def __init__(self, check: str, reason: str):
        self.check, self.reason = check, reason
        super().__init__(reason)


def guard_function(ctx) -> cu.Function:
    """The compiled mf_guard_check for the context's device (compiled once per worker)."""
    if getattr(ctx, "_guard_fn", None) is None:
        ctx._guard_module, ctx._guard_fn = compile_helper(ctx.info.cc, CHECK_SOURCE, "mamba_forge_qualify_guards.cu",
                                                          "mf_guard_check", "guard-check kernel")
    return ctx._guard_fn


@dataclass
class Region:
    buffer: str
    kind: str  # before|after|input
    ptr: int
    nbytes: int
    expect: int = 0  # pristine copy (inputs); 0: the canary
    itemsize: int = 1


def describe(region: Region, first: int, last: int, count: int) -> tuple[str, str]:
    """(check, reason) for a region whose bytes first..last (offsets inside the region) differ, count of them."""
    name = region.buffer
    if region.kind == "after":
        return "bounds", f"wrote {count} bytes past the end of {name} at +{first}..+{last}"
    if region.kind == "before":
        n = region.nbytes
        return "bounds", f"wrote {count} bytes before the start of {name} at -{n - first}..-{n - last}"
    return "input-written", (f"the input {name} was written: {count} bytes differ from the uploaded contents, "
                             f"first in element {first // region.itemsize} (byte {first})")


@dataclass
class Guards:
    """The regions of one instance and the device buffers of their check."""

    ctx: object
    regions: list[Region] = field(default_factory=list)
    _table: cu.DeviceBuffer | None = None
    _found: cu.DeviceBuffer | None = None
    launches: int = 0  # how many checks ran (reported when the symbol passes)

    def guard(self, name: str, base: int, ptr: int, nbytes: int, after: int) -> None:
        """Guards of one buffer: [base, ptr) before it and [ptr + nbytes, ptr + nbytes + after) after it."""
        self.regions.append(Region(name, "before", base, ptr - base))
        self.regions.append(Region(name, "after", ptr + nbytes, after))

    def input(self, name: str, ptr: int, pristine: int, nbytes: int, itemsize: int) -> None:
        assert (ptr - pristine) % 16 == 0, "an input and its pristine copy must share their 16-byte alignment"
        self.regions.append(Region(name, "input", ptr, nbytes, pristine, itemsize))

    def copy_input(self, name: str, ptr: int, nbytes: int, itemsize: int) -> cu.DeviceBuffer:
        """A pristine device copy of an uploaded `in` buffer, compared after every launch; the caller frees it."""
        pb = cu.DeviceBuffer(nbytes)
        cu.memcpy_dtod(pb.ptr, ptr, nbytes)  # after the upload on the same (legacy) stream
        self.input(name, ptr, pb.ptr, nbytes, itemsize)
        return pb

    def upload(self) -> list[cu.DeviceBuffer]:
        """Write the region table to the device; returns the buffers the instance must free."""
        table = b"".join(REGION.pack(r.ptr, r.expect, r.nbytes, CANARY, 0) for r in self.regions)
        self._table = cu.DeviceBuffer(max(1, len(table)))
        cu.memcpy_htod(self._table.ptr, table)
        self._found = cu.DeviceBuffer(24 * max(1, len(self.regions)))
        return [self._table, self._found]

    def verify(self, stream: cu.Stream) -> None:
        """Check every region after the launches enqueued on `stream`; raises GuardViolation on the first bad one.
        Cost: 2 memsets, 1 launch reading the guards and twice the input bytes on the device, 1 sync and a
        copy of 24 bytes per region to the host."""
        if not self.regions:
            return
        assert self._table is not None and self._found is not None
        n = len(self.regions)
        cu.memset_d8(self._found.ptr, 0xFF, 8 * n, stream)  # first: all ones, so atomicMin takes the smallest
        cu.memset_d8(self._found.ptr + 8 * n, 0, 16 * n, stream)  # last, count
        biggest = max(r.nbytes for r in self.regions)
        gx = max(1, min(MAX_CHECK_BLOCKS, -(-biggest // (16 * CHECK_THREADS))))
        params = cu.PackedParams([("ptr", self._table.ptr), ("ptr", self._found.ptr), ("i32", n)])
        cu.launch(guard_function(self.ctx), (gx, n), (CHECK_THREADS,), params, stream=stream)
        self.ctx.wait(stream)
        self.launches += 1
        found = np.frombuffer(cu.memcpy_dtoh(self._found.ptr, 24 * n), dtype="<u8").reshape(3, n)
        for i, r in enumerate(self.regions):
            count = int(found[2, i])
            if count:
                check, reason = describe(r, int(found[0, i]), int(found[1, i]), count)
                raise GuardViolation(check, reason)


def summary(checked: list[Guards]) -> dict[str, str]:
    """Details of the passing records (check name -> what was verified) over a symbol's instances."""
    launches = sum(g.launches for g in checked)
    regions = [r for g in checked for r in g.regions]
    guarded = sorted({r.buffer for r in regions if r.kind != "input"})
    inputs = sorted({r.buffer for r in regions if r.kind == "input"})
    return {
        "bounds": f"{len(guarded)} buffers inside {GUARD_BYTES}-byte guards, intact after {launches} checks",
        "input-written": f"{len(inputs)} inputs unchanged after {launches} checks",
    }


def _is_pattern(raw: bytes, itemsize: int, byte: int) -> np.ndarray:
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, itemsize)
    return np.all(b == byte, axis=1)


def poison_difference(spec: S.LaunchSpec, first: dict[str, bytes], second: dict[str, bytes]) -> str:
    """'' when the outputs of a run poisoned with POISON and one poisoned with POISON_ALT agree bit for bit;
    else a sentence naming the output and its first differing element. Elements left unwritten by both runs
    (still each run's poison) are not differences: check_outputs decides whether they may stay unwritten."""
    for b in spec.outputs:
        size = DTYPE_SIZES[b.dtype]
        x, y = first[b.name], second[b.name]
        xa = np.frombuffer(x, np.uint8).reshape(-1, size)
        ya = np.frombuffer(y, np.uint8).reshape(-1, size)
        differ = np.any(xa != ya, axis=1) & ~(_is_pattern(x, size, POISON) & _is_pattern(y, size, POISON_ALT))
        if differ.any():
            i = int(np.argmax(differ))
            a, c = (plain(S.from_bytes(v, b.dtype)[i]) for v in (x, y))
            return (f"{b.name}: {int(differ.sum())} of {b.count} elements depend on the poison of memory the kernel "
                    f"never wrote; first at {i}: {a} with 0x{POISON:02X} bytes, {c} with 0x{POISON_ALT:02X} bytes")
    return ""


def plain(v) -> str:
    """A number as plain text ('0.5', 'nan', '-inf', '3'), never 'np.float64(0.5)'."""
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    return repr(float(v))


__all__ = ["CANARY", "GUARD_BYTES", "POISON", "POISON_ALT", "GuardViolation", "Guards", "Region", "describe",
           "guard_function", "plain", "poison_difference", "summary"]
