"""Families, their dtype variants and tiles, and the load summary: what serves on this device and what does not.

A family's symbols are grouped by dtype, then by tile: the part of the symbol name that is neither the family's
name nor the dtype (``gemm_bi_nn_tc16_bf16`` of family ``gemm_bi_nn_tc`` is tile ``tc16``; ``softplus_forward_bf16``
has the empty tile). A bare alias (``softplus_forward`` = ``softplus_forward_f32``) has the same empty tile as its
dtype-named twin, which wins. Asking for a multi-tile variant without a tile is refused with the tile list: the
loader never picks one silently. Standard library only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from mamba_forge.runtime.errors import SymbolUnavailable, TileRequired

# why a variant is unavailable, in the order the summary lists them
REJECTED, NOT_HERE, CHECKED, BUILT_ONLY = "rejected", "not qualified here", "checked-only", "built-only"
_STATUS_KIND = {"rejected": REJECTED, "checked": CHECKED, "built-only": BUILT_ONLY, "admitted": NOT_HERE}
STRICT_KINDS = (REJECTED, NOT_HERE)  # what strict=True refuses: this device's kernels that do not serve


def tile_label(name: str, family: str, dtype: str) -> str:
    """The symbol's tile: its name's tokens less the family's and the dtype suffix ('' for a single-tile family)."""
    stem = name[: -len(dtype) - 1] if dtype and name.endswith("_" + dtype) else name
    tokens = stem.split("_")
    for t in family.split("_"):
        if t in tokens:
            tokens.remove(t)
    return "_".join(tokens)


