"""GEMM route selection: which admitted symbol serves a GEMM of a given layout, dtypes and shape.

Standard library and the manifest schema only (the runtime imports it in milliseconds).

* A **route key** is ``(layout, a, b, c)``: layout ``nn`` / ``tn`` / ``nt`` (see mf/gemm_common.cuh) and the
  dtype tokens of A, B and C. ``tf32`` for A and B means "f32 storage, TF32 math accepted".
* The **chain** (:data:`DEFAULT_CHAIN`) declares every GEMM family rung, fastest first: a symbol name or an
  ``fnmatch`` pattern, its native dtypes, the divisibility it needs of N, K (and, for ``tn`` only, M), and
  whether it takes a bias. It is the one place where the ordering lives.
* :func:`build_route_table` turns the chain and the set of admitted symbols into the qualified manifest's
  ``[[routes]]`` (one list per key, fastest first, admitted only), appending for every key the portable and
  finally the exact f32 symbols, so that a key whose fast rungs were rejected still routes.
* :func:`select` walks a key's list and returns the first symbol whose constraints hold.

Batch invariance: for ``nn`` and ``nt`` the pick never depends on M (M is the batch / token dimension there;
:func:`select` takes it only to validate it). For ``tn`` (dW = X^T dY) M is a feature dimension and K the
token dimension, which the reduction sums over anyway.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mamba_forge.manifest.schema import QRoute

LAYOUTS = ("nn", "tn", "nt")
DTYPES = ("f32", "tf32", "bf16", "f16")
STORAGE = {"f32": "f32", "tf32": "f32", "bf16": "bf16", "f16": "f16"}  # what a token is stored as


class NoRoute(LookupError):
    """No admitted symbol serves this GEMM: names the key, the shape and what was tried."""


@dataclass(frozen=True)
class Rung:
    """One family rung of the chain (fastest first)."""

    pattern: str  # a symbol name, or an fnmatch pattern over symbol names (matches are taken in name order)
    layout: str
    a: str  # native dtype tokens of the symbol
    b: str
    c: str
    align: tuple[tuple[str, int], ...] = ()  # (dim, multiple) it needs: dims "n", "k"; "m" only for layout tn
    bias: bool = True  # takes a bias pointer

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"rung {self.pattern}: unknown layout {self.layout!r}")
        for t in (self.a, self.b, self.c):
            if t not in DTYPES:
                raise ValueError(f"rung {self.pattern}: unknown dtype {t!r}")
        for dim, mult in self.align:
            if dim not in ("m", "n", "k") or mult < 1:
                raise ValueError(f"rung {self.pattern}: bad alignment ({dim!r}, {mult})")
            if dim == "m" and self.layout != "tn":
                raise ValueError(f"rung {self.pattern}: an {self.layout} route may not constrain M (batch invariance)")


@dataclass(frozen=True)
class Route:
    """The selector's answer."""

    symbol: str
    layout: str
    a: str  # the symbol's native dtypes
    b: str
    c: str
    cast: bool  # the caller converts A/B to the symbol's dtypes and C from them (an exact-f32 fallback)
    bias: bool  # the symbol takes a bias pointer


def _rungs_for_half(dt: str) -> list[Rung]:
    """nn rungs for bf16 / f16 inputs, output dt, fastest first."""
    a8 = (("n", 8), ("k", 8))
    return [
        Rung(f"gemm_bi_nn_sm100_tcgen_*_{dt}", "nn", dt, dt, dt, a8, bias=False),
        Rung(f"gemm_bi_nn_sm90a_wgmma_ws2_*_{dt}", "nn", dt, dt, dt, a8, bias=False),
        Rung(f"gemm_bi_nn_sm90a_wgmma_wg1_{dt}", "nn", dt, dt, dt, a8, bias=False),
        Rung(f"gemm_bi_nn_sm120_tma_128x128_bk32_s3_{dt}", "nn", dt, dt, dt),
        Rung(f"gemm_bi_nn_sm120_tma_128x128_bk32_s2_{dt}", "nn", dt, dt, dt),
        Rung(f"gemm_bi_nn_fixed_sm89_tc128_pipeline_v1_{dt}", "nn", dt, dt, dt, bias=False),
        Rung(f"gemm_bi_nn_fixed_sm89_tc128_swizzle_v1_{dt}", "nn", dt, dt, dt, bias=False),
        Rung(f"gemm_bi_nn_fixed_sm89_tc128_s3_v1_{dt}", "nn", dt, dt, dt, bias=False),
        # portable (Fixed module, sm_80+)
        Rung(f"gemm_bi_nn_tc128_{dt}", "nn", dt, dt, dt),
        Rung(f"gemm_bi_nn_tcwn64_{dt}", "nn", dt, dt, dt),
        Rung(f"gemm_bi_nn_tcw64_{dt}", "nn", dt, dt, dt),
        Rung(f"gemm_bi_nn_tc64_{dt}", "nn", dt, dt, dt),
        Rung(f"gemm_bi_{dt}_{dt}", "nn", dt, dt, dt),
        Rung(f"gemm_bi_nn_tc16_{dt}", "nn", dt, dt, dt),
    ]


