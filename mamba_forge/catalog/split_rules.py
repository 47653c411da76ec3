"""A family's ``split`` declaration: which of its launches must give the same bits however a sequence is cut into
calls (the token-major scan and conv of the Mamba layer run prefill, chunked prefill and decode as one kernel).

    split = { dim = "L", batch = "batch", sequence = ["out", "u"], carried = ["state"], chunks = [1, 5, 16] }

* ``dim``: the qualification dim that is the sequence length; each call gets its own (the chunk's length);
* ``batch``: the qualification dim of independent rows (omitted: one row);
* ``sequence``: pointer params laid out ``[batch, dim, rest]`` row-major (inputs are cut into the chunk's
  positions of every row, outputs are put back there);
* ``carried``: ``inout`` pointer params laid out ``[batch, rest]`` that carry the state from one call to the next;
* ``chunks``: the chunk lengths the qualifier tries, each shorter than ``dim`` at the qualification dims (the
  last chunk of a call sequence is shorter when the length does not divide ``dim``).

Every other pointer param is passed whole to every call, so its shape may not depend on ``dim``; every output is
a sequence or a carried param. The rules are checked when the catalog loads (:func:`family_problem` once per
family, :func:`symbol_problem` per symbol with its instance values); the qualifier's check is
:mod:`mamba_forge.qualify.split`.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from mamba_forge.catalog.limits import GRID_MAX
from mamba_forge.core import expr

MAX_CHUNKS = 8  # chunk lengths per family: each costs ceil(L / chunk) launches at the qualification dims
PROBE = 1  # the shape rules also evaluate every shape with the dims grown by this much


class Split(BaseModel):
    """The ``split`` table of a family (field rules here; the rules over params and dims: family_problem)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    dim: str
    batch: str | None = None
    sequence: list[str]
    carried: list[str] = []
    chunks: list[int]

    @model_validator(mode="after")
    def _check(self) -> Split:
        if not self.sequence:
            raise ValueError("split.sequence is empty: name the pointer params laid out [batch, dim, rest]")
        for what, names in (("sequence", self.sequence), ("carried", self.carried)):
            dup = next((n for n in names if names.count(n) > 1), None)
            if dup is not None:
                raise ValueError(f"split.{what} names {dup!r} twice")
        both = sorted(set(self.sequence) & set(self.carried))
        if both:
            raise ValueError(f"split: {both[0]!r} is both a sequence and a carried param; a param is one or the other")
        if self.batch is not None and self.batch == self.dim:
            raise ValueError(f"split.batch and split.dim are both {self.dim!r}; they are two different dims")
        if not 1 <= len(self.chunks) <= MAX_CHUNKS:
            raise ValueError(f"split.chunks holds {len(self.chunks)} lengths; give 1 to {MAX_CHUNKS}")
        for c in self.chunks:
            if c < 1:
                raise ValueError(f"split.chunks: {c} is not a length; chunk lengths are 1 or more")
        dup = next((c for c in self.chunks if self.chunks.count(c) > 1), None)
        if dup is not None:
            raise ValueError(f"split.chunks names {dup} twice")
        return self


def family_problem(fam: Any) -> str | None:
    """The rules over the family's params and qualification dims (`fam`: catalog.entries.Family with a split);
    None when they hold, else one sentence naming what is wrong and what to do."""
    sp: Split = fam.split
    q = fam.qualify
    if not q.dims or q.skip:
        return "split: the qualifier does not launch this family (no qualify.dims, or qualify.skip), so nothing " \
               "would prove it; declare qualify.dims or drop split"
    for key, name in (("dim", sp.dim), ("batch", sp.batch)):
        if name is not None and name not in q.dims:
            return f"split.{key} {name!r} is not a qualification dim (qualify.dims: {', '.join(sorted(q.dims))})"
    if q.aux:
        return "split: the family has qualify.aux buffers, which a chunked call could not cut or carry; drop split"
    params = {p.name: p for p in fam.params}
    pointers = [p.name for p in fam.params if p.type == "ptr"]
    for what, names in (("sequence", sp.sequence), ("carried", sp.carried)):
        for n in names:
            if n not in params or params[n].type != "ptr":
                return (f"split.{what} names {n!r}, which is not a pointer param of the family (pointer params: "
                        f"{', '.join(pointers) or 'none'})")
    for n in sp.sequence:
        if params[n].role == "scratch":
            return f"split.sequence {n!r} is a scratch param; sequence params are inputs or outputs"
        if params[n].role in ("in", "inout") and params[n].fill is None:
            return (f"split.sequence {n!r} is an input without a fill (qualify.prepare builds it), so a call could "
                    "not be given its part; give it a fill or drop split")
    for n in sp.carried:
        if params[n].role != "inout":
            return (f"split.carried {n!r} has role {params[n].role!r}; a carried param is read and written by "
                    "every call: declare it role = \"inout\"")
    listed = set(sp.sequence) | set(sp.carried)
    for p in fam.params:
        if p.type == "ptr" and p.role in ("out", "inout") and p.name not in listed:
            return (f"split: output {p.name!r} is neither a sequence nor a carried param, so the split check could "
                    "not compare it; list it in split.sequence or split.carried")
    length = q.dims[sp.dim]
    for c in sp.chunks:
        if c >= length:
            return (f"split.chunks: {c} does not split {sp.dim} = {length} (the qualification dims); every chunk "
                    f"must be shorter than {sp.dim}")
    return None


