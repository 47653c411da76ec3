"""The ``route-equivalence`` check: the rungs of one GEMM route class (kernels/routes.toml) compute the same bits.

The selector (mamba_forge.runtime.routes) chooses among a class's rungs by M, so a row's bits would depend on M
unless every rung of the class gives bitwise the same output. Proven in two steps:

* in the worker (:func:`digests`), each rung of a multi-rung class runs at :func:`check_m_values` (1, 3, 17, 64,
  256, 1000) with the class's check N and K, on inputs drawn from the run's seed and the class and M alone, so
  every rung of the class sees the same A, B (and bias) whichever worker runs it; one ``route-equivalence``
  check record per M carries the output's sha256;
* after all workers (:func:`apply`), every admitted rung's digests are compared with the class reference's (its
  first rung serving every M that is admitted here); a rung that differs at any M is rejected with the first M
  that differs. A reference that was itself rejected hands the role to the next unbounded rung.
"""

from __future__ import annotations

import hashlib

import numpy as np

from mamba_forge.catalog.routes import Route, RouteClass, check_m_values, route_class_of
from mamba_forge.qualify.events import CheckResult, SymbolResult

CHECK = "route-equivalence"


def label(route: Route, cls: RouteClass) -> str:
    return f"{route.layout} {route.a}x{route.b}->{route.c} / {cls.name}"


def memberships(catalog, name: str) -> list[tuple[Route, RouteClass]]:
    """The multi-rung classes `name` is a rung of (empty for most symbols)."""
    return route_class_of(catalog.routes).get(name, []) if catalog.routes else []


def _detail(lbl: str, m: int) -> str:
    return f"{lbl} at M={m}"


def _rng(seed: int, lbl: str, m: int, buffer: str) -> np.random.Generator:
    h = hashlib.sha256(f"{seed}:{lbl}:{m}:{buffer}".encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def digests(run, fn, prepare, seed: int) -> list[CheckResult]:
    """Run the symbol of `run` (a worker SymbolRun) at every check M of each class it belongs to; one passed
    check record per (class, M) whose digest is the output's sha256 (compared by :func:`apply`)."""
    from mamba_forge.qualify import checks as C
    from mamba_forge.qualify import fills

    out: list[CheckResult] = []
    for route, cls in memberships(run.catalog, run.name):
        lbl = label(route, cls)
        rung = next(r for r in cls.rungs if r.symbol == run.name)
        n, k = cls.check
        for m in check_m_values(rung):
            spec = run.spec_at({**run.fam.qualify.dims, "M": m, "N": n, "K": k})
            inputs = {b.name: fills.make_input(b, "uniform", _rng(seed, lbl, m, b.name))
                      for b in spec.all_buffers if b.needs_fill}
            inst = C.Instance(run.ctx, spec, fn, inputs, prepare)
            try:
                outs = inst.run()
            finally:
                inst.free()
            out.append(CheckResult(CHECK, True, C.digest(outs), _detail(lbl, m)))
    return out


def apply(results: dict[str, SymbolResult], routes: tuple[Route, ...]) -> list[str]:
    """Compare each admitted rung of every multi-rung class with the class reference; reject those that differ.
    Returns notes (one per class compared)."""
    notes: list[str] = []
    for route in routes:
        for cls in route.classes:
            if len(cls.rungs) < 2:
                continue
            lbl = label(route, cls)
            here = [(r, results[r.symbol]) for r in cls.rungs if r.symbol in results]
            ref = next(((r, res) for r, res in here if r.m_min == 1 and r.m_max == 0 and res.admitted), None)
            if ref is None:
                continue
            want = _by_m(ref[1], lbl)
            if not want:
                continue  # the reference recorded no digests (no main pass for it in this run): nothing to hold to
            compared = 0
            for r, res in here:
                if r is ref[0] or not res.admitted:
                    continue
                got = _by_m(res, lbl)
                bad = next((m for m in sorted(want) if got.get(m) != want[m]), None)
                missing = sorted(set(want) - set(got))
                if bad is not None or missing or not got:
                    m = bad if bad is not None else (missing[0] if missing else None)
                    why = (f"its output at M={m}, N={cls.check[0]}, K={cls.check[1]} differs in some bit from "
                           f"the class reference {ref[0].symbol}'s" if m is not None and got.get(m) is not None
                           else f"no digest at M={m} to compare with {ref[0].symbol}")
                    res.reject(CHECK, f"{r.symbol}: {lbl}: {why}; a rung that computes other bits may not share "
                                      "a route class (rows would depend on M)")
                    res.checks.append(CheckResult(CHECK, False, got.get(m, "") if m is not None else "", why))
                else:
                    res.checks.append(CheckResult(CHECK, True, want[max(want)],
                                                  f"{lbl}: bitwise equal to {ref[0].symbol} at M in {sorted(want)}"))
                    compared += 1
            if compared:
                ref[1].checks.append(CheckResult(CHECK, True, want[max(want)],
                                                 f"{lbl}: the class reference; {compared} rungs bitwise equal"))
            notes.append(f"{lbl}: {compared} rungs equal to {ref[0].symbol}")
    return notes


def _by_m(res: SymbolResult, lbl: str) -> dict[int, str]:
    prefix = f"{lbl} at M="
    out = {}
    for c in res.checks:
        if c.name == CHECK and c.detail.startswith(prefix) and c.passed:
            try:
                out[int(c.detail[len(prefix):])] = c.digest
            except ValueError:
                continue
    return out


__all__ = ["CHECK", "apply", "digests", "label", "memberships"]