def _rungs_half_f32out(dt: str) -> list[Rung]:
    return [
        Rung(f"gemm_bi_nn_sm120_tma_128x128_bk32_s3_f32out_{dt}", "nn", dt, dt, "f32"),
        Rung(f"gemm_bi_nn_tc128_f32out_{dt}", "nn", dt, dt, "f32"),
        Rung(f"triad_sm80_nn_{dt}", "nn", dt, dt, "f32"),
        Rung(f"gemm_bi_nn_tc64_f32out_{dt}", "nn", dt, dt, "f32"),
        Rung(f"gemm_bi_{dt}_f32", "nn", dt, dt, "f32"),
        Rung(f"gemm_bi_nn_tc16_f32out_{dt}", "nn", dt, dt, "f32"),
    ]


# Exact f32 rungs per layout: the last fallback of every key of that layout (with casts where dtypes differ).
EXACT = {
    "nn": [
        Rung("gemm_bi_f32_f32_n128_s2", "nn", "f32", "f32", "f32"),
        Rung("gemm_bi_f32_f32_s2", "nn", "f32", "f32", "f32"),
        Rung("triad_scalar_nn_f32", "nn", "f32", "f32", "f32"),
        Rung("gemm_bi_f32_f32", "nn", "f32", "f32", "f32"),
    ],
    "tn": [Rung("triad_scalar_tn_f32", "tn", "f32", "f32", "f32")],
    "nt": [Rung("triad_scalar_nt_f32", "nt", "f32", "f32", "f32")],
}

DEFAULT_CHAIN: tuple[Rung, ...] = tuple(
    _rungs_for_half("bf16")
    + _rungs_for_half("f16")
    + _rungs_half_f32out("bf16")
    + _rungs_half_f32out("f16")
    + [
        # TF32 math on f32 storage
        Rung("gemm_bi_nn_fixed_sm89_rna_tf32_v1_*", "nn", "tf32", "tf32", "f32", bias=False),
        Rung("gemm_bi_nn_sm120_tma_tf32_v1_m128n64_bk32_s3", "nn", "tf32", "tf32", "f32", bias=False),
        Rung("gemm_bi_nn_fixed_rna_wide_tf32_v1_m128n128_bk32_s3", "nn", "tf32", "tf32", "f32"),
        Rung("gemm_bi_nn_sm80_mma_tf32_v1_m128n128_bk32_s3", "nn", "tf32", "tf32", "f32"),
        Rung("triad_sm80_nn_tf32", "nn", "tf32", "tf32", "f32"),
        Rung("gemm_bi_nn_tf32_v1_m128n64_bk32_s3", "nn", "tf32", "tf32", "f32"),
        Rung("gemm_bi_nn_tf32_v1_m128n64_bk32_s2", "nn", "tf32", "tf32", "f32"),
        Rung("gemm_bi_nn_tf32_v1_m64n64_bk32_s3", "nn", "tf32", "tf32", "f32"),
        Rung("gemm_bi_nn_tf32_v1_m64n64_bk32_s2", "nn", "tf32", "tf32", "f32"),
        Rung("gemm_bi_nn_tf32_v1_m16n32_bk32_s4", "nn", "tf32", "tf32", "f32"),
        # exact f32 on arch-tuned tiles, then the portable ones
        Rung("gemm_bi_nn_fixed_sm89_f32_n64_copyplan_v1", "nn", "f32", "f32", "f32", bias=False),
        *EXACT["nn"],
        # training layouts
        Rung("gemm_bi_nt_sm90a_wgmma_ws2_*_bf16", "nt", "bf16", "bf16", "bf16", (("n", 8), ("k", 8)), bias=False),
        Rung("gemm_bi_nt_sm90a_wgmma_ws2_*_f16", "nt", "f16", "f16", "f16", (("n", 8), ("k", 8)), bias=False),
        Rung("gemm_bi_tn_sm90a_wgmma_ws2_*_bf16", "tn", "bf16", "bf16", "bf16", (("m", 8), ("n", 8)), bias=False),
        Rung("gemm_bi_tn_sm90a_wgmma_ws2_*_f16", "tn", "f16", "f16", "f16", (("m", 8), ("n", 8)), bias=False),
    ]
    + [Rung(f"triad_sm80_{lay}_{dt}", lay, dt, dt, "f32") for lay in ("tn", "nt") for dt in ("bf16", "f16")]
    + [Rung(f"triad_sm80_{lay}_tf32", lay, "tf32", "tf32", "f32") for lay in ("tn", "nt")]
    + EXACT["tn"]
    + EXACT["nt"]
)


