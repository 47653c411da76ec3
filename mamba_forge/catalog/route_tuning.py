"""The catalog's GEMM route tuning table (``kernels/route_tuning.toml``): which rung of a route class serves first
at which (N, K, M), as measured on a device (``benchmarks/tune_routes.py`` writes the table).

The rungs of a class compute the same bits (the qualifier's ``route-equivalence`` check), so which of them serves
may depend on N, K and M without changing an output bit; the class itself is still chosen from (N, K, bias) and
admission alone (:mod:`mamba_forge.runtime.routes`). A ``[[tune]]`` entry names a route key, one of its classes,
and ``rules``: each an auto rung of that class (``symbol``) with ranges ``n``, ``k``, ``m`` = ``[lo, hi]`` (hi = 0:
unbounded; default [1, 0]). Having chosen the class, the selector takes the rule whose ranges hold (N, K, M) when
its rung serves there (admitted on the device, divisibility, bias); otherwise the class's own rung order.

Rules checked here (a one-line CatalogError naming the entry): the key is routed and the class is one of its
classes; a (key, class) has one entry over every tuning file; each symbol is in the catalog and an auto rung of
that class in that key; ranges are well formed; a range holds some value its rung's divisibility needs allow (a
rule its rung can never serve is dead); no two rules of one class overlap (so at most one rule holds anywhere).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from mamba_forge.core.errors import CatalogError

DIMS = ("n", "k", "m")  # the order a rule's ranges are written and compared in


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TuneRuleEntry(_Model):
    symbol: str = Field(min_length=1, max_length=200)  # one symbol name (no pattern: a rule is one measurement)
    n: tuple[int, int] = (1, 0)  # [lo, hi]; hi = 0: unbounded
    k: tuple[int, int] = (1, 0)
    m: tuple[int, int] = (1, 0)

    @field_validator("n", "k", "m")
    @classmethod
    def _range(cls, v: tuple[int, int], info: ValidationInfo) -> tuple[int, int]:
        lo, hi = v
        if lo < 1 or hi < 0 or (hi and hi < lo) or max(lo, hi) > 1 << 31:
            raise ValueError(f"{info.field_name} = [{lo}, {hi}] is empty or not a range [lo >= 1, hi >= lo] "
                             "(hi = 0: unbounded)")
        return v


Token = Field(min_length=1, max_length=32)


class TuneEntry(_Model):
    layout: str = Token
    a: str = Token
    b: str = Token
    c: str = Token
    class_: str = Field(alias="class", pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    rules: list[TuneRuleEntry] = Field(min_length=1, max_length=1024)


class TuneFile(_Model):
    tune: list[TuneEntry] = Field(default_factory=list, max_length=256)


@dataclass(frozen=True)
class TuneRule:
    """One expanded rule: in class `eq_class`, at (N, K, M) within n, k, m (hi 0: unbounded), `symbol` first."""

    eq_class: str
    symbol: str
    n: tuple[int, int]
    k: tuple[int, int]
    m: tuple[int, int]


def _meet(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether two ranges share a value (hi 0: unbounded)."""
    return (a[1] == 0 or b[0] <= a[1]) and (b[1] == 0 or a[0] <= b[1])


def _has_multiple(r: tuple[int, int], mult: int) -> bool:
    lo, hi = r
    return hi == 0 or -(-lo // mult) * mult <= hi


def _fmt(r: tuple[int, int]) -> str:
    return f"[{r[0]}, {r[1]}]"


def apply_tuning(data: Any, path: Path, routes: tuple, catalog) -> tuple:
    """Validate a tuning file against the loaded catalog and its expanded routes; the routes with their `tuning`
    rules added (each route's rules in file order)."""
    from mamba_forge.catalog.model import _validate  # one pydantic-error formatter for every catalog file

    tf: TuneFile = _validate(TuneFile, data, path)
    by_key = {r.key: i for i, r in enumerate(routes)}
    out = list(routes)
    for ti, entry in enumerate(tf.tune):
        key = (entry.layout, entry.a, entry.b, entry.c)
        where = f"{path}: tune[{ti}] ({' '.join(key)} / {entry.class_})"
        if key not in by_key:
            raise CatalogError(f"{where}: no route serves this key (routes files: [[route]])")
        route = out[by_key[key]]
        cls = next((c for c in route.classes if c.name == entry.class_), None)
        if cls is None:
            raise CatalogError(f"{where}: the route has no class {entry.class_!r}; its classes: "
                               f"{', '.join(c.name for c in route.classes) or 'none'}")
        if any(t.eq_class == cls.name for t in route.tuning):
            raise CatalogError(f"{where}: this class is already tuned (one [[tune]] entry per key and class)")
        rungs = {r.symbol: r for r in cls.rungs}
        rules: list[TuneRule] = []
        for ri, re in enumerate(entry.rules):
            rwhere = f"{where}: rules[{ri}] ({re.symbol})"
            if re.symbol not in catalog.symbols:
                raise CatalogError(f"{rwhere}: symbol is not in the catalog")
            rung = rungs.get(re.symbol)
            if rung is None:
                raise CatalogError(f"{rwhere}: not an auto rung of class {cls.name} in this key (rules choose among "
                                   "a class's rungs, which compute the same bits)")
            ranges = {"n": re.n, "k": re.k, "m": re.m}
            for dim, mult in rung.needs:
                if (dim != "m" or key[0] == "tn") and not _has_multiple(ranges[dim], mult):
                    raise CatalogError(f"{rwhere}: {dim} = {_fmt(ranges[dim])} holds no multiple of {mult}, which "
                                       "the rung needs: the rule could never serve")
            rule = TuneRule(cls.name, re.symbol, re.n, re.k, re.m)
            for j, other in enumerate(rules):
                if all(_meet(getattr(rule, d), getattr(other, d)) for d in DIMS):
                    raise CatalogError(f"{rwhere}: its ranges n {_fmt(re.n)}, k {_fmt(re.k)}, m {_fmt(re.m)} overlap "
                                       f"rules[{j}] ({other.symbol}); one rule per (N, K, M)")
            rules.append(rule)
        out[by_key[key]] = dataclasses.replace(route, tuning=route.tuning + tuple(rules))
    return tuple(out)


__all__ = ["DIMS", "TuneFile", "TuneRule", "apply_tuning"]
