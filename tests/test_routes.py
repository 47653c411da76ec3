"""GEMM routes: the catalog's route file (mamba_forge/catalog/routes.py: rules checked at load, each with a
refused case), the manifest's route table (qualify/assemble.route_table) and the runtime selector
(mamba_forge/runtime/routes.py): the class never depends on M, the rung within it may; force rungs only by name;
rejected rungs skipped while their classes' other rungs serve; the exact f32 fallback with casts; refusals."""

from __future__ import annotations

import random
import shutil
from math import lcm
from pathlib import Path

import pytest

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.core.errors import CatalogError
from mamba_forge.core.schema import QRoute, QRung, QSymbol
from mamba_forge.qualify.assemble import route_table
from mamba_forge.runtime import routes as RT

FIXTURE = Path(__file__).parent / "fixtures" / "qualify_negative"
M_VALUES = [0, 1, 2, 3, 7, 8, 15, 16, 17, 63, 64, 65, 127, 128, 255, 256, 257, 1000, 4096, 65536] + random.Random(
    5).sample(range(1, 10**6), 40)
GEMM_PREFIXES = ("gemm_", "matvec_", "triad_")


@pytest.fixture(scope="module")
def cat():
    return load_catalog(default_catalog_path())


def _syms(names, status="admitted"):
    return [QSymbol(name=n, module="M", target="sm_90a", family="f", status=status) for n in names]


def full_table(cat):
    return route_table(cat.routes, _syms(cat.symbols))


