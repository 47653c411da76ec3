"""The ``split`` check: a family that declares ``split`` (catalog/split_rules.py) gives the same bits however a
sequence is cut into calls: one call over the whole length, and the same symbol called over consecutive chunks
of it with its state carried from call to call, must agree bit for bit in every output position and in the final
state. The Mamba layer runs prefill, chunked prefill and decode (chunks of 1) through the same kernels and relies
on it.

For each declared chunk length the check launches the symbol once per chunk through the qualifier's own launch
path (the spec re-evaluated with the chunk's length, a fresh instance with guards and poisoned outputs): the
sequence params are cut per batch row (``[batch, L, rest]`` row-major), the other inputs passed whole, the carried
params set from the previous call's outputs (the first call's from their fill). The outputs put back together and
the last call's carried params are compared with the full call's; a difference rejects the symbol naming the chunk
length, the param and its first differing element (batch row, sequence position, element).

The cutting, putting back, comparing and reporting are pure NumPy (:func:`prove` takes the launch as a function,
CPU-tested with NumPy kernels and host emulations); :func:`check` binds it to a worker's symbol.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mamba_forge.catalog.split_rules import Split
from mamba_forge.core.vocab import DTYPE_SIZES
from mamba_forge.qualify import checks as C
from mamba_forge.qualify import spec as S
from mamba_forge.qualify.guards import plain

CHECK = "split"

# launch(spec, inputs) -> the spec's outputs after one launch at spec.dims (name -> bytes)
Launch = Callable[[S.LaunchSpec, dict[str, np.ndarray]], dict[str, bytes]]


@dataclass(frozen=True)
class Layout:
    """How a param's elements lie: ``rows`` x ``length`` x ``rest`` row-major (a carried param: length 1)."""

    rows: int
    length: int
    rest: int

    def where(self, i: int) -> tuple[int, int, int]:
        """(batch row, sequence position, element) of flat index i."""
        row, within = divmod(i, self.length * self.rest)
        pos, elem = divmod(within, self.rest)
        return row, pos, elem


def layout(buf: S.BufferSpec, rows: int, length: int) -> Layout:
    """The [rows, length, rest] layout of a buffer; SpecError when its element count does not divide so."""
    rest, left = divmod(buf.count, rows * length)
    if left or rest < 1:
        raise S.SpecError(f"split: {buf.name!r} holds {buf.count} elements, not {rows} rows x {length} positions "
                          "x rest")
    return Layout(rows, length, rest)


def chunk_bounds(length: int, chunk: int) -> list[tuple[int, int]]:
    """Consecutive [l0, l1) of at most `chunk` positions covering 0..length (the last one shorter)."""
    if chunk < 1 or length < 1:
        raise ValueError(f"chunks of {chunk} over a length of {length}")
    return [(l0, min(l0 + chunk, length)) for l0 in range(0, length, chunk)]


def take(flat: np.ndarray, lay: Layout, l0: int, l1: int) -> np.ndarray:
    """Positions l0..l1 of every row of a [rows, length, rest] array, as a flat [rows, l1 - l0, rest] array."""
    shaped = np.asarray(flat).reshape(lay.rows, lay.length, lay.rest)
    return np.ascontiguousarray(shaped[:, l0:l1]).reshape(-1)


def put(dst: np.ndarray, part: np.ndarray, lay: Layout, l0: int, l1: int) -> None:
    """The inverse of take: write a flat [rows, l1 - l0, rest] part into positions l0..l1 of `dst` (flat)."""
    dst.reshape(lay.rows, lay.length, lay.rest)[:, l0:l1] = np.asarray(part).reshape(lay.rows, l1 - l0, lay.rest)


def first_difference(name: str, dtype: str, want: bytes, got: bytes, lay: Layout, sequence: bool) -> str:
    """'' when the bytes agree; else one phrase naming the param, its first differing element by batch row,
    sequence position (sequence params) and element, both values with their bits, and how many differ."""
    size = DTYPE_SIZES[dtype]
    a = np.frombuffer(want, np.uint8).reshape(-1, size)
    b = np.frombuffer(got, np.uint8).reshape(-1, size)
    if a.shape != b.shape:
        return f"{name}: {b.shape[0]} elements chunked, {a.shape[0]} in one call"
    bad = np.any(a != b, axis=1)
    if not bad.any():
        return ""
    i = int(np.argmax(bad))
    row, pos, elem = lay.where(i)
    at = f"batch row {row}, position {pos}, element {elem}" if sequence else f"batch row {row}, element {elem}"

    def show(raw: bytes) -> str:
        bits = int.from_bytes(raw[i * size:(i + 1) * size], "little")
        v = S.from_bytes(raw, dtype)[i]  # a float as its dtype's shortest text (0.35167423, not 0.3516742289066315)
        return f"{str(v) if dtype in S.FLOAT_DTYPES else plain(v)} (0x{bits:0{2 * size}x})"

    what = name if sequence else f"the final {name}"
    return (f"{what} differs at {at}: {show(got)} chunked, {show(want)} in one call "
            f"({int(bad.sum())} of {bad.size} elements differ)")