def _count(shape: list, env: dict[str, int]) -> int:
    return math.prod(int(expr.evaluate(s, env)) for s in shape)


def _axes_in_order(base: list[int], grown_dim: list[int], grown_batch: list[int]) -> bool:
    """Row-major [batch, dim, rest] over a shape of several axes: ranked 0 where an axis grows with the batch, 1
    where only with dim, 2 where with neither, the ranks never go down (["L", "batch", "d"] is refused)."""
    ranks = [0 if gb != a else 1 if gd != a else 2 for a, gd, gb in zip(base, grown_dim, grown_batch, strict=True)]
    return ranks == sorted(ranks)


def _rows(count: int, lead: int) -> int | None:
    """count / lead when it divides evenly, else None."""
    return count // lead if lead > 0 and count % lead == 0 else None


def symbol_problem(fam: Any, num_env: dict[str, int], deterministic: bool) -> str | None:
    """The rules that need one symbol's instance values (`num_env`): layouts of the sequence and carried params,
    shapes of the others independent of the sequence length, and every call of a chunked run launchable. None
    when they hold, else one sentence."""
    sp: Split = fam.split
    if not deterministic:
        return "split: the family is not deterministic, so its bits cannot be compared across splits; drop split"
    dims = dict(fam.qualify.dims)
    b = dims[sp.batch] if sp.batch else 1
    length = dims[sp.dim]

    def env(**grow: int) -> dict[str, int]:
        e = {**num_env, **dims}
        for k, v in grow.items():
            e[k] += v
        return e

    # the dims grown by PROBE: a shape is [batch, dim, rest] only if rest stays the same when either grows
    points = [({}, b, length), ({sp.dim: PROBE}, b, length + PROBE)]
    if sp.batch:
        points.append(({sp.batch: PROBE}, b + PROBE, length))
    try:
        for p in fam.params:
            if p.type != "ptr":
                continue
            axes = [[int(expr.evaluate(s, env(**g))) for s in p.shape] for g, _, _ in points]
            counts = [(math.prod(a), rb, rl) for a, (_, rb, rl) in zip(axes, points, strict=True)]
            ordered = _axes_in_order(axes[0], axes[1], axes[-1] if sp.batch else axes[0])
            if p.name in sp.sequence:
                rests = {_rows(n, rb * rl) for n, rb, rl in counts}
                if None in rests or len(rests) != 1 or not ordered:
                    lay = f"[{sp.batch}, {sp.dim}, rest]" if sp.batch else f"[{sp.dim}, rest]"
                    return (f"split.sequence {p.name!r}: shape {list(p.shape)} ({counts[0][0]} elements at the "
                            f"qualification dims) is not laid out {lay} with rest independent of them")
            elif p.name in sp.carried:
                rests = {_rows(n, rb) for n, rb, _ in counts}
                if None in rests or len(rests) != 1 or not ordered:
                    lay = f"[{sp.batch}, rest]" if sp.batch else "[rest]"
                    return (f"split.carried {p.name!r}: shape {list(p.shape)} is not laid out {lay} with rest "
                            f"independent of {sp.dim} and the batch")
            elif counts[0][0] != counts[1][0]:
                return (f"split: {p.name!r} is passed whole to every call, but its shape {list(p.shape)} changes "
                        f"with {sp.dim}; list it in split.sequence or make its shape independent of {sp.dim}")
        for c in sp.chunks:
            for n in sorted({c, length % c} - {0}):
                e = {**num_env, **dims, sp.dim: n}
                for axis, g in enumerate(fam.launch.grid):
                    v = expr.evaluate(g, e)
                    if not isinstance(v, int) or not 1 <= v <= GRID_MAX[axis]:
                        return (f"split.chunks: a call over {sp.dim} = {n} has launch.grid[{axis}] = {v}; CUDA needs "
                                f"1..{GRID_MAX[axis]}")
                for p in fam.params:
                    if p.type == "ptr" and _count(p.shape, e) < 1:
                        return f"split.chunks: a call over {sp.dim} = {n} gives {p.name!r} an empty shape"
    except expr.ExprError as exc:
        return f"split: a shape or grid expression fails with the dims grown or at a chunk's {sp.dim}: {exc}"
    return None


__all__ = ["MAX_CHUNKS", "Split", "family_problem", "symbol_problem"]