def index_families(symbols) -> dict[str, dict[str, dict[str, str]]]:
    """family -> dtype -> tile -> symbol name, in manifest order (the dtype-named symbol wins over a bare alias)."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for s in symbols:
        tiles = out.setdefault(s.family, {}).setdefault(s.dtype, {})
        tile = tile_label(s.name, s.family, s.dtype)
        if tile not in tiles or tiles[tile] == s.family:
            tiles[tile] = s.name
    return out


class Unavailable(NamedTuple):  # NamedTuples, not frozen dataclasses: a fraction of the cost at import
    """A family variant (or one tile of it) that does not serve here, with the reason the manifest records."""

    family: str
    dtype: str
    tile: str  # "" when the whole variant is unavailable
    kind: str  # rejected, not qualified here, checked-only, built-only
    reason: str
    symbols: tuple[str, ...]

    @property
    def label(self) -> str:
        return " ".join(x for x in (self.family, self.dtype, self.tile and f"tile {self.tile}") if x)


class LoadSummary(NamedTuple):
    """What a load found on this device: Kernels.summary()."""

    device: str
    available: dict[str, tuple[str, ...]]  # family -> dtypes that serve (directly or through a fallback)
    unavailable: tuple[Unavailable, ...]
    fallbacks: dict[str, str]  # symbol that does not serve -> its serving fallback
    skipped_rungs: dict[str, list[str]] = {}  # GEMM route -> its rungs not serving here (Kernels.summary sets it)

    @property
    def strict_problems(self) -> list[str]:
        """What strict=True refuses: rejected or unservable kernels of this device, fallbacks in effect."""
        out = [f"{u.label} ({u.kind}: {u.reason})" for u in self.unavailable if u.kind in STRICT_KINDS]
        return out + [f"{a} (rejected; its fallback {b} would serve)" for a, b in self.fallbacks.items()]

    def text(self) -> str:
        """One line: the unavailable variants by kind (reasons for rejections), then the fallbacks in effect."""
        parts = []
        for kind in (REJECTED, NOT_HERE, CHECKED, BUILT_ONLY):
            items = [u for u in self.unavailable if u.kind == kind]
            if not items:
                continue
            if kind in STRICT_KINDS:
                parts.append(f"{kind}: " + "; ".join(f"{u.label} ({u.reason})" for u in items))
            else:  # uniform reasons: the families only
                fams = sorted({u.family for u in items})
                parts.append(f"{kind} ({len(items)} variants): {', '.join(fams)}")
        if self.fallbacks:
            parts.append("fallbacks in effect: " + ", ".join(f"{a} -> {b}" for a, b in self.fallbacks.items()))
        if self.skipped_rungs:
            parts.append("GEMM route rungs skipped (the rest of their routes serve): " + "; ".join(
                f"{route}: {', '.join(names)}" for route, names in self.skipped_rungs.items()))
        n = len(self.unavailable)
        return f"mamba-forge: on {self.device}, {n} kernel variant{'s' * (n != 1)} unavailable; " + " | ".join(parts)


def _reason(s, kind: str) -> str:
    if kind == REJECTED:
        return s.reason + (f" (check: {s.check})" if s.check else "") if s.reason else "rejected with no recorded reason"
    if kind == NOT_HERE:
        return "its artifact is only for checking arithmetic on this GPU"
    if kind == CHECKED:
        return "arithmetic checked on this GPU for another family"
    return "built for a target no GPU here runs"


def summarize(device: str, families: dict[str, dict[str, dict[str, str]]], records: dict,
              serves: Callable[[object], bool]) -> LoadSummary:
    """The summary from the family index, the records by name and a predicate 'this record serves here'."""

    def serving(name: str) -> str | None:  # the symbol that serves `name`: itself or its first serving fallback
        s = records[name]
        if serves(s):
            return name
        return next((fb for fb in s.fallback if fb in records and serves(records[fb])), None)

    available: dict[str, tuple[str, ...]] = {}
    unavailable: list[Unavailable] = []
    fallbacks: dict[str, str] = {}
    for family, dtypes in families.items():
        ok = []
        for dtype, tiles in dtypes.items():
            dead = []
            for tile, name in tiles.items():
                got = serving(name)
                if got is None:
                    dead.append((tile, records[name]))
                elif got != name:
                    fallbacks[name] = got
            if len(dead) < len(tiles):
                ok.append(dtype)
            groups = [("", [s for _, s in dead])] if dead and len(dead) == len(tiles) else [(t, [s]) for t, s in dead]
            for tile, syms in groups:
                kind = _STATUS_KIND.get(syms[0].status, REJECTED)
                unavailable.append(Unavailable(family, dtype, tile, kind, _reason(syms[0], kind),
                                               tuple(s.name for s in syms)))
        if ok:
            available[family] = tuple(ok)
    return LoadSummary(device, available, tuple(unavailable), fallbacks)


class Typed:
    """A family: its dtype variants (``typed.bf16`` or ``get("bf16")``) and, per variant, its tiles.

    A variant with several tiles is refused without a tile (TileRequired lists them); ``get(dtype, tile=)`` picks
    one by name. Calling the family itself launches its only kernel: the bare alias, or the one variant and tile."""

    def __init__(self, kernels, family: str, tiles: dict[str, dict[str, str]]):
        self.family, self._kernels, self._tiles = family, kernels, tiles
        self.variants = {dt: next(iter(t.values())) for dt, t in tiles.items()}  # dtype -> its first symbol

    @property
    def dtypes(self) -> tuple[str, ...]:
        return tuple(self._tiles)

    @property
    def half_only(self) -> bool:
        """Only bf16/f16 variants (the half-precision holders)."""
        return bool(self._tiles) and set(self._tiles) <= {"bf16", "f16"}

    def tiles(self, dtype: str = "") -> tuple[str, ...]:
        """The tile names of a variant ('' is the single-tile family's one tile)."""
        return tuple(self._variant(dtype))

    def _variant(self, dtype: str) -> dict[str, str]:
        t = self._tiles.get(dtype)
        if t is None:
            have = ", ".join(d or "(no dtype)" for d in self._tiles) or "none"
            raise SymbolUnavailable(f"{self.family}_{dtype}", f"family {self.family} has no {dtype} variant (has {have})")
        return t

    def get(self, dtype: str = "", tile: str | None = None) -> object:
        tiles = self._variant(dtype)
        if tile is None:
            if len(tiles) > 1:
                what = f"{self.family} {dtype}".rstrip()
                raise TileRequired(what, f"{what} has {len(tiles)} tiles; choose one with tile= (or the full symbol "
                                   f"name through function()): {', '.join(tiles)}", tuple(tiles))
            return self._kernels.function(next(iter(tiles.values())))
        name = tiles.get(tile) or (tile if tile in tiles.values() else None)
        if name is None:
            raise SymbolUnavailable(f"{self.family}_{tile}", f"{self.family} {dtype} has no tile {tile!r} "
                                    f"(has {', '.join(repr(t) for t in tiles)})")
        return self._kernels.function(name)

    def __getattr__(self, dtype: str) -> object:
        if dtype.startswith("_") or dtype not in self.__dict__.get("_tiles", {}):
            raise AttributeError(f"family {self.__dict__.get('family')} has no variant {dtype!r}")
        return self.get(dtype)

    def __call__(self, /, *positional, stream=None, **kwargs) -> None:
        bare = self._kernels._symbols.get(self.family)
        if bare is not None and bare.family == self.family:
            k = self._kernels.function(self.family)
        elif len(self._tiles) == 1:
            k = self.get(next(iter(self._tiles)))
        else:
            raise SymbolUnavailable(self.family, f"family {self.family} has no bare symbol and several variants; "
                                    f"choose a dtype: {', '.join(self.dtypes)}")
        k(*positional, stream=stream, **kwargs)

    def __repr__(self) -> str:
        return f"Typed({self.family!r}, {self.dtypes})"


__all__ = ["BUILT_ONLY", "CHECKED", "NOT_HERE", "REJECTED", "LoadSummary", "Typed", "Unavailable", "index_families",
           "summarize", "tile_label"]
