"""The qualifier's programmatic-dependent-launch check: a symbol whose record allows PDL (`pdl_max_blocks`, on sm_90+,
at a grid within it) is launched with PDL right after a kernel that lets it start at once and writes every one of its
inputs only after a spin of tens of microseconds. A kernel that waits (mf::pdl_wait) before its first global access
reads the inputs the writer left and gives the first run's bits; one that reads before it reads the poison the
inputs held meanwhile, and is rejected (check `pdl`). The build's static check (build/records.py `pdl-wait`) only
proves that a wait exists somewhere in the kernel; this one proves that it comes before the reads.
"""

from __future__ import annotations

import struct

from mamba_forge.core.vocab import PDL_MIN_CC
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import guards as G
from mamba_forge.qualify.helper_kernels import compile_helper

CHECK = "pdl"
SPIN_CYCLES = 60_000  # ~30 us at the H200's clock: far longer than a launch takes to reach a kernel's first load
WRITER_THREADS = 256

WRITER_SOURCE = r"""
struct MfRegion { unsigned long long dst, src, n; };
// Lets the next grid launch at once, spins, then copies every region (dst <- src, bytes, a grid-stride loop).
extern "C" __global__ void mf_pdl_late_writer(const MfRegion* __restrict__ regions, int count, long long spin) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const long long t0 = clock64();
  while (clock64() - t0 < spin) {
  }
  const unsigned long long tid = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  for (int r = 0; r < count; ++r) {
    unsigned char* d = (unsigned char*)regions[r].dst;
    const unsigned char* s = (const unsigned char*)regions[r].src;
    for (unsigned long long i = tid; i < regions[r].n; i += stride) d[i] = s[i];
  }
}
"""


def applies(spec, info) -> bool:
    """Whether the runtime would launch `spec` with PDL on this device (runtime/loader.pdl_blocks, Kernel._launch)."""
    cap = spec.contract.record.pdl_max_blocks
    g = spec.grid
    return bool(cap) and tuple(info.cc) >= PDL_MIN_CC and g[0] * g[1] * g[2] <= cap


def writer_function(ctx) -> cu.Function:
    """The compiled mf_pdl_late_writer for the context's device (compiled once per worker)."""
    if getattr(ctx, "_pdl_writer", None) is None:
        ctx._pdl_module, ctx._pdl_writer = compile_helper(ctx.info.cc, WRITER_SOURCE, "mamba_forge_qualify_pdl.cu",
                                                          "mf_pdl_late_writer", "PDL writer kernel")
    return ctx._pdl_writer


def run_after_late_writer(ctx, inst) -> dict[str, bytes]:
    """inst's outputs from one launch with PDL behind the late writer: outputs and scratch poisoned as enqueue does,
    every filled input poisoned too and restored by the writer (in buffers from a copy taken here, the others from
    their pristine copies)."""
    spec, stream = inst.spec, ctx.stream
    owned: list[cu.DeviceBuffer] = []
    try:
        regions = []
        for b in spec.all_buffers:
            ptr = inst.ptrs[b.name]
            if b.needs_fill:
                src = inst.pristine.get(b.name)
                if src is None:  # an `in` buffer, uploaded once: keep its bytes for the writer
                    keep = cu.DeviceBuffer(b.nbytes)
                    owned.append(keep)
                    cu.memcpy_dtod(keep.ptr, ptr, b.nbytes, stream)
                    src = keep.ptr
                regions.append((ptr, src, b.nbytes))
            cu.memset_d8(ptr, G.POISON, b.nbytes, stream)
        table = cu.DeviceBuffer(max(24 * len(regions), 24))
        owned.append(table)
        cu.memcpy_htod(table.ptr, b"".join(struct.pack("<QQQ", *r) for r in regions) or bytes(24))
        cu.context_synchronize()  # the table's host copy came from pageable memory (as Instance's uploads)
        params = cu.PackedParams([("ptr", table.ptr), ("i32", len(regions)), ("i64", SPIN_CYCLES)], [0, 0, 0])
        cu.launch(writer_function(ctx), (ctx.info.sm_count,), (WRITER_THREADS,), params, stream=stream)
        cu.launch(inst.fn, spec.grid, spec.block, inst.params, smem=spec.dynamic_smem, stream=stream, pdl=True)
        ctx.wait(stream)
        inst.verify(stream)
        return inst.outputs()
    finally:
        for buf in owned:
            buf.free()


__all__ = ["CHECK", "SPIN_CYCLES", "applies", "run_after_late_writer", "writer_function"]
