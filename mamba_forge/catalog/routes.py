"""The catalog's GEMM route table (``kernels/routes.toml``): its schema, its expansion into typed records, and
every rule about a route checked when the catalog loads.

A route serves one key ``(layout, a, b, c)``. Its **classes** are tried in order; a class holds rungs that compute
the same per-element arithmetic, so the selector (:mod:`mamba_forge.runtime.routes`) may choose among them by M
without a row's bits depending on M. The first rung of a class with an unbounded M range is its **reference**:
the qualifier's ``route-equivalence`` check (:mod:`mamba_forge.qualify.equivalence`) runs every rung of a
multi-rung class on the same inputs at :data:`EQUIVALENCE_M` and rejects a rung whose output differs in any bit
from the reference's. **Force** rungs serve only when asked for by name.

Rules checked here (a CatalogError names the route and the problem): keys are known and unique; every symbol
name exists in the catalog, every pattern matches some symbol over the route's expansions; a rung's A, B and C
parameters have the key's storage dtypes and, in a multi-rung class, the same pointer parameters as the
reference; M ranges are well formed and each class has an unbounded rung; nn/nt rungs never constrain M (M is
the batch dimension there); a symbol serves one role per key; the check shape meets every rung's divisibility.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mamba_forge.core.errors import CatalogError
from mamba_forge.core.vocab import GEMM_KEY_DTYPES, LAYOUTS, STORAGE

EQUIVALENCE_M = (1, 3, 17, 64, 256, 1000)  # the M values route-equivalence compares rungs at
NEEDS_DIMS = ("m", "n", "k")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RungEntry(_Model):
    symbols: str = Field(min_length=1, max_length=200)  # a name, or an fnmatch pattern
    m: tuple[int, int] = (1, 0)  # [lo, hi]; hi = 0: unbounded
    needs: dict[str, int] = Field(default_factory=dict)  # dim -> multiple

    @field_validator("needs")
    @classmethod
    def _needs(cls, v: dict[str, int]) -> dict[str, int]:
        for dim, mult in v.items():
            if dim not in NEEDS_DIMS:
                raise ValueError(f"needs names {dim!r}; known dims: {', '.join(NEEDS_DIMS)}")
            if isinstance(mult, bool) or not 1 <= mult <= 1024:
                raise ValueError(f"needs.{dim} must be an integer in 1..1024, got {mult!r}")
        return v

    @field_validator("m")
    @classmethod
    def _m(cls, v: tuple[int, int]) -> tuple[int, int]:
        lo, hi = v
        if lo < 1 or hi < 0 or (hi and hi < lo) or max(lo, hi) > 1 << 31:
            raise ValueError(f"m = [{lo}, {hi}] is not a range [lo >= 1, hi >= lo] (hi = 0: unbounded)")
        return v


class ClassEntry(_Model):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    rungs: list[RungEntry] = Field(min_length=1, max_length=64)
    check: dict[str, int] = Field(default_factory=dict)  # N, K of the route-equivalence check
    where: dict[str, tuple[int, int]] = Field(default_factory=dict)  # n / k -> [lo, hi] the class serves (hi 0: any)

    @field_validator("where")
    @classmethod
    def _where(cls, v: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        for dim, (lo, hi) in v.items():
            if dim not in ("n", "k"):
                raise ValueError(f"where names {dim!r}; a class's region is over n and k only (never m)")
            if lo < 1 or hi < 0 or (hi and hi < lo) or max(lo, hi) > 1 << 31:
                raise ValueError(f"where.{dim} = [{lo}, {hi}] is not a range [lo >= 1, hi >= lo] (hi = 0: unbounded)")
        return v

    @field_validator("check")
    @classmethod
    def _check(cls, v: dict[str, int]) -> dict[str, int]:
        if v and set(v) != {"N", "K"}:
            raise ValueError(f"check names {sorted(v)}; it takes exactly N and K")
        for dim, n in v.items():
            if isinstance(n, bool) or not 1 <= n <= 4096:
                raise ValueError(f"check.{dim} must be an integer in 1..4096, got {n!r}")
        return v


Token = Field(min_length=1, max_length=32)  # a key part or a variant: short words, never echoed at length


class RouteEntry(_Model):
    layout: str = Token
    a: str = Token
    b: str = Token
    c: str = Token
    variants: list[str] = Field(default_factory=list, max_length=8)  # expands {dtype}
    layouts: list[str] = Field(default_factory=list, max_length=3)  # expands {layout}

    @field_validator("variants", "layouts")
    @classmethod
    def _words(cls, v: list[str]) -> list[str]:
        for w in v:
            if not 1 <= len(w) <= 32:
                raise ValueError("variants and layouts are short words (1..32 characters)")
        return v
    classes: list[ClassEntry] = Field(default_factory=list, max_length=64)
    force: list[RungEntry] = Field(default_factory=list, max_length=64)


class RouteFile(_Model):
    route: list[RouteEntry] = Field(min_length=1, max_length=256)


# ---- expanded records -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteRung:
    symbol: str
    eq_class: str  # the equivalence class's name ("" for a force rung)
    mode: str  # "auto" | "force"
    m_min: int
    m_max: int  # 0: unbounded
    needs: tuple[tuple[str, int], ...]  # (dim, multiple), dims in m, n, k order
    bias: bool  # takes a bias pointer
    n_range: tuple[int, int] = (1, 0)  # the class's region (`where`): N and K it serves, hi 0 = unbounded
    k_range: tuple[int, int] = (1, 0)


@dataclass(frozen=True)
class RouteClass:
    name: str
    rungs: tuple[RouteRung, ...]  # auto rungs, in order; rungs[reference] is the reference
    check: tuple[int, int]  # (N, K) of the route-equivalence check; (0, 0) for a one-rung class

    @property
    def reference(self) -> RouteRung:
        """The first rung that serves every M: what the others are compared with."""
        return next(r for r in self.rungs if r.m_min == 1 and r.m_max == 0)


@dataclass(frozen=True)
class Route:
    layout: str
    a: str
    b: str
    c: str
    classes: tuple[RouteClass, ...]
    force: tuple[RouteRung, ...]
    tuning: tuple = ()  # route_tuning.TuneRule records: which rung of a class serves first at which (N, K, M)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.layout, self.a, self.b, self.c

    def rungs(self):
        for c in self.classes:
            yield from c.rungs
        yield from self.force


def check_m_values(rung: RouteRung) -> list[int]:
    """The M values the equivalence check runs a rung at: EQUIVALENCE_M rounded up to the rung's M multiple."""
    mult = dict(rung.needs).get("m", 1)
    return sorted({-(-m // mult) * mult for m in EQUIVALENCE_M})


# ---- expansion and rules ------------------------------------------------------------------------------------


def _shown(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:60] + "…")


def _fmt(text: str, env: dict[str, str], where: str) -> str:
    out = text
    for k, v in env.items():
        out = out.replace("{" + k + "}", v)
    if "{" in out or "}" in out:
        raise CatalogError(f"{where}: {_shown(text)} names a field other than {{dtype}} / {{layout}}")
    return out


def _ptr_params(sym, catalog) -> dict[str, tuple[str, tuple[str, ...], str, str, str]]:
    """name -> (dtype, shape expressions, role, fill, in_place_of) of a symbol's pointer parameters (dtype keys
    resolved)."""
    fam = catalog.module(sym.module).family(sym.family)
    out = {}
    for p in fam.params:
        if p.type == "ptr":
            dt = sym.params_env.get(p.dtype, p.dtype) if p.dtype else ""
            out[p.name] = (str(dt), tuple(p.shape), str(p.role), str(p.fill), str(p.in_place_of))
    return out


def expand_routes(data: Any, path: Path, catalog) -> tuple[Route, ...]:
    """Validate a routes file against the loaded catalog and expand it into Route records."""
    from mamba_forge.catalog.model import _validate  # one pydantic-error formatter for every catalog file

    rf: RouteFile = _validate(RouteFile, data, path)
    symbols = catalog.symbols
    names = sorted(symbols)
    routes: list[Route] = []
    seen_keys: dict[tuple[str, str, str, str], str] = {}
    for ri, entry in enumerate(rf.route):
        rwhere = f"{path}: route[{ri}]"
        envs = [dict(zip(("dtype", "layout"), combo, strict=True)) for combo in
                itertools.product(entry.variants or [""], entry.layouts or [""])]
        matched: dict[str, int] = {}  # pattern -> matches over the expansions
        for env in envs:
            env = {k: v for k, v in env.items() if v}
            key = tuple(_fmt(t, env, rwhere) for t in (entry.layout, entry.a, entry.b, entry.c))
            where = f"{rwhere} ({' '.join(key)})"
            layout, a, b, c = key
            if layout not in LAYOUTS:
                raise CatalogError(f"{where}: unknown layout {_shown(layout)}; known: {', '.join(LAYOUTS)}")
            for t in (a, b, c):
                if t not in GEMM_KEY_DTYPES:
                    raise CatalogError(f"{where}: unknown dtype {_shown(t)}; known: {', '.join(GEMM_KEY_DTYPES)}")
            if c == "tf32":
                raise CatalogError(f"{where}: tf32 is a math mode for A and B; C is stored as f32")
            if key in seen_keys:
                raise CatalogError(f"{where}: key already routed by {seen_keys[key]}")
            seen_keys[key] = where
            if not entry.classes and not entry.force:
                raise CatalogError(f"{where}: a route needs at least one class or force rung")
            kx = _KeyExpansion(key, env, names, catalog, matched)
            classes = []
            seen_classes: set[str] = set()
            for ci, ce in enumerate(entry.classes):
                cwhere = f"{where}: class[{ci}] ({ce.name})"
                if ce.name in seen_classes:
                    raise CatalogError(f"{cwhere}: class named twice in this route")
                seen_classes.add(ce.name)
                region = {"n_range": tuple(ce.where.get("n", (1, 0))), "k_range": tuple(ce.where.get("k", (1, 0)))}
                rungs = tuple(dataclasses.replace(x, **region)
                              for r in ce.rungs for x in kx.rungs(r, ce.name, "auto", cwhere))
                if not rungs:
                    continue  # a pattern matching nothing in this variant
                if not any(r.m_min == 1 and r.m_max == 0 for r in rungs):
                    raise CatalogError(f"{cwhere}: no rung serves every M (give one m = [1, 0]); "
                                       "a class must serve all M so the pick never depends on M")
                check = (ce.check.get("N", 0), ce.check.get("K", 0))
                for dim, v in (("n", check[0]), ("k", check[1])):
                    lo, hi = region[f"{dim}_range"]
                    if v and not (lo <= v and (hi == 0 or v <= hi)):
                        raise CatalogError(f"{cwhere}: check {dim.upper()} = {v} is outside the class's region "
                                           f"where.{dim} = [{lo}, {hi}]; the check must run a shape it serves")
                if len(rungs) > 1:
                    if not ce.check:
                        raise CatalogError(f"{cwhere}: a class of {len(rungs)} rungs needs check = {{ N, K }} "
                                           "for its route-equivalence check")
                    _check_class(rungs, check, catalog, cwhere)
                classes.append(RouteClass(ce.name, rungs, check))
            force = tuple(x for r in entry.force for x in kx.rungs(r, "", "force", f"{where}: force"))
            routes.append(Route(layout, a, b, c, tuple(classes), force))
        for pattern, count in matched.items():
            if count == 0:
                raise CatalogError(f"{rwhere}: pattern {_shown(pattern)} matches no symbol of the catalog")
    return tuple(routes)


class _KeyExpansion:
    """The rungs of one expanded key: patterns resolved against the catalog, each symbol in one role."""

    def __init__(self, key: tuple[str, str, str, str], env: dict[str, str], names: list[str], catalog,
                 matched: dict[str, int]):
        self.key, self.env, self.names, self.catalog, self.matched = key, env, names, catalog, matched
        self.role: dict[str, str] = {}  # symbol -> where it serves in this key

    def rungs(self, r: RungEntry, eq_class: str, mode: str, where: str) -> list[RouteRung]:
        layout, a, b, c = self.key
        symbols = self.catalog.symbols
        pattern = _fmt(r.symbols, self.env, where)
        wild = any(ch in pattern for ch in "*?[")
        hits = ([n for n in self.names if fnmatch.fnmatchcase(n, pattern)] if wild
                else [pattern] if pattern in symbols else [])
        self.matched[r.symbols] = self.matched.get(r.symbols, 0) + len(hits)
        if not wild and not hits:
            raise CatalogError(f"{where}: symbol {_shown(pattern)} is not in the catalog")
        if mode == "force" and r.m != (1, 0):
            raise CatalogError(f"{where}: a force rung serves only by name and takes no M range")
        if "m" in r.needs and layout != "tn":
            raise CatalogError(f"{where}: an {layout} rung may not constrain M (it is the batch dimension)")
        out = []
        for n in hits:
            if n in self.role:
                raise CatalogError(f"{where}: {n} already serves this key ({self.role[n]})")
            self.role[n] = f"class {eq_class}" if eq_class else "force"
            params = _ptr_params(symbols[n], self.catalog)
            for operand, want in (("A", STORAGE[a]), ("B", STORAGE[b]), ("C", c)):
                got = params.get(operand, ("", ()))[0]
                if got != want:
                    raise CatalogError(f"{where}: {n} has {operand} of dtype {got or 'none'}; this key needs {want}")
            needs = tuple((d, r.needs[d]) for d in NEEDS_DIMS if d in r.needs)
            out.append(RouteRung(n, eq_class, mode, r.m[0], r.m[1], needs, "bias" in params))
        return out


def _check_class(rungs: tuple[RouteRung, ...], check: tuple[int, int], catalog, where: str) -> None:
    """A multi-rung class: the check shape meets every rung's divisibility; every rung qualifies over M, N, K and
    has the reference's pointer parameters (names, dtypes, shapes, roles, fills, in_place_of), so the equivalence
    check feeds them the same buffers and the runtime launches either on the same memory."""
    ref = next(r for r in rungs if r.m_min == 1 and r.m_max == 0)
    ref_params = _ptr_params(catalog.symbols[ref.symbol], catalog)
    n, k = check
    for r in rungs:
        for dim, mult in r.needs:
            v = {"n": n, "k": k}.get(dim)
            if v is not None and v % mult:
                raise CatalogError(f"{where}: check {dim.upper()} = {v} is not a multiple of {mult}, "
                                   f"which {r.symbol} needs")
        sym = catalog.symbols[r.symbol]
        dims = set(catalog.module(sym.module).family(sym.family).qualify.dims)
        if dims != {"M", "N", "K"}:
            raise CatalogError(f"{where}: {r.symbol} qualifies over dims {sorted(dims)}; a rung of a checked class "
                               "takes exactly M, N and K")
        got = _ptr_params(sym, catalog)
        if got != ref_params:
            raise CatalogError(f"{where}: {r.symbol} takes pointer parameters {sorted(got)} unlike the class "
                               f"reference {ref.symbol} ({sorted(ref_params)}); equivalent rungs share them")


def route_class_of(routes: tuple[Route, ...]) -> dict[str, list[tuple[Route, RouteClass]]]:
    """symbol -> the (route, class) pairs of the multi-rung classes it belongs to (what it is checked in)."""
    out: dict[str, list[tuple[Route, RouteClass]]] = {}
    for r in routes:
        for c in r.classes:
            if len(c.rungs) > 1:
                for rung in c.rungs:
                    out.setdefault(rung.symbol, []).append((r, c))
    return out


__all__ = ["EQUIVALENCE_M", "Route", "RouteClass", "RouteRung", "check_m_values", "expand_routes",
           "route_class_of"]
