"""The placement check: a deterministic symbol's bits must not depend on which SMs its blocks run on.

The symbol's first-corpus instance runs again with its blocks placed differently, and its outputs must be bitwise
equal to the first run's:

  (a) in green contexts holding a subset of the SMs (two sizes, e.g. 16 and half the device; CUDA >= 12.4),
  (b) beside a blocker kernel on another stream that holds half the SMs (one block per SM through its shared
      memory) until the host releases it through a flag in mapped host memory,
  (c) with more dynamic shared memory than it asks for, so fewer of its blocks are resident per SM.

Where a green context cannot be had (older driver), (b) and (c) run and the check's detail says so. A symbol whose
build warned about placement-dependent special registers (build/admit.py) is run REPEATS_WARNED times per
placement. The driver-facing parts sit behind `DevicePlacer`, which the CPU tests replace with an emulation.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from mamba_forge.gpu import driver as cu
from mamba_forge.gpu import green
from mamba_forge.qualify.helper_kernels import compile_helper

GREEN_SM_COUNTS = (16, None)  # None: half the device's SMs
REPEATS_WARNED = 3  # runs per placement for a symbol that reads %smid, %clock... (the build's warning)
ARRIVAL_S = 5.0  # the blocker's blocks must all be resident by then (else: placed beside those that are)
HOLD_FACTOR = 10.0  # the blocker is released after this many first launches (at least HOLD_MIN_S) even if the
HOLD_MIN_S = 0.5  # symbol has not finished: one that needs every SM at once then finishes on them

BLOCKER_SOURCE = r"""
// The placement check's blocker: one block per SM (its dynamic shared memory fills the SM), each marks itself
// resident in mapped host memory, then thread 0 polls the host's release flag. No atomics on host memory.
extern "C" __global__ void __launch_bounds__(1024) mf_placement_blocker(const volatile int* release, volatile int* arrived) {
  extern __shared__ int hold[];
  if (threadIdx.x == 0) {
    hold[0] = blockIdx.x;
    arrived[blockIdx.x] = 1;
    __threadfence_system();
    while (release[0] == 0) __nanosleep(2000);
  }
  __syncthreads();
}
"""


class Unavailable(Exception):
    """A placement could not be set up here (a green launch refused, the blocker not built): skipped and noted,
    never the symbol's rejection."""


@dataclass
class Partition:
    """Somewhere to run the symbol other than the whole device: a stream plus what must be current to use it."""

    label: str
    stream: object
    enter: Callable[[], None] = lambda: None
    leave: Callable[[], None] = lambda: None


@dataclass
class Placement:
    label: str
    run: Callable[[], dict[str, bytes]]


@dataclass
class DevicePlacer:
    """Green partitions and the blocker on a real device (created on first use, kept for the worker's life)."""

    ctx: object  # checks.Context
    _parts: list[Partition] | None = None
    _note: str = ""
    _owned: list[green.GreenPartition] = field(default_factory=list)
    _blocker: cu.Function | None = None
    _module: cu.Module | None = None

    def partitions(self) -> tuple[list[Partition], str]:
        """The green partitions, and '' or why there are none (or fewer)."""
        if self._parts is None:
            self._parts, notes = [], []
            total = self.ctx.info.sm_count
            for want in GREEN_SM_COUNTS:
                n = want if want is not None else total // 2
                try:
                    gp = green.partition(self.ctx.device.handle, n)
                except green.GreenUnavailable as exc:
                    notes.append(f"no green context of {n} SMs ({exc})")
                    continue
                except Exception as exc:  # noqa: BLE001 - bindings that differ: a missing placement, not a verdict
                    notes.append(f"no green context of {n} SMs ({type(exc).__name__}: {exc})")
                    continue
                self._owned.append(gp)
                self._parts.append(Partition(f"in a green context of {gp.sm_count} of {total} SMs", gp.stream,
                                             gp.push, gp.pop))
            self._note = "; ".join(notes)
        return self._parts, self._note

    def blocker(self) -> cu.Function:
        if self._blocker is None:
            try:
                self._module, fn = compile_helper(self.ctx.info.cc, BLOCKER_SOURCE, "mamba_forge_qualify_blocker.cu",
                                                  "mf_placement_blocker", "blocker")
                fn.set_max_dynamic_smem(self.blocker_smem())
            except cu.CudaError as exc:  # before RuntimeError: the driver's errors may be one
                raise Unavailable(f"the blocker did not load: {exc}") from None
            except RuntimeError as exc:  # it did not compile
                raise Unavailable(str(exc)[:230]) from None
            self._blocker = fn
        return self._blocker

    def blocker_smem(self) -> int:
        return self.ctx.info.optin_smem

    def hold(self, blocks: int) -> Hold:
        """Launch the blocker on ctx.other and wait (up to ARRIVAL_S) until its blocks are resident."""
        fn = self.blocker()
        try:
            flags = green.MappedInts(1 + blocks)
        except (cu.CudaError, TypeError, ValueError, AttributeError) as exc:
            raise Unavailable(f"no mapped host memory for the blocker's flags: {exc}") from None
        params = cu.PackedParams([("ptr", flags.device_ptr), ("ptr", flags.device_ptr + 4)])
        try:
            cu.launch(fn, (blocks,), (1024,), params, smem=self.blocker_smem(), stream=self.ctx.other)
        except cu.CudaError as exc:
            flags.free()
            if exc.result in cu.STICKY_RESULTS:
                raise
            raise Unavailable(f"the blocker did not launch: {exc}") from None
        h = Hold(self.ctx, flags, blocks)
        deadline = time.monotonic() + ARRIVAL_S
        while h.arrived() < blocks and time.monotonic() < deadline:
            time.sleep(1e-4)
        return h


