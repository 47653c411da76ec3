"""The launch a contract gives at known dims, without tensors: what the qualifier launches.

The qualifier allocates its own buffers, so it knows the dims before any tensor exists. ``Contract.at(dims)`` is
the contract evaluated there through bind's own compiled expressions and checks (state capacity, grid limits,
scalar types, derived values): grid, block, dynamic shared memory, each pointer's element count and shape, and
every scalar's value, a caller scalar at the value it was qualified with. ``Contract.bind_at(launch, addresses,
blobs)`` packs it around raw device addresses with bind's checks on what it takes (blob sizes, no null address,
no output overlapping another pointer). So a qualified launch and an engine's launch of one record are one
computation. Shapes axis by axis (the qualifier's buffers, the references' arrays) are compiled on first use: an
engine's path never needs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from mamba_forge.runtime.args import scalar_value
from mamba_forge.runtime.contract_memo import _BLOB, _DIM_SOURCE, _GIVEN, _MISSING, _PTR
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.expressions import compile_expressions


class Bound(NamedTuple):
    """A checked launch: what driver.PackedParams and cuLaunchKernel take."""

    values: list  # (type, value) per parameter, in order
    aligns: tuple[int, ...]  # by-value blob alignment per parameter (0: not a blob)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    owner: str  # the first tensor's framework ("torch", "cupy", ...): streams.default_stream's owner
    ordinal: int  # the device the tensors are on


def _bound(fields: tuple) -> Bound:
    return tuple.__new__(Bound, fields)  # skips NamedTuple's Python-level __new__


class Launch(NamedTuple):
    """A contract evaluated at given dims (Contract.at): everything of the launch but the addresses and blobs."""

    dims: dict[str, int]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    counts: dict[str, int]  # pointer -> element count (its shape's product): what bind holds a tensor to
    shapes: dict[str, tuple[int, ...]]  # pointer -> its shape, axis by axis
    scalars: dict[str, tuple[str, int | float]]  # scalar -> (type, value), as bind packs it


def blob_bytes(v, size: int, what: str) -> bytes:
    """A by-value blob argument as the exact bytes to pack; LaunchRefused unless bytes-like of exactly `size`."""
    if not isinstance(v, (bytes, bytearray, memoryview)):
        raise LaunchRefused(f"{what} is a {type(v).__name__}; the parameter is a {size}-byte blob "
                            "(e.g. a CUtensorMap): pass bytes")
    data = v if type(v) is bytes else bytes(v)
    if len(data) != size:
        raise LaunchRefused(f"{what} is {len(data)} bytes; the parameter is exactly {size} bytes")
    return data


def _no_axes(*_dims) -> tuple:
    return ()


class LaunchAt:
    """Contract's tensorless launch (a mixin: the plan, _geometry, _bind_derived and _check_memory are Contract's)."""

    def at(self, dims: Mapping[str, int]) -> Launch:
        """The launch at exactly the contract's dims; LaunchRefused naming what does not hold (as bind would), or
        a caller scalar the record gives no value for (a literal value is the one it was qualified with)."""
        name, want = self.symbol, ", ".join(self.dims) or "none"
        if unknown := sorted(set(dims) - set(self.dims)):
            raise LaunchRefused(f"{name} takes no dim {', '.join(unknown)}; its dims are {want}")
        vals = []
        for d in self.dims:
            if d not in dims:
                raise LaunchRefused(f"{name}: missing dim {d}; its dims are {want}")
            v = scalar_value("i64", dims[d], f"dim {d} of {name}")
            if v < 0:
                raise LaunchRefused(f"{name}: dim {d} = {v} is negative")
            vals.append(v)
        grid, out = self._geometry(vals)
        ng, npt = self._ngrid, len(self._pointers)
        values: list = [None] * len(self._plan)
        if self._derived:
            self._bind_derived(values, out[ng + npt:], [_MISSING] * len(self._derived), vals)
        for i, (pname, how, ptype, extra, _, what) in enumerate(self._plan):
            if how == _DIM_SOURCE:
                values[i] = (ptype, scalar_value(ptype, vals[extra], f"{what} (= dim {self.dims[extra]})"))
            elif how == _GIVEN:
                if pname not in self.qualified_literals:
                    raise LaunchRefused(f"{what}: the record gives the scalar no value (its caller passes one), "
                                        "so it has no launch without a caller")
                values[i] = (ptype, scalar_value(ptype, self.qualified_literals[pname], what))
        counts = {p.name: c for p, c in zip(self._pointers, out[ng:ng + npt], strict=True)}
        scalars = {e[0]: v for e, v in zip(self._plan, values, strict=True) if v is not None}
        return Launch(dict(zip(self.dims, vals, strict=True)), grid, self._block, self._smem, counts,
                      self._shapes(vals), scalars)

    def bind_at(self, launch: Launch, addresses: Mapping[str, int], blobs: Mapping[str, bytes],
                device: int = 0) -> Bound:
        """`launch` packed around raw device addresses (allocations of at least `launch.counts` elements each, the
        caller's own) and by-value blobs: the values in parameter order with their alignments, as bind returns."""
        values: list = [None] * len(self._plan)
        numels = [0] * len(self._pointers)
        for i, (pname, how, ptype, extra, j, what) in enumerate(self._plan):
            if how == _PTR:
                if pname not in addresses:
                    raise LaunchRefused(self._missing(pname, how, ptype, {}))
                values[i] = ("ptr", int(addresses[pname]))
                numels[j] = launch.counts[pname]
            elif how == _BLOB:
                if pname not in blobs:
                    raise LaunchRefused(self._missing(pname, how, extra, {}))
                values[i] = ("bytes", blob_bytes(blobs[pname], extra, what))
            else:
                values[i] = launch.scalars[pname]
        self._check_memory(values, numels, "")
        return _bound((values, self._aligns, launch.grid, launch.block, launch.shared_mem, "", device))

    def _shapes(self, dims: list) -> dict[str, tuple[int, ...]]:
        """Each pointer's shape at these dims, from its recorded axis expressions (compiled on first use)."""
        axes = getattr(self, "_axes", None)
        if axes is None:
            texts = [s for p in self._pointers for s in p.shape]
            axes = compile_expressions(self.symbol, texts, self.dims, self.constants)[0] if texts else _no_axes
            self._axes = axes
        try:
            flat = axes(*dims)
        except (ArithmeticError, ValueError) as exc:
            raise LaunchRefused(f"{self.symbol}: the shapes cannot be evaluated at {self._at(dims)} "
                                f"({type(exc).__name__}: {exc})") from None
        out, k = {}, 0
        for p in self._pointers:
            out[p.name] = tuple(flat[k:k + len(p.shape)])
            k += len(p.shape)
        return out


__all__ = ["Bound", "Launch", "LaunchAt", "blob_bytes"]