def _fit(rung: QRung) -> tuple[int, int]:
    """(n, k) that meet a rung's needs and lie in its class's region."""
    def inside(mult: int, v: int, lo: int, hi: int) -> int:
        v = max(v, -(-lo // mult) * mult)
        return min(v, hi // mult * mult) if hi else v
    return (inside(lcm(8, rung.needs.get("n", 1)), lcm(8, rung.needs.get("n", 1)) * 17, rung.n_min, rung.n_max),
            inside(lcm(8, rung.needs.get("k", 1)), lcm(8, rung.needs.get("k", 1)) * 9, rung.k_min, rung.k_max))


def test_every_gemm_symbol_of_the_catalog_is_a_rung_and_selectable_by_name(cat):
    tbl = full_table(cat)
    rungs = {x.symbol: (r, x) for r in tbl for x in r.rungs}
    gemms = [n for n in cat.symbols if n.startswith(GEMM_PREFIXES)]
    assert len(gemms) >= 110 and set(gemms) <= set(rungs)
    for name in gemms:
        route, rung = rungs[name]
        n, k = _fit(rung)
        m = lcm(8, rung.needs.get("m", 1))
        got = RT.select(tbl, m, n, k, route.a, route.b, route.c, route.layout, symbol=name)
        assert got.symbol == name and got.cast is False


def test_each_auto_rung_is_reached_by_some_shape(cat):
    """With the rung and its class reference serving (earlier classes rejected), some shape selects it."""
    tbl = full_table(cat)
    for route in tbl:
        for rung in (x for x in route.rungs if x.mode == "auto"):
            ref = next(x for x in route.rungs if x.eq_class == rung.eq_class and (x.m_min, x.m_max) == (1, 0) and x.mode == "auto")
            serving = {rung.symbol} if (rung.m_min, rung.m_max) == (1, 0) else {rung.symbol, ref.symbol}
            n, k = _fit(rung)
            m = lcm(rung.m_min, rung.needs.get("m", 1))
            got = RT.select(tbl, m, n, k, route.a, route.b, route.c, route.layout, serves=serving.__contains__)
            assert got.symbol == rung.symbol, (route.layout, route.a, route.c, rung.symbol)


def test_force_rungs_are_never_chosen_by_shape(cat):
    tbl = full_table(cat)
    force = {x.symbol for r in tbl for x in r.rungs if x.mode == "force"}
    assert {"matvec_bi_bf16_bf16", "matvec_bi_f32_f32", "matvec_bi_f16_f32"} <= force
    for route in tbl:
        only_force = {x.symbol for x in route.rungs if x.mode == "force"}
        if not only_force:
            continue
        with pytest.raises(RT.NoRoute):  # nothing but the force rungs (and no exact fallback) serves
            RT.select(tbl, 1, 64, 64, route.a, route.b, route.c, route.layout, serves=only_force.__contains__)


@pytest.mark.parametrize("seed", range(12))
def test_the_class_never_depends_on_m(cat, seed):
    """Random rejections, random (N, K): over every M the chosen rungs share one class, and the class with the
    unbounded rung serves the M outside every bounded range."""
    rng = random.Random(seed)
    tbl = full_table(cat)
    dead = {x.symbol for r in tbl for x in r.rungs if rng.random() < 0.3}
    serves = lambda s: s not in dead  # noqa: E731
    for route in tbl:
        for _ in range(4):
            n, k = rng.choice([8, 16, 24, 64, 392, 4096, 8190]), rng.choice([8, 64, 328, 4096, 8191])
            picks = set()
            for m in M_VALUES:
                if route.layout == "tn" and m % 8:
                    continue
                try:
                    r = RT.select(tbl, m, n, k, route.a, route.b, route.c, route.layout, serves=serves)
                except RT.NoRoute:
                    r = None
                picks.add((r.eq_class, r.a, r.c) if r else None)
            assert len(picks) == 1, (route.layout, route.a, route.c, n, k, picks)


def _mini(rungs: list[QRung], layout="nn", a="bf16", c="bf16") -> list[QRoute]:
    return [QRoute(layout=layout, a=a, b=a, c=c, symbols=[r.symbol for r in rungs], rungs=rungs)]


SKINNY = [QRung(symbol="skinny", eq_class="k16", m_min=1, m_max=64, needs={"n": 8, "k": 8}),
          QRung(symbol="mid", eq_class="k16", m_min=65, m_max=256, needs={"n": 8, "k": 8}),
          QRung(symbol="large", eq_class="k16", needs={"n": 8, "k": 8}),
          QRung(symbol="portable", eq_class="mma")]


def test_the_rung_within_a_class_follows_m():
    tbl = _mini(SKINNY)
    pick = {m: RT.select(tbl, m, 4096, 4096, "bf16", "bf16", "bf16").symbol for m in (1, 64, 65, 256, 257, 5000)}
    assert pick == {1: "skinny", 64: "skinny", 65: "mid", 256: "mid", 257: "large", 5000: "large"}
    # a rejected skinny rung: its M range falls to the next rung of the class that covers it, never another class
    assert RT.select(tbl, 1, 4096, 4096, "bf16", "bf16", "bf16", serves=lambda s: s != "skinny").symbol == "large"
    # no unbounded rung fits (N % 8 != 0): the whole class is skipped for every M, the next class serves
    assert {RT.select(tbl, m, 4095, 4096, "bf16", "bf16", "bf16").symbol for m in (1, 100, 300)} == {"portable"}
    # the reference rejected: the class cannot serve every M, so none of its rungs serves at any M
    got = {RT.select(tbl, m, 4096, 4096, "bf16", "bf16", "bf16", serves=lambda s: s != "large").symbol
           for m in (1, 100, 300)}
    assert got == {"portable"}


def test_a_class_serves_only_inside_its_region():
    """A class's region (where = { n, k }) bounds the N and K it serves, never M: outside it the next class serves
    at every M; a rung asked for by name outside its region is refused."""
    split = [QRung(symbol="split_small_m", eq_class="split", m_min=1, m_max=256, needs={"n": 8, "k": 8},
                   n_max=2560, k_min=1024),
             QRung(symbol="split_ref", eq_class="split", needs={"n": 8, "k": 8}, n_max=2560, k_min=1024)]
    tbl = _mini(split + SKINNY)
    for (n, k), want in {(96, 2048): "split", (2560, 1024): "split", (2568, 2048): "k16", (96, 1016): "k16",
                         (4096, 1024): "k16"}.items():
        assert {RT.select(tbl, m, n, k, "bf16", "bf16", "bf16").eq_class for m in (1, 64, 300, 5000)} == {want}
    assert RT.select(tbl, 1, 96, 2048, "bf16", "bf16", "bf16").symbol == "split_small_m"
    assert RT.select(tbl, 300, 96, 2048, "bf16", "bf16", "bf16").symbol == "split_ref"
    with pytest.raises(RT.NoRoute, match="does not serve"):
        RT.select(tbl, 1, 4096, 1024, "bf16", "bf16", "bf16", symbol="split_ref")


def test_the_catalog_region_reaches_the_manifest_rungs(cat):
    tbl = full_table(cat)
    rungs = {x.symbol: x for r in tbl for x in r.rungs}
    ref = rungs["gemm_bi_nn_sm90a_wgmma_splitk8_m128n128_s4_bf16"]
    assert (ref.eq_class, ref.n_min, ref.n_max, ref.k_min, ref.k_max) == ("wgmma-k16-split8", 1, 2560, 1024, 0)
    whole = rungs["gemm_bi_nn_sm90a_wgmma_ws2_m128n256_s4_bf16"]
    assert (whole.n_min, whole.n_max, whole.k_min, whole.k_max) == (1, 0, 1, 0)
    for (n, k), want in {(96, 2048): "wgmma-k16-split8", (1024, 2048): "wgmma-k16-split8",
                         (2560, 5120): "wgmma-k16-split8", (2568, 1024): "wgmma-k16",
                         (4096, 1024): "wgmma-k16", (10240, 2560): "wgmma-k16",
                         (2048, 64): "wgmma-k16"}.items():
        serving = lambda s: "tcgen" not in s  # noqa: E731  (an H200: no sm_100 rungs)
        got = {RT.select(tbl, m, n, k, "bf16", "bf16", "bf16", serves=serving).eq_class for m in (1, 4, 256, 16384)}
        assert got == {want}, (n, k, got)


def test_exact_fallback_casts_except_for_tf32(cat):
    tbl = full_table(cat)
    exact_only = {x.symbol for r in tbl if (r.layout, r.a) == ("nn", "f32") for x in r.rungs}
    r = RT.select(tbl, 5, 64, 64, "bf16", "bf16", "bf16", serves=exact_only.__contains__)
    assert r.cast and (r.a, r.c) == ("f32", "f32") and r.eq_class == "sm89-copyplan"  # the f32 route's order
    r = RT.select(tbl, 5, 64, 64, "bf16", "bf16", "bf16", bias=True, serves=exact_only.__contains__)
    assert r.cast and r.symbol == "gemm_bi_f32_f32_decode_n32" and r.eq_class == "fma-chain"  # copyplan: no bias; M=5
    r = RT.select(tbl, 17, 64, 64, "bf16", "bf16", "bf16", bias=True, serves=exact_only.__contains__)
    assert r.symbol == "gemm_bi_f32_f32_skinny_n64" and r.eq_class == "fma-chain"  # past the decode rungs' M <= 16
    r = RT.select(tbl, 5, 64, 64, "tf32", "tf32", "f32", serves=exact_only.__contains__)
    assert not r.cast
    assert RT.select(tbl, 5, 64, 64, "bf16", "bf16", "bf16").symbol == "gemm_bi_nn_sm100_tcgen_c4_bf16"
    tn = RT.select(tbl, 16, 64, 64, "bf16", "bf16", "f32", "tn")
    assert tn.symbol == "triad_sm80_tn_bf16"


def test_tn_m_alignment_is_a_constraint_and_nn_m_never_is(cat):
    tbl = full_table(cat)
    assert RT.select(tbl, 16, 64, 64, "bf16", "bf16", "bf16", "tn").eq_class == "wgmma-k16"
    assert RT.select(tbl, 17, 64, 64, "bf16", "bf16", "bf16", "tn").symbol == "triad_scalar_tn_f32"  # casts


def test_bias_requests_skip_rungs_without_a_bias(cat):
    tbl = full_table(cat)
    r = RT.select(tbl, 8, 64, 64, "bf16", "bf16", "bf16", bias=True)
    assert r.bias and r.symbol == "gemm_bi_nn_tc128_bf16"  # tcgen05, wgmma, sm120 and sm89 tiles take none


def test_refusals():
    tbl = _mini(SKINNY)
    for bad in [dict(layout="xx"), dict(a="f64"), dict(c="tf32")]:
        args = {"layout": "nn", "a": "bf16", "c": "bf16", **bad}
        with pytest.raises(ValueError):
            RT.select(tbl, 1, 8, 8, args["a"], args["a"], args["c"], args["layout"])
    for m in (-1, True, 1.5):
        with pytest.raises(ValueError, match="m must be a non-negative integer"):
            RT.select(tbl, m, 8, 8, "bf16", "bf16", "bf16")
    with pytest.raises(RT.NoRoute, match="no admitted GEMM symbol serves nn f16xf16->f16 at N=8, K=8"):
        RT.select(tbl, 1, 8, 8, "f16", "f16", "f16")
    with pytest.raises(RT.NoRoute, match="skinny does not serve"):
        RT.select(tbl, 1, 9, 8, "bf16", "bf16", "bf16", symbol="skinny")
    with pytest.raises(RT.NoRoute, match="does not serve on this device"):
        RT.select(tbl, 1, 8, 8, "bf16", "bf16", "bf16", symbol="skinny", serves=lambda s: False)
    with pytest.raises(RT.NoRoute, match="not an admitted rung"):
        RT.select(tbl, 1, 8, 8, "bf16", "bf16", "bf16", symbol="nope")


def test_route_table_holds_admitted_and_rejected_rungs_only(cat):
    syms = _syms(["triad_scalar_nn_f32", "gemm_bi_f32_f32"]) + _syms(["triad_scalar_tn_f32"], "rejected") + _syms(
        ["gemm_bi_f32_f32_s2"], "checked") + _syms(["triad_scalar_nt_f32"], "built-only")
    tbl = route_table(cat.routes, syms)
    assert [(r.layout, r.symbols) for r in tbl] == [
        ("nn", ["triad_scalar_nn_f32", "gemm_bi_f32_f32"]), ("tn", ["triad_scalar_tn_f32"])]
    assert RT.skipped(tbl, {"triad_scalar_nn_f32", "gemm_bi_f32_f32"}.__contains__) == {
        "tn f32xf32->f32": ["triad_scalar_tn_f32"]}


# ---- the catalog's rules, each with a refused case ---------------------------------------------------------

GOOD_CLASS = '{ name = "fma-chain", check = { N = 40, K = 96 }, rungs = [{ symbols = "control_gemm_chain_2d", m = [1, 64] }, { symbols = "control_gemm_chain" }] }'  # noqa: E501


def _route(classes=GOOD_CLASS, key='layout = "nn"\na = "f32"\nb = "f32"\nc = "f32"', extra=""):
    return f"[[route]]\n{key}\nclasses = [{classes}]\n{extra}"


BAD_ROUTES = [
    (_route(key='layout = "xn"\na = "f32"\nb = "f32"\nc = "f32"'), "unknown layout 'xn'"),
    (_route(key='layout = "nn"\na = "f64"\nb = "f32"\nc = "f32"'), "unknown dtype 'f64'"),
    (_route(key='layout = "nn"\na = "tf32"\nb = "tf32"\nc = "tf32"'), "tf32 is a math mode"),
    (_route() + "\n" + _route(), "key already routed"),
    (_route('{ name = "x", rungs = [{ symbols = "no_such_symbol" }] }'), "symbol 'no_such_symbol' is not in the catalog"),
    (_route('{ name = "x", rungs = [{ symbols = "zz_*" }] }'), "pattern 'zz_*' matches no symbol"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain", m = [1, 64] }] }'), "no rung serves every M"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain_2d", m = [1, 64] }, '
            '{ symbols = "control_gemm_chain" }] }'), "needs check = { N, K }"),
    (_route('{ name = "x", check = { N = 40, K = 96 }, rungs = [{ symbols = "control_gemm_chain", '
            'needs = { n = 64 } }, { symbols = "control_gemm_chain_2d" }] }'), "check N = 40 is not a multiple of 64"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain", needs = { m = 8 } }] }'), "may not constrain M"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain" }] }',
            extra='force = [{ symbols = "control_gemm_chain_2d", m = [1, 8] }]'), "force rung serves only by name"),
    (_route('{ name = "x", rungs = [{ symbols = "control_row_sum" }] }'), "has A of dtype none"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain" }] }, '
            '{ name = "x", rungs = [{ symbols = "control_gemm_chain_2d" }] }'), "class named twice"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain" }] }, '
            '{ name = "y", rungs = [{ symbols = "control_gemm_chain" }] }'), "already serves this key"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain", needs = { q = 8 } }] }'), "needs names 'q'"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain", needs = { n = 0 } }] }'), "needs.n must be"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain", m = [9, 3] }] }'), "is not a range"),
    (_route('{ name = "Bad Name", rungs = [{ symbols = "control_gemm_chain" }] }'), "name"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain", speed = 3 }] }'), "Extra inputs"),
    (_route('{ name = "x", check = { N = 40 }, rungs = [{ symbols = "control_gemm_chain" }] }'),
     "it takes exactly N and K"),
    (_route('{ name = "x", rungs = [{ symbols = "control_gemm_chain_{dtype}" }] }'), "names a field other than"),
    (_route('{ name = "x", where = { m = [1, 64] }, rungs = [{ symbols = "control_gemm_chain" }] }'),
     "region is over n and k only"),
    (_route('{ name = "x", where = { k = [64, 8] }, rungs = [{ symbols = "control_gemm_chain" }] }'),
     "where.k = [64, 8] is not a range"),
    (_route('{ name = "x", check = { N = 40, K = 96 }, where = { k = [128, 0] }, rungs = [{ symbols = '
            '"control_gemm_chain_2d", m = [1, 64] }, { symbols = "control_gemm_chain" }] }'),
     "check K = 96 is outside the class's region"),
    ('[[route]]\nlayout = "nn"\na = "f32"\nb = "f32"\nc = "f32"\n', "at least one class or force rung"),
    ("route = 3", "route"),
    ("", "route"),
]