def _accepts(requested: str, native: str) -> bool:
    """A rung of native dtype serves a requested dtype without casts: equal, or exact f32 serving TF32."""
    return requested == native or (requested == "tf32" and native == "f32")


def _key(layout: str, a: str, b: str, c: str) -> tuple[str, str, str, str]:
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; known: {', '.join(LAYOUTS)}")
    for t in (a, b, c):
        if t not in DTYPES:
            raise ValueError(f"unknown dtype {t!r}; known: {', '.join(DTYPES)}")
    if c == "tf32":
        raise ValueError("tf32 is a math mode for A and B; C is stored as f32")
    return layout, a, b, c


def _matches(rung: Rung, names: Sequence[str]) -> list[str]:
    if any(ch in rung.pattern for ch in "*?["):
        return sorted(n for n in names if fnmatch.fnmatchcase(n, rung.pattern))
    return [rung.pattern] if rung.pattern in names else []


def route_keys(chain: Sequence[Rung] = DEFAULT_CHAIN) -> list[tuple[str, str, str, str]]:
    """Every key the chain serves natively, in chain order (TF32 keys included)."""
    keys: list[tuple[str, str, str, str]] = []
    for r in chain:
        k = (r.layout, r.a, r.b, r.c)
        if k not in keys:
            keys.append(k)
    return keys


def build_route_table(admitted: Iterable[str], chain: Sequence[Rung] = DEFAULT_CHAIN) -> list[QRoute]:
    """The qualified manifest's [[routes]]: per key, the admitted symbols fastest first.

    Order per key: the chain's rungs of that key (native dtypes), then the exact f32 rungs of that layout
    (served with casts where the dtypes differ: ``select`` says so). Keys with no admitted symbol at all are
    left out. Each symbol appears once per key.
    """
    names = sorted(set(admitted))
    table = []
    for key in route_keys(chain):
        layout, a, b, c = key
        symbols: list[str] = []
        native = [r for r in chain if (r.layout, r.a, r.b, r.c) == key]
        fallback = [r for r in chain if r.layout == layout and r.a == r.b == r.c == "f32" and r not in native]
        for rung in native + fallback:
            for name in _matches(rung, names):
                if name not in symbols:
                    symbols.append(name)
        if symbols:
            table.append(QRoute(layout=layout, a=a, b=b, c=c, symbols=symbols))
    return table


def _rung_of(name: str, chain: Sequence[Rung]) -> Rung | None:
    for r in chain:
        if _matches(r, [name]):
            return r
    return None


def _fits(rung: Rung, m: int, n: int, k: int) -> bool:
    dims = {"m": m, "n": n, "k": k}
    return all(dims[d] % mult == 0 for d, mult in rung.align)


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
    chain: Sequence[Rung] = DEFAULT_CHAIN,
) -> Route:
    """The first symbol of the key's route list whose constraints hold for (n, k) (and m for tn only).

    `table` is the manifest's [[routes]] (QRoute records: `kernels.manifest.routes`). Symbols the chain does not describe are skipped (their
    constraints are unknown). When the key itself has no list, the exact f32 list of the layout serves, with
    casts. Raises NoRoute when nothing fits.
    """
    key = _key(layout, a, b, c)
    for name, v in (("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    m_seen = m if layout == "tn" else 0  # nn / nt: the pick must not depend on M
    rows = list(table)
    lists = [r.symbols for r in rows if (r.layout, r.a, r.b, r.c) == key]
    exact_key = (layout, "f32", "f32", "f32")
    lists += [r.symbols for r in rows if (r.layout, r.a, r.b, r.c) == exact_key and key != exact_key]
    tried: list[str] = []
    for symbols in lists:
        for name in symbols:
            rung = _rung_of(name, chain)
            if rung is None or rung.layout != layout:
                continue
            tried.append(name)
            if bias and not rung.bias:
                continue
            if not _fits(rung, m_seen, n, k):
                continue
            cast = not (_accepts(a, rung.a) and _accepts(b, rung.b) and c == rung.c)
            if cast and not (rung.a == rung.b == rung.c == "f32"):
                continue  # only the exact f32 family serves other dtypes through casts
            return Route(name, layout, rung.a, rung.b, rung.c, cast, rung.bias)
    raise NoRoute(
        f"no admitted GEMM symbol serves {layout} {a}x{b}->{c} at N={n}, K={k}"
        + (" with a bias" if bias else "")
        + (f"; tried {', '.join(tried)}" if tried else "; the route table has no symbol for it")
    )


__all__ = ["DEFAULT_CHAIN", "EXACT", "NoRoute", "Route", "Rung", "build_route_table", "route_keys", "select"]
