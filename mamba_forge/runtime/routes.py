"""GEMM route selection: which admitted symbol serves a GEMM of a given layout, dtypes and shape.

Standard library and the manifest schema only (the runtime imports it in milliseconds). The route table is the
qualified manifest's ``[[routes]]``: per key ``(layout, a, b, c)`` the rungs of the catalog's route file
(``kernels/routes.toml``) whose symbols the manifest qualified on its device, each with its equivalence class,
mode, M range, divisibility needs and bias flag. Which of them serve (admitted, loaded) is the caller's
``serves`` predicate: a rejected rung is skipped, and its class's other rungs (its controls) still serve.

:func:`select`, for a key and (M, N, K):

1. walks the key's classes in order, then the layout's exact f32 classes (served with casts); a class serves
   when one of its admitted **auto** rungs that serves every M (``m = [1, 0]``) fits (N, K): its class's region
   (``where``: the N and K ranges it serves), the divisibility needs (and M's for ``tn``, where M is a feature
   dimension) and the bias request: so which class serves never depends on M;
2. within that class takes the rung of the route's tuning rule (``tuning``: kernels/route_tuning.toml, measured
   by benchmarks/tune_routes.py) whose N, K and M ranges hold the shape, when that rung fits and serves here;
   else the first fitting rung whose M range holds M. The rungs of a class were proven bit-identical on the
   device (the qualifier's ``route-equivalence`` check), so a row's bits do not depend on M, N, K or on which
   rung served it;
3. ``symbol=`` asks for one rung by name (force rungs serve only that way) and refuses one that does not fit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from mamba_forge.core.schema import QRoute, QRung
from mamba_forge.core.vocab import GEMM_KEY_DTYPES, LAYOUTS, STORAGE


class NoRoute(LookupError):
    """No admitted symbol serves this GEMM: names the key, the shape and what was tried."""


@dataclass(frozen=True)
class Route:
    """The selector's answer."""

    symbol: str
    layout: str
    a: str  # the symbol's native dtypes (the route key that holds it)
    b: str
    c: str
    cast: bool  # the caller converts A/B to the symbol's dtypes and C from them (an exact-f32 fallback)
    bias: bool  # the symbol takes a bias pointer
    eq_class: str  # the rung's equivalence class ("" for a force rung)


def _key(layout: str, a: str, b: str, c: str) -> tuple[str, str, str, str]:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    for t in (a, b, c):
        if t not in GEMM_KEY_DTYPES:
            raise ValueError(f"unknown dtype {t!r}; known: {', '.join(GEMM_KEY_DTYPES)}")
    if c == "tf32":
        raise ValueError("tf32 is a math mode for A and B; C is stored as f32")
    return layout, a, b, c


def _fits(rung: QRung, m: int, n: int, k: int, layout: str, bias: bool) -> bool:
    if bias and not rung.bias:
        return False
    if not (_within(rung.n_min, rung.n_max, n) and _within(rung.k_min, rung.k_max, k)):
        return False  # outside its class's region (N, K only: the class never depends on M)
    dims = {"m": m if layout == "tn" else 0, "n": n, "k": k}  # nn / nt: M never decides (batch invariance)
    return all(dims.get(d, 0) % mult == 0 for d, mult in rung.needs.items())


def _serves_all(rung: QRung) -> bool:
    return rung.m_min == 1 and rung.m_max == 0


def _in_range(rung: QRung, m: int) -> bool:
    return _within(rung.m_min, rung.m_max, m)


def _tuned(route: QRoute, eq_class: str, fitting: list[QRung], m: int, n: int, k: int) -> QRung | None:
    """The fitting rung a tuning rule of this class names for (N, K, M), or None (the class's own order serves).
    Rules of a class never overlap (checked when the catalog loads), so the first that holds is the only one."""
    for t in route.tuning or ():
        if t.eq_class == eq_class and _within(t.n_min, t.n_max, n) and _within(t.k_min, t.k_max, k) \
                and _within(t.m_min, t.m_max, m):
            return next((r for r in fitting if r.symbol == t.symbol), None)
    return None