def _fixture(tmp_path: Path, routes: str, files=("routes.toml",)) -> Path:
    root = tmp_path / "cat"
    shutil.copytree(FIXTURE, root)
    (root / "routes.toml").write_text(routes)
    text = (root / "catalog.toml").read_text().replace('routes = ["routes.toml"]', f"routes = {list(files)!r}".replace("'", '"'))
    (root / "catalog.toml").write_text(text)
    return root / "catalog.toml"


@pytest.mark.parametrize(("text", "problem"), BAD_ROUTES, ids=[f"bad{i}" for i in range(len(BAD_ROUTES))])
def test_bad_route_files_are_refused_at_load(tmp_path, text, problem):
    with pytest.raises(CatalogError, match=None) as info:
        load_catalog(_fixture(tmp_path, text))
    assert problem in str(info.value), str(info.value)
    assert "\n" not in str(info.value).strip()


def test_a_class_of_other_parameters_is_refused(tmp_path):
    root = _fixture(tmp_path, _route('{ name = "x", check = { N = 40, K = 96 }, rungs = [{ symbols = "control_gemm_chain_2d", '
                                     'm = [1, 64] }, { symbols = "control_gemm_chain" }] }'))
    neg = root.parent / "negative.toml"
    neg.write_text(neg.read_text().replace('{ name = "A", type = "ptr", dtype = "f32", shape = ["M * K"], '
                                           'fill = "uniform(-1,1)" },\n  { name = "B", type = "ptr", dtype = "f32", '
                                           'shape = ["K * N"], fill = "uniform(-1,1)" },\n  { name = "M", type = "i32", '
                                           'value = "M" },\n  { name = "N", type = "i32", value = "N" },\n  { name = "K", '
                                           'type = "i32", value = "K" },\n]\nqualify = { dims = { M = 67, N = 40, K = 96 }, '
                                           'reference = "qneg_refs:gemm", batch_dim = "M", rtol = 1e-5, atol = 1e-5 }\n\n'
                                           '[[family]]\nname = "pairwise_gemm"',
                                           '{ name = "A", type = "ptr", dtype = "f32", shape = ["M * K"], '
                                           'fill = "logu(-1,1)" },\n  { name = "B", type = "ptr", dtype = "f32", '
                                           'shape = ["K * N"], fill = "uniform(-1,1)" },\n  { name = "M", type = "i32", '
                                           'value = "M" },\n  { name = "N", type = "i32", value = "N" },\n  { name = "K", '
                                           'type = "i32", value = "K" },\n]\nqualify = { dims = { M = 67, N = 40, K = 96 }, '
                                           'reference = "qneg_refs:gemm", batch_dim = "M", rtol = 1e-5, atol = 1e-5 }\n\n'
                                           '[[family]]\nname = "pairwise_gemm"', 1))
    with pytest.raises(CatalogError, match="unlike the class reference control_gemm_chain"):
        load_catalog(root)


