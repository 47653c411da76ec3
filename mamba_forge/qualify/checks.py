"""The qualification checks: live admission (attributes, dynamic smem, occupancy, ABI census), correctness
against the float64 reference over the corpora, and determinism under perturbation (repeat, batch, another
stream, a noisy neighbour, another address, graph replay). The comparison helpers are pure NumPy (CPU-tested) and
live in qualify/outputs.py, re-exported here; the launch machinery uses :mod:`mamba_forge.gpu.driver`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mamba_forge.catalog.model import Family, Symbol
from mamba_forge.core.vocab import DTYPE_SIZES
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import guards as G
from mamba_forge.qualify import pdl as PDL
from mamba_forge.qualify import spec as S
from mamba_forge.qualify.budget import LaunchBudget, seconds_text
from mamba_forge.qualify.events import LiveResources
from mamba_forge.qualify.guards import POISON, plain
from mamba_forge.qualify.helper_kernels import compile_helper
from mamba_forge.qualify.outputs import (  # the pure NumPy half, re-exported: outputs.py
    check_outputs,
    compare,
    digest,
    first_difference,
    load_callable,
    make_inputs,
    reference_outputs,
    unwritten_mask,
)
from mamba_forge.runtime.errors import LaunchRefused

NEIGHBOUR_SOURCE = r"""
// The qualifier's noisy neighbour: streams a large buffer through an FMA chain, occupying memory bandwidth
// and ALUs on a second stream while the symbol under test runs.
extern "C" __global__ void __launch_bounds__(256) mf_noisy_neighbour(float* buf, long long n, int iters) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (int it = 0; it < iters; ++it) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
      float v = buf[i];