def _within(lo: int, hi: int, v: int) -> bool:
    return lo <= v and (hi == 0 or v <= hi)


def _lists(table: Iterable[QRoute], key: tuple[str, str, str, str]) -> list[tuple[QRoute, bool]]:
    """(route, served with casts) pairs to walk: the key's own, then its layout's exact f32 route."""
    rows = list(table)
    exact = (key[0], "f32", "f32", "f32")
    own = [(r, False) for r in rows if (r.layout, r.a, r.b, r.c) == key]
    if key == exact:
        return own
    cast = not (STORAGE[key[1]] == "f32" and STORAGE[key[2]] == "f32" and key[3] == "f32")  # tf32 needs none
    return own + [(r, cast) for r in rows if (r.layout, r.a, r.b, r.c) == exact]


def _answer(route: QRoute, rung: QRung, cast: bool) -> Route:
    return Route(rung.symbol, route.layout, route.a, route.b, route.c, cast, rung.bias, rung.eq_class)


def select(
    table: Iterable[QRoute],
    m: int,
    n: int,
    k: int,
    a: str,
    b: str,
    c: str,
    layout: str = "nn",
    *,
    bias: bool = False,
    symbol: str | None = None,
    serves: Callable[[str], bool] | None = None,
) -> Route:
    """The rung that serves this GEMM (see the module docstring); raises NoRoute when nothing fits.
    `serves(name)`: whether a rung's symbol is available (default: every rung of the table)."""
    key = _key(layout, a, b, c)
    for name, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    lists = _lists(table, key)
    ok = serves or (lambda _name: True)
    if symbol is not None:
        for route, cast in lists:
            for rung in route.rungs:
                if rung.symbol == symbol:
                    if not ok(symbol):
                        raise NoRoute(f"{symbol} is a rung of the {layout} {a}x{b}->{c} route but does not serve "
                                      "on this device (rejected or not loaded: see the load summary)")
                    if not _fits(rung, m, n, k, layout, bias):
                        raise NoRoute(f"{symbol} does not serve {layout} {a}x{b}->{c} at M={m}, N={n}, K={k}"
                                      + (" with a bias" if bias else "") + f" (needs {rung.needs or 'nothing'}"
                                      + (", no bias)" if not rung.bias else ")"))
                    return _answer(route, rung, cast)
        raise NoRoute(f"{symbol} is not an admitted rung of the {layout} {a}x{b}->{c} route"
                      " (or of its exact f32 fallback)")
    tried: list[str] = []
    for route, cast in lists:
        classes: dict[str, list[QRung]] = {}
        for rung in route.rungs:
            if rung.mode == "auto" and ok(rung.symbol):
                classes.setdefault(rung.eq_class, []).append(rung)
        for eq_class, rungs in classes.items():
            fitting = [r for r in rungs if _fits(r, m, n, k, layout, bias)]
            tried += [r.symbol for r in rungs]
            if not any(_serves_all(r) for r in fitting):
                continue  # this class cannot serve every M at this (N, K): never let M pick the class
            rung = _tuned(route, eq_class, fitting, max(m, 1), n, k) \
                or next(r for r in fitting if _in_range(r, max(m, 1)))
            return _answer(route, rung, cast)
    raise NoRoute(
        f"no admitted GEMM symbol serves {layout} {a}x{b}->{c} at N={n}, K={k}"
        + (" with a bias" if bias else "")
        + (f"; tried {', '.join(tried)}" if tried else "; the route table has no symbol for it")
    )


def skipped(table: Iterable[QRoute], serves: Callable[[str], bool]) -> dict[str, list[str]]:
    """Per route ("nn bf16xbf16->bf16"), the rungs that do not serve (for the load summary), in route order."""
    out: dict[str, list[str]] = {}
    for r in table:
        names = [x.symbol for x in r.rungs if not serves(x.symbol)]
        if names:
            out[f"{r.layout} {r.a}x{r.b}->{r.c}"] = names
    return out


__all__ = ["NoRoute", "Route", "select", "skipped"]