@pytest.mark.parametrize("rel", ["/etc/passwd", "../routes.toml", "missing.toml"])
def test_route_file_paths_stay_inside_the_catalog(tmp_path, rel):
    with pytest.raises(CatalogError):
        load_catalog(_fixture(tmp_path, _route(), files=(rel,)))


def test_the_route_file_is_part_of_the_catalog_digest(tmp_path):
    path = _fixture(tmp_path, _route())
    d1 = load_catalog(path).digest()
    (path.parent / "routes.toml").write_text(_route() + "\n# changed\n")
    assert load_catalog(path).digest() != d1


def test_a_narrowed_catalog_keeps_its_routes_symbols_and_digest(cat):
    """`build --kernels` / `--module` narrow the catalog: the symbols shrink (no stale cache), the routes and the
    digest stay the whole catalog's, so a filtered build records the catalog it came from."""
    from mamba_forge.catalog.select import select_symbols

    n = select_symbols(cat, ["softplus*"])
    assert set(n.symbols) == {s for s in cat.symbols if s.startswith("softplus")} and len(n.symbols) < len(cat.symbols)
    assert n.routes == cat.routes and n.digest() == cat.digest()
    m = cat.narrowed(tuple(x for x in cat.modules if x.kind == "TriadScalar"))
    assert set(m.symbols) == {"triad_scalar_nn_f32", "triad_scalar_tn_f32", "triad_scalar_nt_f32"}
    assert m.digest() == cat.digest()