#pragma unroll 8
      for (int k = 0; k < 32; ++k) v = fmaf(v, 0.9990234375f, 0.0009765625f);
      buf[i] = v;
    }
  }
}
"""
NEIGHBOUR_FLOATS = 64 << 20  # 256 MiB: larger than L2, so it competes for HBM bandwidth
NEIGHBOUR_ITERS = 12


class Hang(Exception):
    """A launch did not finish within its time limit (`budget` says what the limit was and where it came from)."""

    def __init__(self, seconds: float, budget: str = ""):
        self.seconds, self.budget = seconds, budget
        super().__init__(f"timed out after {seconds_text(seconds)} s" + (f" ({budget})" if budget else ""))


# ---- device side ----------------------------------------------------------------------------------------


@dataclass
class Context:
    """What a worker holds for the whole run on one device."""

    device: cu.Device
    info: cu.DeviceInfo
    timeout_s: float | None = 20.0  # a fixed budget per launch (--timeout); None: scaled per symbol (budget.py)
    guards: bool = True  # guard regions and input copies (off under compute-sanitizer, which checks bounds itself)
    stream: cu.Stream | None = None
    other: cu.Stream | None = None
    neighbour_fn: cu.Function | None = None
    neighbour_buf: cu.DeviceBuffer | None = None
    _neighbour_module: cu.Module | None = field(default=None, repr=False)
    budget: LaunchBudget = field(default_factory=LaunchBudget)  # the symbol in flight's (worker.SymbolRun sets it)
    placer: object | None = None  # placement.DevicePlacer, made on first use (the CPU tests put an emulation here)

    def __post_init__(self) -> None:
        self.budget = LaunchBudget(fixed_s=self.timeout_s, source="--timeout")

    def open(self) -> None:
        self.device.make_current()
        self.stream = cu.Stream()
        self.other = cu.Stream()

    def wait(self, stream: cu.Stream, timeout_s: float | None = None) -> None:
        """Synchronize with a deadline: poll, so a hanging kernel becomes a Hang instead of a stuck worker. Without
        an explicit `timeout_s` the deadline is the symbol's launch budget, and the first wait measures the launch
        that scales it (budget.py)."""
        limit = timeout_s or self.budget.limit
        t0 = time.monotonic()
        pause = 20e-6
        while not stream.query_done():
            if time.monotonic() - t0 > limit:
                raise Hang(limit, "" if timeout_s else self.budget.describe())
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)
        if not timeout_s:
            self.budget.observe(time.monotonic() - t0)

    def neighbour(self) -> tuple[cu.Function, cu.DeviceBuffer]:
        if self.neighbour_fn is None:
            self._neighbour_module, self.neighbour_fn = compile_helper(
                self.info.cc, NEIGHBOUR_SOURCE, "mamba_forge_qualify_neighbour.cu", "mf_noisy_neighbour",
                "noisy-neighbour kernel")
            self.neighbour_buf = cu.DeviceBuffer(NEIGHBOUR_FLOATS * 4)
            cu.memset_d8(self.neighbour_buf.ptr, 0, NEIGHBOUR_FLOATS * 4)
            cu.context_synchronize()
        assert self.neighbour_buf is not None
        return self.neighbour_fn, self.neighbour_buf

    def launch_neighbour(self, stream: cu.Stream) -> None:
        fn, buf = self.neighbour()
        params = cu.PackedParams([("ptr", buf.ptr), ("i64", NEIGHBOUR_FLOATS), ("i32", NEIGHBOUR_ITERS)])
        cu.launch(fn, (self.info.sm_count * 8,), (256,), params, stream=stream)


IN_PLACE = "in-place"  # the check of the catalog's in_place_of pairs (symbol_run.SymbolRun.in_place)


class Instance:
    """Device buffers for one concrete launch, with pristine copies of inputs that the kernel overwrites, and
    (unless ctx.guards is off) guard regions around every buffer and pristine copies of the `in` buffers,
    checked after every launch (guards.py).

    `offset` shifts every buffer's start by that many bytes (a multiple of 256) for the address check. `alias`
    (output -> input, the catalog's in_place_of pairs; no guards then): each such output is its input's buffer, and
    that input is restored from a pristine copy before every launch instead of the output's poison."""

    def __init__(self, ctx: Context, spec: S.LaunchSpec, fn: cu.Function, inputs: dict[str, np.ndarray],
                 prepare: Callable | None = None, offset: int = 0, alias: dict[str, str] | None = None):
        self.ctx, self.spec, self.fn = ctx, spec, fn
        self.alias = dict(alias or {})
        self._owned: list[cu.DeviceBuffer] = []
        self.ptrs: dict[str, int] = {}
        self.pristine: dict[str, int] = {}
        self.prepared_bytes: dict[str, bytes] = {}  # what prepare built for this instance's addresses
        self.graph: cu.Graph | None = None
        guarded = ctx.guards and not self.alias  # an in-place launch writes its input by design: no guards
        self.guards = G.Guards(ctx) if guarded else None
        guard = G.GUARD_BYTES if guarded else 0
        try:
            written = set(self.alias.values())
            for b in spec.all_buffers:
                if b.name in self.alias:  # the input's buffer (set below, after every buffer exists)
                    continue
                buf = cu.DeviceBuffer(offset + guard + b.nbytes + guard)
                self._owned.append(buf)
                ptr = buf.ptr + offset + guard
                self.ptrs[b.name] = ptr
                if self.guards is not None:
                    cu.memset_d8(buf.ptr, G.CANARY, buf.nbytes)  # the buffer's own bytes are written below
                    self.guards.guard(b.name, buf.ptr, ptr, b.nbytes, guard)
                if b.needs_fill:
                    data = np.ascontiguousarray(inputs[b.name]).tobytes()
                    if b.role == "in" and b.name not in written:
                        cu.memcpy_htod(ptr, data)
                        if self.guards is not None:  # compared after every launch, never copied back
                            self._owned.append(self.guards.copy_input(b.name, ptr, b.nbytes, DTYPE_SIZES[b.dtype]))
                    else:  # restored before every launch
                        pb = cu.DeviceBuffer(b.nbytes)
                        self._owned.append(pb)
                        cu.memcpy_htod(pb.ptr, data)
                        self.pristine[b.name] = pb.ptr
            sizes = {b.name: b.nbytes for b in spec.all_buffers}
            for out, src in self.alias.items():
                if src not in self.ptrs or sizes.get(out) != sizes[src]:
                    raise S.SpecError(f"{out} in place of {src}: no input {src!r} of {sizes.get(out)} bytes")
                self.ptrs[out] = self.ptrs[src]
            blobs: dict[str, bytes] = {}
            if spec.blobs or spec.prepared:
                assert prepare is not None
                # dims plus the instance's numeric params and sizeof_<key> (a superset of the dims)
                blobs = prepare(dict(self.ptrs), {s.name: s.value for s in spec.scalars}, dict(spec.env))
            for b in spec.prepared:
                if b.name not in blobs:
                    raise S.SpecError(f"prepare returned nothing for the prepared pointer param {b.name!r}")
                data = bytes(blobs[b.name])
                if len(data) != b.nbytes:
                    raise S.SpecError(f"prepare returned {len(data)} bytes for {b.name!r}, its buffer holds {b.nbytes}")
                # kept on the device and copied in on the launch stream before every launch (graph replay too)
                pb = cu.DeviceBuffer(b.nbytes)
                self._owned.append(pb)
                cu.memcpy_htod(pb.ptr, data)
                self.pristine[b.name] = pb.ptr
                self.prepared_bytes[b.name] = data
                if self.guards is not None:  # an input too: the kernel must not write it
                    self.guards.input(b.name, self.ptrs[b.name], pb.ptr, b.nbytes, DTYPE_SIZES[b.dtype])
            if self.guards is not None:
                self._owned += self.guards.upload()
            for bl in spec.blobs:
                if bl.name not in blobs:
                    raise S.SpecError(f"prepare returned nothing for the by-value param {bl.name!r}")
            try:  # the runtime contract packs it (kernel params only: aux buffers are reached through a table)
                bound = spec.bind({b.name: self.ptrs[b.name] for b in spec.buffers}, blobs)
            except LaunchRefused as exc:
                raise S.SpecError(f"{spec.symbol}: {exc}") from None
            self.params = cu.PackedParams(bound.values, bound.aligns)
            # host-to-device copies from pageable memory may still be in flight on the legacy stream, which the
            # non-blocking streams the launches use do not wait for
            cu.context_synchronize()
        except BaseException:
            self.free()
            raise

    def enqueue(self, stream: cu.Stream, poison: int = POISON, smem: int | None = None) -> None:
        """Reset outputs and scratch (poison) and overwritten inputs (pristine copy), then launch: all on `stream`.
        `smem`: dynamic shared memory bytes instead of the declared (the placement check's lower residency)."""
        for b in self.spec.all_buffers:
            if b.name in self.pristine:
                cu.memcpy_dtod(self.ptrs[b.name], self.pristine[b.name], b.nbytes, stream)
            elif not b.needs_fill and b.name not in self.alias:
                cu.memset_d8(self.ptrs[b.name], poison, b.nbytes, stream)
        # as the runtime launches it (pdl.applies): a small grid of a pdl_max_blocks symbol with programmatic
        # dependent launch on sm_90+ (only then the keyword: fakes take none)
        kw = {"pdl": True} if PDL.applies(self.spec, self.ctx.info) else {}
        cu.launch(self.fn, self.spec.grid, self.spec.block, self.params,
                  smem=self.spec.dynamic_smem if smem is None else smem, stream=stream, **kw)

    def run(self, stream: cu.Stream | None = None, poison: int = POISON, smem: int | None = None) -> dict[str, bytes]:
        st = stream or self.ctx.stream
        assert st is not None
        self.enqueue(st, poison, smem)
        self.ctx.wait(st)
        self.verify(st)
        return self.outputs()

    def verify(self, stream: cu.Stream | None = None) -> None:
        """After the launches on `stream` finished: raises guards.GuardViolation when one wrote outside a buffer
        or into an input (a no-op without guards)."""
        if self.guards is not None:
            self.guards.verify(stream or self.ctx.stream)

    def outputs(self) -> dict[str, bytes]:
        return {b.name: cu.memcpy_dtoh(self.ptrs[b.name], b.nbytes) for b in self.spec.outputs}

    def free(self) -> None:
        if self.graph is not None:
            self.graph.destroy()
            self.graph = None
        for buf in self._owned:
            buf.free()
        self._owned = []


# ---- live admission -------------------------------------------------------------------------------------


@dataclass
class Admission:
    ok: bool
    check: str = ""
    reason: str = ""
    resources: LiveResources | None = None
    layout: list[list[int]] = field(default_factory=list)
    layout_source: str = ""


def census(actual: list[tuple[int, int]], expected: list[tuple[int, int]], names: list[str]) -> str:
    """'' when the ABI matches; else one sentence naming the first differing parameter."""
    if len(actual) != len(expected):
        return f"the kernel takes {len(actual)} parameters, the catalog declares {len(expected)}"
    for i, ((ao, asz), (eo, esz)) in enumerate(zip(actual, expected, strict=True)):
        if (ao, asz) != (eo, esz):
            return (f"parameter {i} ({names[i]}) is at offset {ao} with {asz} bytes, "
                    f"the catalog declares offset {eo} with {esz} bytes")
    return ""


def live_admit(ctx: Context, fn: cu.Function, sym: Symbol, fam: Family, build_layout: list[list[int]] | None) -> Admission:
    who = f"{sym.name} on {ctx.info.name}"
    attrs = fn.attributes()
    threads = sym.threads
    res = LiveResources(registers=attrs.registers, static_smem=attrs.static_smem, local_bytes=attrs.local_bytes,
                        max_threads=attrs.max_threads)

    def no(check: str, reason: str) -> Admission:
        return Admission(False, check, f"{who}: {reason}", res)

    if threads > attrs.max_threads:
        return no("block", f"block of {threads} threads > MAX_THREADS_PER_BLOCK {attrs.max_threads}")
    if attrs.registers > sym.policy.max_regs:
        return no("registers", f"{attrs.registers} registers per thread > cap {sym.policy.max_regs}")
    if attrs.local_bytes > sym.policy.max_stack:
        return no("stack", f"{attrs.local_bytes} bytes of local memory per thread > allowed {sym.policy.max_stack}")
    if attrs.static_smem + sym.dynamic_smem > ctx.info.optin_smem:
        return no("smem", f"{attrs.static_smem} static + {sym.dynamic_smem} dynamic bytes of shared memory "
                          f"> the device's opt-in limit {ctx.info.optin_smem}")
    if sym.dynamic_smem > 0:
        try:
            fn.set_max_dynamic_smem(sym.dynamic_smem)
        except cu.CudaError as exc:
            return no("smem", f"the driver refuses {sym.dynamic_smem} bytes of dynamic shared memory ({exc.result})")
    occ = fn.occupancy(threads, sym.dynamic_smem)
    res.blocks_per_sm = occ
    if occ < max(1, sym.policy.min_blocks_per_sm):
        return no("occupancy", f"{occ} resident blocks per SM at {threads} threads and {sym.dynamic_smem} bytes "
                               f"dynamic shared memory < required {max(1, sym.policy.min_blocks_per_sm)}")
    layout = fn.param_layout()
    source = "cuFuncGetParamInfo"
    if layout is None:
        layout = [tuple(x) for x in (build_layout or [])]  # type: ignore[misc]
        source = "cubin parameter info"
    expected = S.expected_abi(list(fam.params), S.param_bank_base(ctx.info.cc))
    problem = census(list(layout), expected, [p.name for p in fam.params])
    adm = Admission(True, resources=res, layout=[list(x) for x in layout], layout_source=source)
    if problem:
        return Admission(False, "abi", f"{who}: ABI census ({source}): {problem}", res, adm.layout, source)
    return adm



__all__ = [
    "POISON", "Admission", "Context", "Hang", "Instance", "census", "check_outputs", "compare", "digest",
    "first_difference", "live_admit", "load_callable", "make_inputs", "plain", "reference_outputs", "unwritten_mask",
]
