"""Hostile input to the placement warning: a family's `acknowledge` table (one CatalogError line naming the entry,
and through the CLI exit 2 with no build folder) and PTX the special-register scan must read in bounded time
without recursion (call cycles, deep chains, lookalike names, garbage)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from mamba_forge.build import cubin
from mamba_forge.catalog.model import load_catalog
from mamba_forge.core.errors import CatalogError

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "qualify_negative"
ACK = 'acknowledge = { smid = "rotation of a commutative pairwise tree: each pair is added once, a + b == b + a" }'

ACKNOWLEDGEMENTS = [
    ('acknowledge = { tid = "not special" }', "acknowledge.tid: not a placement-dependent register"),
    ('acknowledge = { "%smid" = "with the percent sign" }', "acknowledge.%smid: not a placement-dependent register"),
    ('acknowledge = { SMID = "upper case" }', "acknowledge.SMID: not a placement-dependent register"),
    ('acknowledge = { "smid " = "trailing space" }', "not a placement-dependent register"),
    ('acknowledge = { "" = "empty key" }', "acknowledge.: not a placement-dependent register"),
    ('acknowledge = { smid = "" }', "acknowledge.smid: give the reason"),
    ('acknowledge = { smid = "   " }', "acknowledge.smid: give the reason"),
    ('acknowledge = { smid = "\\n\\t" }', "acknowledge.smid: give the reason"),
    ('acknowledge = { smid = "' + "x" * 201 + '" }', "acknowledge.smid: give the reason in 1 to 200 characters"),
    ('acknowledge = { smid = 1 }', "acknowledge.smid"),
    ('acknowledge = { smid = true }', "acknowledge.smid"),
    ('acknowledge = { smid = ["a"] }', "acknowledge.smid"),
    ('acknowledge = { smid = { why = "nested" } }', "acknowledge.smid"),
    ('acknowledge = "smid"', "acknowledge"),
    ('acknowledge = ["smid"]', "acknowledge"),
    ('acknowledge = 0', "acknowledge"),
]


def _catalog_with(tmp_path: Path, acknowledge: str) -> Path:
    (tmp_path / "src").mkdir()
    for f in (FIXTURE / "src").iterdir():
        (tmp_path / "src" / f.name).write_bytes(f.read_bytes())
    for name in ("catalog.toml", "negative.toml", "routes.toml", "split.toml"):
        (tmp_path / name).write_text((FIXTURE / name).read_text())
    fam = (FIXTURE / "placement.toml").read_text()
    assert ACK in fam
    (tmp_path / "placement.toml").write_text(fam.replace(ACK, acknowledge))
    return tmp_path / "catalog.toml"


@pytest.mark.parametrize(("acknowledge", "problem"), ACKNOWLEDGEMENTS, ids=[a[16:40] for a, _ in ACKNOWLEDGEMENTS])
def test_bad_acknowledgements_are_refused_with_the_entry(tmp_path, acknowledge, problem):
    with pytest.raises(CatalogError) as err:
        load_catalog(_catalog_with(tmp_path, acknowledge))
    msg = str(err.value)
    assert problem in msg and "smid_rotated_tree_row_sum" in msg and "placement.toml" in msg
    assert "\n" not in msg.split("hint:")[0].strip()


@pytest.mark.parametrize("acknowledge", [ACKNOWLEDGEMENTS[0][0], ACKNOWLEDGEMENTS[5][0]])
def test_the_cli_refuses_a_bad_acknowledgement_in_one_line_and_builds_nothing(tmp_path, capsys, acknowledge):
    from mamba_forge.cli import main

    cat = _catalog_with(tmp_path, acknowledge)
    out = tmp_path / "out"
    assert main(["build", "--catalog", str(cat), "--out", str(out), "--arch", "sm_90a", "-q"]) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert lines[0].startswith("error: ") and "acknowledge." in lines[0] and len(lines) <= 2
    assert "Traceback" not in err and not out.exists()


def _chain(n: int, reads_at_end: str) -> str:
    funcs = [f".func f{i}()\n{{\n call.uni f{i + 1}, ();\n ret;\n}}\n" for i in range(n)]
    funcs.append(f".func f{n}()\n{{\n mov.u32 %r1, %{reads_at_end};\n ret;\n}}\n")
    return "".join(funcs) + ".visible .entry k(.param .u64 p)\n{\n call.uni f0, ();\n}\n"


PTXS = [
    # (name, PTX, expected per entry)
    ("self-recursion", ".func f()\n{\n call.uni f, ();\n mov.u32 %r1, %smid;\n}\n"
                       ".visible .entry k(.param .u64 p)\n{\n call.uni f, ();\n}\n", {"k": ["smid"]}),
    ("a cycle", ".func a()\n{\n call.uni b, ();\n}\n.func b()\n{\n call.uni a, ();\n mov.u64 %rd1, %clock64;\n}\n"
                ".visible .entry k(.param .u64 p)\n{\n call.uni a, ();\n}\n", {"k": ["clock64"]}),
    ("a deep chain", _chain(20000, "warpid"), {"k": ["warpid"]}),
    ("lookalikes", ".visible .entry k(.param .u64 p)\n{\n mov.u32 %r1, %smid_x;\n mov.u32 %r2, %smids;\n"
                   " mov.u32 %r3, %clock64x;\n mov.u32 %r4, %tid.x;\n}\n", {}),
    ("an entry calling an entry name", ".visible .entry a(.param .u64 p)\n{\n mov.u32 %r1, %nsmid;\n}\n"
                                        ".visible .entry b(.param .u64 p)\n{\n call.uni a, ();\n}\n",
     {"a": ["nsmid"], "b": ["nsmid"]}),
    ("a call to nothing", ".visible .entry k(.param .u64 p)\n{\n call.uni missing, ();\n call (r), , ();\n}\n", {}),
    ("no entry", ".func f()\n{\n mov.u32 %r1, %smid;\n}\n", {}),
    ("garbage", "\x00\xff{{{{ .entry ( %smid ) call call.uni ( ( ( ,,, .func .func", {}),
    ("empty", "", {}),
    ("every register", ".visible .entry k(.param .u64 p)\n{\n"
                       + "".join(f" mov.u32 %r{i}, %{r};\n" for i, r in enumerate(cubin.PLACEMENT_REGISTERS)) + "}\n",
     {"k": sorted(cubin.PLACEMENT_REGISTERS)}),
    ("many entries", "".join(f".visible .entry k{i}(.param .u64 p)\n{{\n mov.u32 %r1, %tid.x;\n}}\n"
                             for i in range(20000)), {}),
]


@pytest.mark.parametrize(("name", "ptx", "want"), PTXS, ids=[p[0] for p in PTXS])
def test_hostile_ptx_is_scanned_in_bounded_time(name, ptx, want):
    t0 = time.perf_counter()
    assert cubin.special_registers_by_entry(ptx) == want
    assert time.perf_counter() - t0 < 1.0