@dataclass
class Outcome:
    passed: bool
    digest: str  # sha256 of the one-call outputs (the determinism checks' digest at the same inputs)
    detail: str  # the check record's
    reason: str = ""  # the rejection's, when not passed
    chunk: int = 0  # the chunk length whose run differed


def prove(split: Split, dims: dict[str, int], spec_at: Callable[[dict[str, int]], S.LaunchSpec],
          inputs: dict[str, np.ndarray], launch: Launch) -> Outcome:
    """One call over the whole sequence at `dims`, then for each of split.chunks the calls over consecutive chunks
    carrying the state; compared bit for bit. `inputs`: every filled buffer at `dims` (name -> flat array)."""
    full = spec_at(dims)
    length, rows = dims[split.dim], dims[split.batch] if split.batch else 1
    seq = {n: layout(b, rows, length) for b in full.all_buffers if (n := b.name) in split.sequence}
    carried = {n: layout(b, rows, 1) for b in full.all_buffers if (n := b.name) in split.carried}
    outputs = full.outputs
    want = launch(full, inputs)
    digest = C.digest(want)
    runs = []
    for chunk in split.chunks:
        pieces = chunk_bounds(length, chunk)
        got = {b.name: np.zeros(b.count, S.NP_DTYPES[b.dtype]) for b in outputs if b.name in seq}
        state = {n: inputs[n] for n in carried}
        for l0, l1 in pieces:
            spec = spec_at({**dims, split.dim: l1 - l0})
            ins = {}
            for b in spec.all_buffers:
                if not b.needs_fill:
                    continue
                if b.name in seq:
                    ins[b.name] = take(inputs[b.name], seq[b.name], l0, l1)
                elif b.name in carried:
                    ins[b.name] = state[b.name]
                else:
                    ins[b.name] = inputs[b.name]
                if ins[b.name].size != b.count:
                    raise S.SpecError(f"split: {b.name!r} gets {ins[b.name].size} elements in a call over "
                                      f"{split.dim} = {l1 - l0}; its spec holds {b.count}")
            outs = launch(spec, ins)
            for b in spec.outputs:
                if b.name in got:
                    put(got[b.name], S.from_bytes(outs[b.name], b.dtype), seq[b.name], l0, l1)
                if b.name in carried:
                    state[b.name] = S.from_bytes(outs[b.name], b.dtype).copy()
        calls = f"{len(pieces)} call{'s' if len(pieces) > 1 else ''}"
        runs.append(f"{chunk} ({calls})")
        for b in outputs:
            if b.name in seq:
                diff = first_difference(b.name, b.dtype, want[b.name], got[b.name].tobytes(), seq[b.name], True)
            elif b.name in carried:
                diff = first_difference(b.name, b.dtype, want[b.name], state[b.name].tobytes(), carried[b.name], False)
            else:  # the catalog refuses such a split (catalog/split_rules.py)
                raise S.SpecError(f"split: output {b.name!r} is neither a sequence nor a carried param")
            if diff:
                how = f"called over chunks of {split.dim} = {chunk} ({calls} carrying {', '.join(carried) or 'no state'})"
                return Outcome(False, digest, f"{how}: {diff}",
                               f"{how}: {diff}; its bits depend on how a sequence is split into calls", chunk)
    names = ", ".join(b.name for b in outputs)
    return Outcome(True, digest, f"{names} bitwise equal to one call over {split.dim} = {length} when called over "
                                 f"chunks of {', '.join(runs)}, carrying {', '.join(carried) or 'no state'}")


def check(run, fn, inputs: dict[str, np.ndarray], prepare, checked: list):
    """The check for a worker's symbol (`run`: worker.SymbolRun), recorded on it: every call a fresh
    checks.Instance of the spec at that call's dims, outputs poisoned and guards checked after each launch (their
    records join `checked`). Returns the rejection (a SymbolResult) or None."""

    def launch(spec: S.LaunchSpec, ins: dict[str, np.ndarray]) -> dict[str, bytes]:
        inst = C.Instance(run.ctx, spec, fn, ins, prepare)
        if inst.guards is not None:
            checked.append(inst.guards)
        try:
            return inst.run()
        finally:
            inst.free()

    out = prove(run.fam.split, dict(run.fam.qualify.dims), run.spec_at, inputs, launch)
    run.add(CHECK, out.passed, out.digest, out.detail)
    return None if out.passed else run.reject(CHECK, f"{run.name}: {out.reason}")


__all__ = ["CHECK", "Layout", "Outcome", "check", "chunk_bounds", "first_difference", "layout", "prove", "put", "take"]
