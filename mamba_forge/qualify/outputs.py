"""The host side of the qualification checks, pure NumPy (CPU-tested): comparing a kernel's outputs with the float64
reference (tolerances, exact rounding, NaN and infinity positions, elements left unwritten under the poison pattern),
digests and first differences for the determinism checks, the reference's outputs and the corpora's inputs.
qualify/checks.py (the device side: contexts, instances, live admission) re-exports every name here.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable

import numpy as np

from mamba_forge.catalog.model import Family
from mamba_forge.core.vocab import DTYPE_SIZES
from mamba_forge.qualify import fills
from mamba_forge.qualify import spec as S
from mamba_forge.qualify.guards import POISON, plain

# ---- pure comparisons -----------------------------------------------------------------------------------


def digest(outputs: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(outputs):
        h.update(outputs[name])
    return h.hexdigest()


def unwritten_mask(raw: bytes, dtype: str) -> np.ndarray:
    """Elements whose bytes are all still the poison pattern."""
    size = DTYPE_SIZES[dtype]
    b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, size)
    return np.all(b == POISON, axis=1)


def compare(got: np.ndarray, ref: np.ndarray, dtype: str, rtol: float, atol: float, exact: bool) -> tuple[bool, str]:
    """Elementwise |got - ref| <= atol + rtol |ref|, NaN where and only where the reference is NaN, infinities
    equal. `exact`: got must equal the reference rounded to the dtype, bit for bit (NaNs by position)."""
    g = np.asarray(got, dtype=np.float64).reshape(-1)
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    if g.shape != r.shape:
        return False, f"reference has {r.size} elements, the output {g.size}"
    if exact:
        rr = r.astype(S.NP_DTYPES[dtype]).astype(np.float64) if dtype in S.FLOAT_DTYPES else r
        same = (g == rr) | (np.isnan(g) & np.isnan(rr))
        same &= np.signbit(g) == np.signbit(rr)
        bad = ~same
        if bad.any():
            i = int(np.argmax(bad))
            return False, f"{int(bad.sum())} of {g.size} elements differ from the exact reference; first at {i}: {plain(g[i])} != {plain(rr[i])}"
        return True, f"{g.size} elements exact"
    if not (np.isfinite(rtol) and np.isfinite(atol) and rtol >= 0 and atol >= 0):
        return False, f"tolerance rtol {rtol!r} atol {atol!r} is not a finite non-negative number: nothing can be checked"
    gn, rn = np.isnan(g), np.isnan(r)
    if (gn != rn).any():
        i = int(np.argmax(gn != rn))
        return False, f"NaN mismatch at {i}: got {plain(g[i])}, reference {plain(r[i])} ({int((gn != rn).sum())} elements)"
    gi, ri = np.isinf(g), np.isinf(r)
    if (gi != ri).any() or (g[ri] != r[ri]).any():
        bad = (gi != ri) | (ri & (g != r))
        i = int(np.argmax(bad))
        return False, f"infinity mismatch at {i}: got {plain(g[i])}, reference {plain(r[i])}"
    fin = ~(rn | ri)
    err = np.abs(g[fin] - r[fin])
    lim = atol + rtol * np.abs(r[fin])
    bad = err > lim
    if bad.any():
        idx = np.flatnonzero(fin)[bad]
        worst = int(np.argmax(err - lim))
        wi = int(np.flatnonzero(fin)[worst])
        return False, (
            f"{idx.size} of {g.size} elements outside rtol {rtol:g} atol {atol:g}; worst at {wi}: "
            f"got {plain(g[wi])}, reference {plain(r[wi])}"
        )
    rel = float(np.max(err / np.maximum(np.abs(r[fin]), atol / max(rtol, 1e-300)))) if err.size else 0.0
    return True, f"{g.size} elements, max scaled error {rel:.2e}"


def load_callable(path: str) -> Callable:
    """'package.module:function' -> the function (references and prepare hooks)."""
    mod, _, fn = path.partition(":")
    return getattr(importlib.import_module(mod), fn)


# ---- correctness and determinism ------------------------------------------------------------------------


def reference_outputs(fam: Family, spec: S.LaunchSpec, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    if not fam.qualify.reference:
        return None
    fn = load_callable(fam.qualify.reference)
    args: dict[str, object] = {}
    for b in spec.all_buffers:
        if b.name in inputs:
            args[b.name] = S.as_f64(inputs[b.name], b.dtype)
        else:
            args[b.name] = np.full(b.count, np.nan) if b.dtype in S.FLOAT_DTYPES else np.zeros(b.count, np.int64)
    for s in spec.scalars:
        args[s.name] = s.value
    return fn(args, dict(spec.dims))


def make_inputs(spec: S.LaunchSpec, corpus: str, rng: np.random.Generator, nonfinite: bool) -> dict[str, np.ndarray]:
    return {b.name: fills.make_input(b, corpus, rng, nonfinite=nonfinite) for b in spec.all_buffers if b.needs_fill}


def check_outputs(spec: S.LaunchSpec, outs: dict[str, bytes], ref: dict[str, np.ndarray] | None,
                  alt: dict[str, bytes] | None = None) -> tuple[bool, str]:
    """The outputs `outs` (a run poisoned with POISON) against the reference. An element still all POISON bytes
    was not written, unless the reference expects that very value (NaN, or all ones for integers) and `alt`
    (the same run poisoned with POISON_ALT) holds the same bytes there: then the kernel wrote it. Without `alt`
    (under the sanitizer) the reference's value alone exempts it. A reference must name every output, no more."""
    if ref is not None:
        names = [b.name for b in spec.outputs]
        missing = [n for n in names if n not in ref]
        extra = sorted(set(ref) - set(names))
        if missing or extra:
            said = []
            if missing:
                said.append(f"has no output {', '.join(map(repr, missing))}")
            if extra:
                said.append(f"returns {', '.join(map(repr, extra))}, not an output of the launch")
            return False, f"the reference {' and '.join(said)} (outputs: {', '.join(names)})"
    notes = []
    for b in spec.outputs:
        raw = outs[b.name]
        got = S.from_bytes(raw, b.dtype)
        unw = unwritten_mask(raw, b.dtype)
        expected = None if ref is None else ref[b.name]
        if expected is not None and unw.any():
            e = np.asarray(expected, dtype=np.float64).reshape(-1)
            if e.size == unw.size:
                # an element the reference expects to be NaN (floats) or all-ones (integers: -1, max) may
                # legitimately hold the poison pattern, where the kernel wrote it (the other poison run agrees)
                poison_value = float(S.from_bytes(bytes([POISON]) * DTYPE_SIZES[b.dtype], b.dtype)[0])
                may = np.isnan(e) | (e == poison_value)
                if alt is not None:
                    size = DTYPE_SIZES[b.dtype]
                    x = np.frombuffer(raw, np.uint8).reshape(-1, size)
                    y = np.frombuffer(alt[b.name], np.uint8).reshape(-1, size)
                    may &= np.all(x == y, axis=1)
                unw &= ~may
        if unw.any():
            return False, f"{b.name}: {int(unw.sum())} of {b.count} elements not written (first at {int(np.argmax(unw))})"
        if expected is None:
            notes.append(f"{b.name}: written")
            continue
        rtol, atol = spec.tolerance[b.name]
        ok, detail = compare(got.astype(np.float64) if b.dtype in S.FLOAT_DTYPES else got, expected, b.dtype,
                             rtol, atol, spec.exact)
        if not ok:
            return False, f"{b.name}: {detail}"
        notes.append(f"{b.name}: {detail}")
    return True, "; ".join(notes)


def first_difference(a: dict[str, bytes], b: dict[str, bytes]) -> str:
    for name in sorted(a):
        x, y = a[name], b.get(name, b"")
        if x != y:
            xa, ya = np.frombuffer(x, np.uint8), np.frombuffer(y, np.uint8)
            if xa.size != ya.size:
                return f"{name}: sizes differ"
            return f"{name}: {int((xa != ya).sum())} bytes differ, first at byte {int(np.argmax(xa != ya))}"
    return ""

__all__ = ["check_outputs", "compare", "digest", "first_difference", "load_callable", "make_inputs", "reference_outputs",
           "unwritten_mask"]
