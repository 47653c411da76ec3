"""GEMM route tuning (kernels/route_tuning.toml): the catalog's rules, each with a refused case
(mamba_forge/catalog/route_tuning.py); the manifest's tuning rules (qualify/assemble.route_table, the QTune
record); the selector (mamba_forge/runtime/routes.py) takes a tuned rung inside its (N, K, M) ranges, falls back
to the class's order outside them or where the rung does not serve, and never changes the class."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.core.codec import SchemaError, from_dict, to_dict
from mamba_forge.core.errors import CatalogError
from mamba_forge.core.schema import QRoute, QRung, QSymbol, QTune
from mamba_forge.qualify.assemble import route_table
from mamba_forge.runtime import routes as RT

FIXTURE = Path(__file__).parent / "fixtures" / "qualify_negative"

# the fixture's GEMM symbols: a checked class of two rungs (the 2-D twin needs N % 8), and a class of one
ROUTES = '''[[route]]
layout = "nn"
a = "f32"
b = "f32"
c = "f32"
classes = [
  { name = "fma-chain", check = { N = 40, K = 96 }, rungs = [
    { symbols = "control_gemm_chain_2d", m = [1, 64], needs = { n = 8 } },
    { symbols = "control_gemm_chain" },
  ] },
  { name = "pairwise", rungs = [{ symbols = "pairwise_gemm" }] },
]
'''
ROUTES_FORCE = ROUTES.replace('  { name = "pairwise", rungs = [{ symbols = "pairwise_gemm" }] },\n]\n',
                              ']\nforce = [{ symbols = "pairwise_gemm" }]\n')
KEY = 'layout = "nn"\na = "f32"\nb = "f32"\nc = "f32"\n'


def _tune(rules: str, key: str = KEY, cls: str = "fma-chain") -> str:
    return f'[[tune]]\n{key}class = "{cls}"\nrules = [\n{rules}]\n'


RULE_2D = '  { symbol = "control_gemm_chain_2d", n = [40, 40], k = [96, 96], m = [65, 4096] },\n'
RULE_CHAIN = '  { symbol = "control_gemm_chain", n = [40, 40], k = [96, 96], m = [1, 64] },\n'


def _catalog(tmp_path: Path, tuning: str, routes: str = ROUTES, files=("route_tuning.toml",)) -> Path:
    root = tmp_path / "cat"
    shutil.copytree(FIXTURE, root)
    (root / "routes.toml").write_text(routes)
    (root / "route_tuning.toml").write_text(tuning)
    listed = ", ".join(f'"{f}"' for f in files)
    text = (root / "catalog.toml").read_text().replace(
        'routes = ["routes.toml"]', f'routes = ["routes.toml"]\nroute_tuning = [{listed}]')
    (root / "catalog.toml").write_text(text)
    return root / "catalog.toml"


def _nn(cat):
    return next(r for r in cat.routes if r.key == ("nn", "f32", "f32", "f32"))


# ---- the catalog's rules ---------------------------------------------------------------------------------------

def test_a_good_table_loads_onto_its_route_and_into_the_digest(tmp_path):
    path = _catalog(tmp_path, _tune(RULE_2D + RULE_CHAIN))
    cat = load_catalog(path)
    rules = _nn(cat).tuning
    assert [(t.eq_class, t.symbol, t.n, t.k, t.m) for t in rules] == [
        ("fma-chain", "control_gemm_chain_2d", (40, 40), (96, 96), (65, 4096)),
        ("fma-chain", "control_gemm_chain", (40, 40), (96, 96), (1, 64))]
    assert "route_tuning.toml" in cat.route_files
    before = cat.digest()
    (path.parent / "route_tuning.toml").write_text(_tune(RULE_2D))
    assert load_catalog(path).digest() != before


def test_the_built_in_table_loads_and_names_rungs_of_its_classes():
    cat = load_catalog(default_catalog_path())
    assert "route_tuning.toml" in cat.route_files
    for r in cat.routes:
        for t in r.tuning:
            cls = next(c for c in r.classes if c.name == t.eq_class)
            assert t.symbol in {x.symbol for x in cls.rungs}, (r.key, t)


def test_a_table_of_comments_only_is_no_rule(tmp_path):
    assert _nn(load_catalog(_catalog(tmp_path, "# nothing measured yet\n"))).tuning == ()


BAD_TUNING = [
    (_tune(RULE_2D, key=KEY.replace('"f32"', '"bf16"')), "no route serves this key"),
    (_tune(RULE_2D, cls="nope"), "the route has no class 'nope'; its classes: fma-chain, pairwise"),
    (_tune(RULE_2D) + _tune(RULE_CHAIN), "this class is already tuned"),
    (_tune('  { symbol = "no_such_gemm" },\n'), "no_such_gemm): symbol is not in the catalog"),
    (_tune('  { symbol = "pairwise_gemm" },\n'), "not an auto rung of class fma-chain"),
    (_tune('  { symbol = "control_row_sum" },\n'), "not an auto rung of class fma-chain"),
    (_tune('  { symbol = "control_gemm_chain", m = [9, 3] },\n'), "m = [9, 3] is empty or not a range"),
    (_tune('  { symbol = "control_gemm_chain", n = [0, 8] },\n'), "n = [0, 8] is empty or not a range"),
    (_tune('  { symbol = "control_gemm_chain", k = [1, -1] },\n'), "k = [1, -1] is empty or not a range"),
    (_tune(RULE_CHAIN + '  { symbol = "control_gemm_chain_2d", n = [8, 0], m = [64, 64] },\n'),
     "overlap rules[0] (control_gemm_chain)"),
    (_tune(RULE_CHAIN + RULE_CHAIN), "overlap rules[0]"),
    (_tune('  { symbol = "control_gemm_chain_2d", n = [41, 47] },\n'), "n = [41, 47] holds no multiple of 8"),
    (_tune('  { symbol = "control_gemm_chain", speed = 3 },\n'), "Extra inputs"),
    (_tune('  { symbol = "control_gemm_chain", n = [1, 2, 3] },\n'),
     "tune[0].rules[0].n: Tuple should have at most 2 items"),
    (_tune("", cls="fma-chain"), "rules"),
    (_tune(RULE_CHAIN, cls="Bad Class"), "class"),
    ("tune = 3", "tune"),
]


@pytest.mark.parametrize(("text", "problem"), BAD_TUNING, ids=[f"bad{i}" for i in range(len(BAD_TUNING))])
def test_bad_tuning_files_are_refused_at_load(tmp_path, text, problem):
    with pytest.raises(CatalogError) as info:
        load_catalog(_catalog(tmp_path, text))
    assert problem in str(info.value), str(info.value)
    assert "\n" not in str(info.value).strip()


def test_a_force_rung_cannot_be_tuned(tmp_path):
    with pytest.raises(CatalogError, match="not an auto rung of class fma-chain"):
        load_catalog(_catalog(tmp_path, _tune('  { symbol = "pairwise_gemm" },\n'), routes=ROUTES_FORCE))


def test_two_tuning_files_may_not_tune_one_class(tmp_path):
    path = _catalog(tmp_path, _tune(RULE_2D), files=("route_tuning.toml", "more.toml"))
    (path.parent / "more.toml").write_text(_tune(RULE_CHAIN))
    with pytest.raises(CatalogError, match="more.toml: tune.0. .* this class is already tuned"):
        load_catalog(path)


@pytest.mark.parametrize("rel", ["/etc/passwd", "../route_tuning.toml", "missing.toml"])
def test_tuning_file_paths_stay_inside_the_catalog(tmp_path, rel):
    with pytest.raises(CatalogError, match="route tuning file|missing.toml"):
        load_catalog(_catalog(tmp_path, _tune(RULE_2D), files=(rel,)))


# ---- the manifest's rules ---------------------------------------------------------------------------------------

def _syms(names, status="admitted"):
    return [QSymbol(name=n, module="M", target="sm_90a", family="f", status=status) for n in names]


def test_the_manifest_holds_the_rules_of_rungs_it_holds(tmp_path):
    cat = load_catalog(_catalog(tmp_path, _tune(RULE_2D + RULE_CHAIN)))
    (full,) = route_table(cat.routes, _syms(["control_gemm_chain", "control_gemm_chain_2d", "pairwise_gemm"]))
    assert [(t.symbol, t.n_min, t.n_max, t.k_min, t.k_max, t.m_min, t.m_max) for t in full.tuning] == [
        ("control_gemm_chain_2d", 40, 40, 96, 96, 65, 4096), ("control_gemm_chain", 40, 40, 96, 96, 1, 64)]
    (part,) = route_table(cat.routes, _syms(["control_gemm_chain", "pairwise_gemm"]) + _syms(
        ["control_gemm_chain_2d"], "checked"))
    assert [t.symbol for t in part.tuning] == ["control_gemm_chain"]  # a rung not held here: its rule left out
    (none,) = route_table(cat.routes, _syms(["pairwise_gemm"]))
    assert none.tuning is None


def test_a_route_without_tuning_encodes_as_before_and_rules_round_trip():
    """No `tuning` key when a route has none: a manifest signed before tuning existed projects to the same runtime
    table bytes (runtime/verify.py re-encodes it)."""
    plain = QRoute(layout="nn", a="f32", b="f32", c="f32", symbols=["x"], rungs=[QRung(symbol="x", eq_class="c")])
    assert "tuning" not in to_dict(plain)
    tuned = QRoute(layout="nn", a="f32", b="f32", c="f32", symbols=["x"], rungs=[QRung(symbol="x", eq_class="c")],
                   tuning=[QTune(eq_class="c", symbol="x", n_min=96, n_max=96, m_max=64)])
    data = to_dict(tuned)
    assert data["tuning"] == [{"eq_class": "c", "symbol": "x", "n_min": 96, "n_max": 96, "k_min": 1, "k_max": 0,
                               "m_min": 1, "m_max": 64}]
    assert from_dict(QRoute, data) == tuned


@pytest.mark.parametrize("bad", [{"n_min": 0}, {"k_min": 9, "k_max": 3}, {"m_max": -1}])
def test_a_manifest_rule_that_is_not_a_range_is_refused(bad):
    data = {"eq_class": "c", "symbol": "x", **bad}
    with pytest.raises(SchemaError, match="is not a range"):
        from_dict(QTune, data)


# ---- the selector -------------------------------------------------------------------------------------------------

K16 = [QRung(symbol="skinny", eq_class="k16", m_min=1, m_max=64, needs={"n": 8, "k": 8}),
       QRung(symbol="narrow", eq_class="k16", m_min=1, m_max=64, needs={"n": 8, "k": 8}),
       QRung(symbol="large", eq_class="k16", needs={"n": 8, "k": 8}),
       QRung(symbol="biased", eq_class="k16", m_min=1, m_max=1, bias=True),
       QRung(symbol="portable", eq_class="mma", bias=True)]


def _table(tuning: list[QTune]) -> list[QRoute]:
    return [QRoute(layout="nn", a="bf16", b="bf16", c="bf16", symbols=[r.symbol for r in K16], rungs=K16,
                   tuning=tuning)]


X_PROJ = [QTune(eq_class="k16", symbol="narrow", n_min=96, n_max=96, k_min=2048, k_max=2048, m_min=1, m_max=8),
          QTune(eq_class="k16", symbol="skinny", n_min=96, n_max=96, k_min=2048, k_max=2048, m_min=9, m_max=724),
          QTune(eq_class="k16", symbol="narrow", n_min=96, n_max=96, k_min=2048, k_max=2048, m_min=725)]


def _pick(tbl, m, n=96, k=2048, **kw) -> str:
    return RT.select(tbl, m, n, k, "bf16", "bf16", "bf16", **kw).symbol


def test_a_tuned_rung_serves_inside_its_ranges_and_the_class_order_outside():
    tbl = _table(X_PROJ)
    assert {m: _pick(tbl, m) for m in (0, 1, 8, 9, 64, 65, 724, 725, 16384)} == {
        0: "narrow", 1: "narrow", 8: "narrow", 9: "skinny", 64: "skinny", 65: "skinny", 724: "skinny", 725: "narrow",
        16384: "narrow"}  # M = 0 (an empty product) is looked up as M = 1, as the class order does
    # another N or K: the class's own order (skinny up to 64, then the unbounded large)
    assert {m: _pick(tbl, m, n=104) for m in (1, 64, 65)} == {1: "skinny", 64: "skinny", 65: "large"}
    assert {m: _pick(tbl, m, k=2056) for m in (1, 64, 65)} == {1: "skinny", 64: "skinny", 65: "large"}
    assert _pick(_table([]), 5000) == _pick(_table(None), 5000) == "large"


def test_a_tuned_rung_that_does_not_serve_falls_back_to_the_class_order():
    tbl = _table(X_PROJ)
    assert _pick(tbl, 2, serves=lambda s: s != "narrow") == "skinny"  # rejected on this device
    assert _pick(tbl, 2000, serves=lambda s: s != "narrow") == "large"
    # a bias request: the tuned rungs take none; the class's bias rung serves M = 1, the other M leave the class
    # (it cannot serve every M with a bias) for the next, as without tuning
    assert _pick(tbl, 1, bias=True) == _pick(_table(None), 1, bias=True) == "portable"
    # a rung whose divisibility does not meet (N, K): a rule holding N = 100 still serves the class's order
    odd = [QTune(eq_class="k16", symbol="narrow", n_min=96, n_max=104)]
    assert _pick(_table(odd), 1, n=100, serves=lambda s: s != "skinny") == "portable"


def test_a_rule_never_changes_the_class():
    """Rules naming another class's rung, or tuning another class, are not followed: the rung is always one of
    the class the (N, K) chose."""
    foreign = [QTune(eq_class="k16", symbol="portable"), QTune(eq_class="mma", symbol="large")]
    tbl = _table(foreign)
    assert {_pick(tbl, m) for m in (1, 64)} == {"skinny"} and _pick(tbl, 65) == "large"
    assert _pick(tbl, 1, n=95) == "portable"  # N % 8 != 0: the mma class; its rule names a k16 rung


def test_a_named_symbol_ignores_tuning():
    assert _pick(_table(X_PROJ), 1, symbol="large") == "large"


@pytest.fixture(scope="module")
def cat():
    return load_catalog(default_catalog_path())


@pytest.mark.parametrize("seed", range(8))
def test_random_tuning_keeps_every_pick_in_the_untuned_class(cat, seed):
    """The built-in routes with random rules (a random rung of each multi-rung class, random ranges) and random
    rejections: at every (M, N, K) the tuned pick is a rung of the class the untuned selector picks."""
    rng = random.Random(seed)
    plain = route_table(cat.routes, _syms(cat.symbols))
    size = {(r.layout, r.a, r.c, x.eq_class): 0 for r in plain for x in r.rungs}
    for r in plain:
        for x in r.rungs:
            size[(r.layout, r.a, r.c, x.eq_class)] += 1
    # one-rung classes rejected often, so the multi-rung classes behind them serve
    dead = {x.symbol for r in plain for x in r.rungs
            if rng.random() < (0.1 if size[(r.layout, r.a, r.c, x.eq_class)] > 1 else 0.6)}
    serves = lambda s: s not in dead  # noqa: E731
    tuned = []
    for r in plain:
        rules = []
        for cls in {x.eq_class for x in r.rungs if x.mode == "auto"}:
            members = [x.symbol for x in r.rungs if x.eq_class == cls and x.mode == "auto"]
            for _ in range(3):
                lo = rng.choice([1, 2, 9, 64, 300])
                rules.append(QTune(eq_class=cls, symbol=rng.choice(members), n_min=rng.choice([1, 64]),
                                   m_min=lo, m_max=rng.choice([0, lo, lo * 4])))
        tuned.append(QRoute(layout=r.layout, a=r.a, b=r.b, c=r.c, symbols=r.symbols, rungs=r.rungs, tuning=rules))
    used = 0
    for r in plain:
        for _ in range(3):
            n, k = rng.choice([8, 64, 96, 392, 4096]), rng.choice([8, 64, 328, 2048])
            for m in (1, 2, 9, 16, 64, 65, 300, 1200, 16384):
                if r.layout == "tn" and m % 8:
                    continue
                try:
                    want = RT.select(plain, m, n, k, r.a, r.b, r.c, r.layout, serves=serves)
                except RT.NoRoute:
                    with pytest.raises(RT.NoRoute):
                        RT.select(tuned, m, n, k, r.a, r.b, r.c, r.layout, serves=serves)
                    continue
                got = RT.select(tuned, m, n, k, r.a, r.b, r.c, r.layout, serves=serves)
                assert (got.eq_class, got.a, got.c, got.cast) == (want.eq_class, want.a, want.c, want.cast)
                used += got.symbol != want.symbol
    assert used > 0  # the rules did change some rungs
