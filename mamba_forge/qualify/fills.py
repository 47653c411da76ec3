"""Fills and corpora: the host contents of a launch's input buffers. Each buffer's declared fill (spec.Fill) is
drawn as is for the uniform corpus, across magnitudes for logu, and with about one element in eight replaced by
a special value (denormals, signed zeros, the bound, optionally infinities and NaN) for special. Pure NumPy."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from mamba_forge.qualify.spec import FLOAT_DTYPES, NP_DTYPES, BufferSpec, Fill, SpecError

CORPORA = ("uniform", "logu", "special")
LOGU_DECADES = 6  # the logu corpus spans this many decades below the declared bound


def _finite_info(dtype: str) -> tuple[float, float, float]:
    """(smallest denormal, largest denormal, max finite) of a float dtype."""
    fi = ml_dtypes.finfo(NP_DTYPES[dtype]) if dtype == "bf16" else np.finfo(NP_DTYPES[dtype])
    tiny = float(fi.smallest_normal)
    small = float(fi.smallest_subnormal)
    return small, tiny - small, float(fi.max)


def draw(fill: Fill, n: int, dtype: str, rng: np.random.Generator, nonfinite: bool = False) -> np.ndarray:
    """Values of one fill as float64 (or int64 for integer dtypes), before rounding to `dtype`."""
    k, a = fill.kind, fill.args
    if k == "uniform":
        return rng.uniform(a[0], a[1], n)
    if k == "normal":
        return rng.normal(a[0], a[1], n)
    if k == "logu":
        mag = np.exp(rng.uniform(math.log(a[0]), math.log(a[1]), n))
        return np.where(rng.random(n) < 0.5, -mag, mag)
    if k == "positive":
        return np.exp(rng.uniform(math.log(a[0]), math.log(a[1]), n))
    if k == "const":
        return np.full(n, a[0])
    if k == "randint":
        return rng.integers(int(a[0]), int(a[1]), n, dtype=np.int64)
    if k == "iota":
        return np.arange(n, dtype=np.int64)
    if k == "special":
        return special_values(n, dtype, rng, bound=1.0, signed=True, nonfinite=nonfinite)
    raise SpecError(f"unknown fill {k!r}")


def special_values(n: int, dtype: str, rng: np.random.Generator, *, bound: float, signed: bool, nonfinite: bool) -> np.ndarray:
    sub_min, sub_max, _ = _finite_info(dtype)
    pool = [sub_min, sub_max, bound, 1.0]
    if signed:
        pool += [-0.0, 0.0, -sub_min, -sub_max, -bound, -1.0]
    if nonfinite:
        pool += [math.inf, -math.inf, math.nan]
    return np.asarray(pool, dtype=np.float64)[rng.integers(0, len(pool), n)]


def make_input(buf: BufferSpec, corpus: str, rng: np.random.Generator, *, nonfinite: bool = False) -> np.ndarray:
    """One input buffer's host contents, already in its dtype (flat)."""
    assert buf.fill is not None
    n = buf.count
    fill = buf.fill
    if corpus == "logu" and fill.kind in ("uniform", "normal"):
        if fill.kind == "uniform" and fill.args[0] > 0:  # a positive interval: log-uniform across it
            fill = Fill("positive", fill.args)
        else:
            hi = fill.bound
            lo = hi * 10.0 ** (-LOGU_DECADES)
            fill = Fill("logu", (lo, hi)) if fill.signed else Fill("positive", (lo, hi))
    vals = draw(fill, n, buf.dtype, rng, nonfinite)
    if corpus == "special" and fill.perturbable:
        # about one element in eight becomes a special value; the rest keep the declared distribution
        where = rng.random(n) < 0.125
        signed = fill.signed
        sp = special_values(int(where.sum()), buf.dtype, rng, bound=fill.bound, signed=signed, nonfinite=nonfinite)
        if fill.kind == "positive":
            sp = np.abs(sp)
            sp[sp == 0] = fill.args[0]
        vals = vals.astype(np.float64)
        vals[where] = sp
    if buf.fill.kind == "uniform" and corpus != "uniform":
        # corpora widen magnitudes but stay inside the declared interval (the family's domain)
        vals = np.asarray(vals, dtype=np.float64)
        fin = np.isfinite(vals)
        vals[fin] = np.clip(vals[fin], buf.fill.args[0], buf.fill.args[1])
    if buf.dtype in FLOAT_DTYPES:
        return np.asarray(vals, dtype=np.float64).astype(NP_DTYPES[buf.dtype])
    return np.asarray(vals).astype(NP_DTYPES[buf.dtype])


__all__ = ["CORPORA", "draw", "make_input", "special_values"]