class Hold:
    """A running blocker; release() lets it finish (idempotent) and waits for it."""

    def __init__(self, ctx, flags: green.MappedInts, blocks: int):
        self.ctx, self.flags, self.blocks = ctx, flags, blocks
        self.released = False

    def arrived(self) -> int:
        return sum(int(self.flags.host[1 + i]) for i in range(self.blocks))

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.flags.host[0] = 1
            self.ctx.wait(self.ctx.other, 60.0)
            self.flags.free()


def smem_for_lower_residency(fn, threads: int, base: int, static: int, optin: int) -> tuple[int, int, int] | None:
    """(dynamic smem bytes, resident blocks per SM at the declared smem, at those bytes): the least bytes (in 256-byte
    steps) that halve the resident blocks per SM; None when one block per SM is all there is or no smem will do."""
    occ = fn.occupancy(threads, base)
    if occ <= 1:
        return None
    target = max(1, occ // 2)
    hi = optin - static
    if hi <= base or fn.occupancy(threads, hi) > target:
        return None
    lo = base  # occupancy(lo) > target >= occupancy(hi)
    while hi - lo > 256:
        mid = (lo + hi) // 2 // 256 * 256
        if mid <= lo:
            break
        if fn.occupancy(threads, mid) <= target:
            hi = mid
        else:
            lo = mid
    return hi, occ, fn.occupancy(threads, hi)


def placements(ctx, placer, inst, fn, spec) -> tuple[list[Placement], list[str]]:
    """The placements to run `inst` under, and notes on those that could not be had."""
    out: list[Placement] = []
    notes: list[str] = []
    parts, note = placer.partitions()
    if note:
        notes.append(note + ("" if parts else ": placed beside the blocker and with more shared memory only"))
    for p in parts:
        out.append(Placement(p.label, lambda p=p: _run_on(ctx, inst, p)))
    blocks = max(1, ctx.info.sm_count // 2)
    out.append(Placement(f"beside a blocker holding {blocks} of {ctx.info.sm_count} SMs",
                         lambda: _run_beside_blocker(ctx, placer, inst, blocks)))
    threads = spec.block[0] * spec.block[1] * spec.block[2]
    static = fn.attributes().static_smem
    fn.set_max_dynamic_smem(ctx.info.optin_smem - static)  # occupancy above the cap would read as zero
    try:
        lowered = smem_for_lower_residency(fn, threads, spec.dynamic_smem, static, ctx.info.optin_smem)
    finally:
        fn.set_max_dynamic_smem(spec.dynamic_smem)
    if lowered is None:
        notes.append("shared memory cannot lower its residency (one block per SM already, or no room)")
    else:
        smem, before, after = lowered
        label = (f"with {smem - spec.dynamic_smem} more bytes of dynamic shared memory ({after} resident blocks "
                 f"per SM instead of {before})")
        out.append(Placement(label, lambda: _run_with_smem(ctx, inst, fn, smem, spec.dynamic_smem)))
    return out, notes


def _run_on(ctx, inst, part: Partition) -> dict[str, bytes]:
    try:
        part.enter()
    except cu.CudaError as exc:
        raise Unavailable(str(exc)) from None
    try:
        inst.enqueue(part.stream)
    except cu.CudaError as exc:
        if exc.result in cu.STICKY_RESULTS:
            raise
        refused = exc
    else:
        refused = None
    finally:
        part.leave()
    ctx.wait(part.stream)  # the resets enqueued before a refused launch finish before anything else runs
    if refused is not None:
        raise Unavailable(str(refused))
    inst.verify(ctx.stream)  # the green stream's work is done: the guards are read on the usual stream
    return inst.outputs()


def _run_beside_blocker(ctx, placer, inst, blocks: int) -> dict[str, bytes]:
    h = placer.hold(blocks)
    try:
        inst.enqueue(ctx.stream)
        first = ctx.budget.first_launch_s or 0.0
        deadline = time.monotonic() + max(HOLD_MIN_S, HOLD_FACTOR * first)
        while not ctx.stream.query_done() and time.monotonic() < deadline:
            time.sleep(1e-4)
        h.release()  # a symbol that needs every SM at once finishes once the blocker has gone
        ctx.wait(ctx.stream)
    finally:
        h.release()
    inst.verify(ctx.stream)
    return inst.outputs()


def _run_with_smem(ctx, inst, fn, smem: int, declared: int) -> dict[str, bytes]:
    fn.set_max_dynamic_smem(smem)
    try:
        return inst.run(smem=smem)
    finally:
        fn.set_max_dynamic_smem(declared)


__all__ = ["BLOCKER_SOURCE", "DevicePlacer", "Hold", "Partition", "Placement", "Unavailable", "placements",
           "smem_for_lower_residency"]
