"""Catalog validation (one clear error naming file, entry and problem), expansion, and state capacity."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mamba_forge.catalog.model import default_catalog_path, load_catalog, state_capacity
from mamba_forge.core.errors import CatalogError, ForgeError

FIXTURES = Path(__file__).parent / "fixtures"

ROOT = """
[catalog]
schema = 1
name = "t"

[[module]]
kind = "M"
arch = ["sm_80+"]
sources = ["k.cu"]
families = ["f.toml"]
include = []
"""

FAMILY = """
[[family]]
name = "scale"
instantiate = "SCALE"
bare = "f32"
variants = ["bf16", "f16"]
launch = { block = 128 }
"""


def make(tmp_path: Path, root: str = ROOT, family: str = FAMILY) -> Path:
    (tmp_path / "k.cu").write_text("// nothing\n")
    (tmp_path / "f.toml").write_text(textwrap.dedent(family))
    (tmp_path / "catalog.toml").write_text(textwrap.dedent(root))
    return tmp_path / "catalog.toml"


def error_of(path: Path) -> str:
    with pytest.raises(CatalogError) as exc:
        load_catalog(path)
    msg = str(exc.value)
    assert "\n" not in msg, "catalog errors are one line"
    return msg


def test_variants_and_bare_expand_in_order(tmp_path):
    cat = load_catalog(make(tmp_path))
    names = [s.name for s in cat.modules[0].symbols]
    assert names == ["scale", "scale_bf16", "scale_f16"]
    bare = cat.symbols["scale"]
    assert bare.dtype == "f32" and bare.macro_args == ["float"]
    assert cat.symbols["scale_bf16"].macro_args == ["__nv_bfloat16"]


def test_instances_times_variants_with_expressions(tmp_path):
    fam = """
    [[family]]
    name = "gemm"
    instantiate = "GEMM"
    variants = ["bf16", "f16"]
    symbol = "{name}_m{BM}n{BN}_s{S}_{dtype}"
    args = ["T", "BM", "BN", "S"]
    instances = [{ BM = 128, BN = 64, S = 2 }, { BM = 64, BN = 64, S = 3 }]
    launch = { block = "BM * 2", dynamic_smem = "(BM + BN) * 32 * S * sizeof_T" }
    """
    cat = load_catalog(make(tmp_path, family=fam))
    syms = cat.modules[0].symbols
    assert [s.name for s in syms] == [
        "gemm_m128n64_s2_bf16", "gemm_m64n64_s3_bf16", "gemm_m128n64_s2_f16", "gemm_m64n64_s3_f16",
    ]
    s = cat.symbols["gemm_m128n64_s2_bf16"]
    assert s.block == (256, 1, 1)
    assert s.dynamic_smem == (128 + 64) * 32 * 2 * 2
    assert s.macro_args == ["__nv_bfloat16", "128", "64", "2"]


# one tile instance naming its layout
LAYOUT_FAMILY = FAMILY.replace('"scale"', '"gemm_tn"').replace(
    'bare = "f32"\nvariants = ["bf16", "f16"]',
    'symbol = "{name}_m{BM}"\nargs = ["L", "BM"]\ninstances = [{ L = "tn", BM = 128 }]',
)


def test_layout_name_becomes_the_one_enumerator(tmp_path):
    s = load_catalog(make(tmp_path, family=LAYOUT_FAMILY)).symbols["gemm_tn_m128"]
    assert s.macro_args == ["mf::Layout::TN", "128"]
    assert s.params_env["L"] == "tn"


@pytest.mark.parametrize("bad", ['"tt"', '"TN"', "1"])
def test_unknown_layout_is_refused_naming_file_family_and_value(tmp_path, bad):
    msg = error_of(make(tmp_path, family=LAYOUT_FAMILY.replace('L = "tn"', f"L = {bad}")))
    assert str(tmp_path / "f.toml") in msg and "family[0] (name=gemm_tn)" in msg
    assert f"unknown layout L = {bad.replace(chr(34), chr(39))}" in msg and "nn, tn, nt" in msg


def test_layout_enum_in_the_header_matches_the_catalog():
    """mf/layout.cuh declares exactly the enumerators the catalog maps layout names to."""
    from mamba_forge.core.vocab import LAYOUT_ENUMS, LAYOUTS

    header = (default_catalog_path().parent / "include" / "mf" / "layout.cuh").read_text()
    assert "enum Layout : int { NN = 0, TN = 1, NT = 2 };" in header
    assert LAYOUT_ENUMS == {"nn": "mf::Layout::NN", "tn": "mf::Layout::TN", "nt": "mf::Layout::NT"}
    assert LAYOUTS == ("nn", "tn", "nt")


def test_a_source_file_belongs_to_one_module(tmp_path):
    second = ROOT.split("[[module]]")[1].replace('kind = "M"', 'kind = "N"').replace('families = ["f.toml"]', "")
    msg = error_of(make(tmp_path, root=ROOT + "\n[[module]]" + second))
    assert "module[1] (kind=N)" in msg and "source 'k.cu' is already a source of module M" in msg
    assert "header" in msg  # says where shared code goes


def test_builtin_modules_share_code_through_headers_only():
    """No source file in two modules, and every source is a family .cu (shared device code is in include/mf)."""
    cat = load_catalog(default_catalog_path())
    sources = [rel for m in cat.modules for rel in m.module.sources]
    assert len(sources) == len(set(sources))
    assert all(rel.endswith(".cu") and not rel.startswith("include/") for rel in sources)


def test_policy_inherits_defaults_module_then_family(tmp_path):
    root = ROOT.replace("[[module]]", "[defaults]\npolicy = { max_regs = 200, max_stack = 16 }\n\n[[module]]")
    root = root.replace('include = []', 'include = []\npolicy = { max_regs = 128 }')
    fam = FAMILY + 'policy = { max_spill = 8 }\n'
    p = load_catalog(make(tmp_path, root=root, family=fam)).symbols["scale"].policy
    assert (p.max_regs, p.max_stack, p.max_spill) == (128, 16, 8)


@pytest.mark.parametrize(
    ("root", "family", "expect"),
    [
        (ROOT.replace('arch = ["sm_80+"]', 'arch = ["sm80"]'), FAMILY, "module[0] (kind=M).arch"),
        (ROOT.replace("schema = 1", "schema = 7"), FAMILY, "schema is 7"),
        (ROOT.replace('kind = "M"', 'kind = "M"\ncolour = "red"'), FAMILY, "colour"),
        (ROOT.replace('"k.cu"', '"missing.cu"'), FAMILY, "source 'missing.cu' not found"),
        (ROOT, FAMILY.replace('"bf16", "f16"', '"bf16", "f8"'), "unknown dtype 'f8'"),
        (ROOT, FAMILY + FAMILY.replace("bare", "# bare"), "family declared twice"),
        (ROOT, FAMILY.replace("block = 128", 'block = "BM * 2"'), "unknown name 'BM'"),
        (ROOT, FAMILY.replace("block = 128", 'block = "__import__(1)"'), "may be called"),
        (ROOT, FAMILY.replace('name = "scale"', 'name = "scale-x"'), "not a C identifier"),
        (ROOT, FAMILY + '\n[[family]]\nname = "other"\nsymbol = "scale"\nlaunch = { block = 32 }\n', "already declared"),
        (ROOT, FAMILY + 'params = [{ name = "p", type = "ptr" }]\n', "needs a dtype"),
        (ROOT, FAMILY + 'params = [{ name = "p", type = "ptr", dtype = "T", fill = "gauss" }]\n', "unknown fill"),
        (ROOT, "[[family]]\nname = 3\n", "family[0]"),
        (ROOT, "this is not toml", "not valid TOML"),
    ],
)
def test_malformed_catalog_names_file_entry_and_problem(tmp_path, root, family, expect):
    msg = error_of(make(tmp_path, root=root, family=family))
    assert expect in msg
    assert str(tmp_path) in msg  # names the file


def test_missing_catalog_says_what_to_do(tmp_path):
    msg = error_of(tmp_path / "nope.toml")
    assert "not found" in msg and "--catalog" in msg


def test_user_catalog_resolves_sources_relative_to_itself():
    cat = load_catalog(FIXTURES / "build_basic" / "catalog.toml")
    mod = cat.modules[0]
    assert mod.root == (FIXTURES / "build_basic").resolve()
    assert [s.name for s in mod.symbols] == ["scale", "scale_bf16", "scale_f16", "tile_sum_t64", "tile_sum_t256"]


def test_builtin_catalog_loads_and_every_module_gates_a_default_target():
    from mamba_forge.catalog.targets import DEFAULT_TARGETS, get_target

    cat = load_catalog(default_catalog_path())
    kinds = {m.kind for m in cat.modules}
    assert {"Fixed", "TriadScalar", "TriadSm80", "TriadSm90a", "Sm100", "Sm120"} <= kinds
    targets = [get_target(t) for t in DEFAULT_TARGETS]
    for m in cat.modules:
        assert m.targets(targets), f"{m.kind} builds for no default target"
    assert [m.kind for m in cat.modules if m.module.state_capacity] == ["Fixed"]


@pytest.mark.parametrize(("d_state", "cap"), [(1, 16), (16, 16), (17, 32), (64, 64), (100, 112), (256, 256)])
def test_state_capacity_rounds_up_to_16(d_state, cap):
    assert state_capacity(d_state) == cap


@pytest.mark.parametrize("bad", [0, -5, 257, 1000])
def test_state_capacity_refuses_out_of_range(bad):
    with pytest.raises(ForgeError) as exc:
        state_capacity(bad)
    assert "--state-cap" in str(exc.value)


RULED = FAMILY.replace("launch = { block = 128 }", """launch = { block = 128, grid = ["ceil_div(n, 128)"] }
params = [{ name = "x", type = "ptr", dtype = "T", shape = ["n * width"] }, { name = "n", type = "i64", value = "n" }]
qualify = { dims = { n = 1024, width = 4 } }""")


def test_requires_reaches_the_family_and_is_checked_at_load(tmp_path):
    """A family's dims rules: kept when they name dims of its contract that its qualification shape keeps; a rule
    on a name no expression uses, or one the qualification dims break, is a load error naming it; bounds >= 1."""
    ok = load_catalog(make(tmp_path, family=RULED + "requires = { multiple_of = { n = 8 }, at_most = { width = 4 } }\n"))
    fam = ok.modules[0].family("scale")
    assert (fam.requires.multiple_of, fam.requires.at_most) == ({"n": 8}, {"width": 4})
    assert fam.requires.problem({"n": 12, "width": 4}) == "n = 12 is not a multiple of 8"
    assert fam.requires.problem({"n": 16, "width": 5}) == "width = 5 is above 4"
    for rule, expect in [("multiple_of = { d_state = 8 }", "requires names ['d_state'], which are not dims"),
                         ("multiple_of = { n = 1000 }", "qualification dims break its own requires: n = 1024 is not"),
                         ("at_most = { width = 2 }", "break its own requires: width = 4 is above 2"),
                         ("at_most = { width = 0 }", "a dims rule's bound must be 1..2**40")]:
        assert expect in error_of(make(tmp_path, family=RULED + f"requires = {{ {rule} }}\n")), rule


# ---- in_place_of: the input an output may be exactly (an elementwise kernel run in place) ---------------------

IN_PLACE = FAMILY.replace("launch = { block = 128 }", """launch = { block = 128, grid = ["ceil_div(n, 128)"] }
params = [
  { name = "y", type = "ptr", dtype = "T", role = "out", shape = ["n"]@Y@ },
  { name = "y2", type = "ptr", dtype = "T", role = "out", shape = ["n"]@Y2@ },
  { name = "x", type = "ptr", dtype = "T", shape = ["n"]@X@ },
  { name = "w", type = "ptr", dtype = "f32", shape = ["n"] },
  { name = "wide", type = "ptr", dtype = "T", shape = ["2*n"] },
  { name = "s", type = "ptr", dtype = "T", role = "inout", shape = ["n"]@S@ },
  { name = "n", type = "i64", value = "n"@N@ },
]
qualify = { dims = { n = 1024 }@AUX@ }""")


def in_place_family(**extra: str) -> str:
    """IN_PLACE with each @KEY@ replaced by extra[KEY] (a field added to that param, or qualify's aux), else ""."""
    out = IN_PLACE
    for key in ("Y", "Y2", "X", "S", "N", "AUX"):
        out = out.replace(f"@{key}@", extra.get(key, ""))
    return out


def test_in_place_of_reaches_the_family_and_the_signed_record(tmp_path):
    from mamba_forge.qualify.contract import runtime_symbol

    cat = load_catalog(make(tmp_path, family=in_place_family(Y=', in_place_of = "x"')))
    fam = cat.modules[0].family("scale")
    assert [(p.name, p.in_place_of) for p in fam.params if p.in_place_of] == [("y", "x")]
    rec = runtime_symbol(cat.symbols["scale_bf16"], fam, [[8 * i, 8] for i in range(len(fam.params))], 0)
    assert {p.name: p.in_place_of for p in rec.params} == {"y": "x", "y2": None, "x": None, "w": None, "wide": None,
                                                          "s": None, "n": None}


@pytest.mark.parametrize(("where", "expect"), [
    ({"Y": ', in_place_of = "q"'}, "in_place_of 'q' names no input (type ptr, role in) of this family"),
    ({"Y": ', in_place_of = "y2"'}, "in_place_of 'y2' names no input"),  # another output
    ({"Y": ', in_place_of = "s"'}, "in_place_of 's' names no input"),  # an argument updated in place
    ({"Y": ', in_place_of = "n"'}, "in_place_of 'n' names no input"),  # a scalar
    ({"Y": ', in_place_of = "y"'}, "in_place_of 'y' names no input"),  # itself
    ({"Y": ', in_place_of = "w"'}, "in place takes the output's dtype and shape (T ['n']); w is f32 ['n']"),
    ({"Y": ', in_place_of = "wide"'}, "in place takes the output's dtype and shape (T ['n']); wide is T ['2*n']"),
    ({"Y": ', in_place_of = "x"', "Y2": ', in_place_of = "x"'}, "output 'y' already runs in place of it"),
    ({"X": ', in_place_of = "w"'}, "only an output (type ptr, role out) may be in_place_of an input"),
    ({"S": ', in_place_of = "x"'}, "only an output (type ptr, role out) may be in_place_of an input"),
    ({"N": ', in_place_of = "x"'}, "only an output (type ptr, role out) may be in_place_of an input"),
    ({"AUX": ', aux = [{ name = "t", type = "ptr", dtype = "T", role = "out", shape = ["n"], in_place_of = "x" }]'},
     "aux buffer 't' is declared twice or in_place_of"),
])
def test_in_place_of_rules_are_checked_at_load(tmp_path, where, expect):
    msg = error_of(make(tmp_path, family=in_place_family(**where)))
    assert expect in msg and "family[0] (name=scale)" in msg and str(tmp_path / "f.toml") in msg, msg
