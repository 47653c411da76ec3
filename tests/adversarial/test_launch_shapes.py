"""Impossible launches in a catalog: a grid CUDA cannot launch, a block of no or too many threads, dynamic shared
memory below 0 or above the target's opt-in limit, non-positive qualification dims, literals the expression
grammar does not have, wrongly typed fields, fallback templates naming unknown keys and binary sources. Each is one
CatalogError line naming the file, the entry, the field and the limit; each has a good neighbour that still loads.
"""

from __future__ import annotations

import pytest
from catalog_gen import refused, write_catalog
from harden_support import cli, one_line_error

from mamba_forge.catalog.model import load_catalog


def launch(block="128", grid='["ceil_div(n, 128)"]', smem=None):
    return "{ " + ", ".join(f"{k} = {v}" for k, v in
                            (("block", block), ("grid", grid), ("dynamic_smem", smem)) if v is not None) + " }"


BAD_GRIDS = [  # (grid, expected words)
    ('["0"]', "grid[0] = 0"),
    ('["-1"]', "grid[0] = -1"),
    ('["n - 1000"]', "at the qualification dims"),
    ('["n - 2000"]', "grid[0] = -1000"),
    ('["1 << 40"]', "2147483647"),
    ('["2**31"]', "2147483647"),
    ('["2147483648"]', "2147483647"),
    ('["n * 4294967"]', "2147483647"),
    ('["1", "65536"]', "grid[1] = 65536"),
    ('["1", "1", "65536"]', "grid[2] = 65536"),
    ('["1", "0"]', "grid[1] = 0"),
    ('["1", "-5"]', "grid[1] = -5"),
    ('["1", "1", "0"]', "grid[2] = 0"),
    ('["n", "n * 66"]', "grid[1] = 66000"),
    ('["1.5"]', "grid[0] = 1.5"),
    ('["min(0, n)"]', "grid[0] = 0"),
    ('["n // 2000"]', "grid[0] = 0"),
    ('["0x10"]', "not a decimal number"),
    ('["1_000"]', "not a decimal number"),
    ('["0b11"]', "not a decimal number"),
    ('["0o17"]', "not a decimal number"),
    ('["2j"]', "not a decimal number"),
    ('["n", "0X1"]', "not a decimal number"),
    ('[]', "1 to 3"),
    ('["1", "1", "1", "1"]', "1 to 3"),
]
GOOD_GRIDS = ['["2147483647"]', '["1", "65535", "65535"]', '["n", "1", "1"]', '["ceil_div(n, 7)", "3"]']


@pytest.mark.parametrize(("grid", "needle"), BAD_GRIDS, ids=[g for g, _ in BAD_GRIDS])
def test_impossible_grid_refused(tmp_path, grid, needle):
    refused(write_catalog(tmp_path, {"launch": launch(grid=grid)}), "fam.toml", "name=k", needle)


@pytest.mark.parametrize("grid", GOOD_GRIDS)
def test_launchable_grid_loads(tmp_path, grid):
    assert load_catalog(write_catalog(tmp_path, {"launch": launch(grid=grid)})).symbols["k_f32"]


BAD_BLOCKS = [
    ("0", "at least 1"),
    ("-1", "at least 1"),
    ("-128", "at least 1"),
    ("1025", "block[0] = 1025"),
    ("2048", "block[0] = 2048"),
    ("[32, 32, 2]", "at most 1024"),
    ("[1, 1, 65]", "block[2] = 65"),
    ("[1025, 1, 1]", "block[0] = 1025"),
    ("[1, 1025]", "block[1] = 1025"),
    ("[64, 17]", "at most 1024"),
    ("[1, 2, 3, 4]", "1 to 3 dims"),
    ("[1, 1, 1, 1, 1, 1]", "1 to 3 dims"),
    ("[]", "1 to 3 dims"),
    ("[32, 0, 1]", "at least 1"),
    ("[32, 1, -1]", "at least 1"),
    ("true", "block"),
    ("[true, 1, 1]", "block"),
    ('"0x80"', "not a decimal number"),
    ('"1 << 20"', "at most 1024"),
    ('"2 ** 62"', "at most 1024"),
    ("1.0", "block"),
]
GOOD_BLOCKS = ["1", "1024", "[32, 32, 1]", "[1, 1, 64]", "[1024]", '"32 * 8"']


@pytest.mark.parametrize(("block", "needle"), BAD_BLOCKS, ids=[b for b, _ in BAD_BLOCKS])
def test_impossible_block_refused(tmp_path, block, needle):
    refused(write_catalog(tmp_path, {"launch": launch(block=block)}), "fam.toml", "name=k", "block", needle)


@pytest.mark.parametrize("block", GOOD_BLOCKS)
def test_launchable_block_loads(tmp_path, block):
    assert load_catalog(write_catalog(tmp_path, {"launch": launch(block=block)})).symbols["k_f32"].threads <= 1024


BAD_SMEM = [  # (dynamic_smem, module arch, expected words)
    ("-1", '["sm_80+"]', "0..232448"),
    ('"-4096"', '["sm_80+"]', "0..232448"),
    ("232449", '["sm_80+"]', "227 KiB"),
    ("1099511627776", '["sm_90a"]', "0..232448"),
    ("166913", '["sm_80"]', "0..166912"),  # sm_80 alone: 163 KiB
    ("101377", '["sm_86"]', "0..101376"),  # 99 KiB
    ("101377", '["sm_120"]', "0..101376"),
    ('"0x100"', '["sm_80+"]', "not a decimal number"),
    ("true", '["sm_80+"]', "dynamic_smem"),
    ("2.5", '["sm_80+"]', "dynamic_smem"),
]
GOOD_SMEM = [("0", '["sm_80+"]'), ("232448", '["sm_90a"]'), ("166912", '["sm_80"]'), ('"48 * 1024"', '["sm_86"]')]


@pytest.mark.parametrize(("smem", "arch", "needle"), BAD_SMEM, ids=[f"{s}-{a}" for s, a, _ in BAD_SMEM])
def test_impossible_dynamic_smem_refused(tmp_path, smem, arch, needle):
    path = write_catalog(tmp_path, {"launch": launch(smem=smem)}, {"arch": arch})
    refused(path, "fam.toml", "name=k", "dynamic_smem", needle)


@pytest.mark.parametrize(("smem", "arch"), GOOD_SMEM)
def test_dynamic_smem_within_the_target_loads(tmp_path, smem, arch):
    load_catalog(write_catalog(tmp_path, {"launch": launch(smem=smem)}, {"arch": arch}))


BAD_DIMS = [("-1", "= -1"), ("0", "= 0"), ("-1000000", "= -1000000"), ("2199023255553", "1..2**40"),
            ("true", "dims"), ('"1000"', "dims"), ("1.5", "dims")]


@pytest.mark.parametrize(("dim", "needle"), BAD_DIMS, ids=[d for d, _ in BAD_DIMS])
def test_non_positive_qualification_dims_refused(tmp_path, dim, needle):
    refused(write_catalog(tmp_path, {"qualify": f"{{ dims = {{ n = {dim} }} }}"}), "fam.toml", "name=k", needle)


BAD_TYPES = [  # (family field overrides, module field overrides, header, expected words)
    ({}, {}, 'schema = "1"', "schema"),
    ({}, {}, "schema = 1.0", "schema"),
    ({}, {}, "schema = true", "schema"),
    ({}, {"mandatory": '"true"'}, "schema = 1", "mandatory"),
    ({}, {"mandatory": '"false"'}, "schema = 1", "mandatory"),
    ({}, {"mandatory": "1"}, "schema = 1", "mandatory"),
    ({}, {"deterministic": '"yes"'}, "schema = 1", "deterministic"),
    ({}, {"state_capacity": "0"}, "schema = 1", "state_capacity"),
    ({"deterministic": '"true"'}, {}, "schema = 1", "deterministic"),
    ({"variants": '"f32"'}, {}, "schema = 1", "variants"),
    ({"policy": '{ max_regs = "32" }'}, {}, "schema = 1", "max_regs"),
    ({"policy": "{ max_regs = true }"}, {}, "schema = 1", "max_regs"),
    ({"qualify": '{ dims = { n = 1000 }, exact = "yes" }'}, {}, "schema = 1", "exact"),
    ({"params": '[{ name = "y", type = "ptr", dtype = "T", role = "out", shape = [true] }]'}, {}, "schema = 1",
     "shape"),
    ({"params": '[{ name = "a", type = "f32", value = true }]'}, {}, "schema = 1", "value"),
]


@pytest.mark.parametrize(("fam", "mod", "header", "needle"), BAD_TYPES, ids=[str(i) for i in range(len(BAD_TYPES))])
def test_wrongly_typed_field_refused_not_coerced(tmp_path, fam, mod, header, needle):
    refused(write_catalog(tmp_path, fam, mod, header=header), needle)


BAD_FALLBACKS = ['["{name}_{nope}"]', '["{missing}"]', '["{name}_{dtype}", "{BM}_x"]', '["{T}_{L}"]']


@pytest.mark.parametrize("fallback", BAD_FALLBACKS)
def test_fallback_naming_an_unknown_key_refused(tmp_path, fallback):
    refused(write_catalog(tmp_path, {"fallback": fallback}), "fam.toml", "name=k", "fallback", "unknown key")


def test_fallback_naming_known_keys_loads(tmp_path):
    cat = load_catalog(write_catalog(tmp_path, {"fallback": '["{name}_{dtype}_{T}"]'}))
    assert cat.symbols["k_f32"].fallback == ["k_f32_f32"]


BINARY_SOURCES = [b"\xff\xfe\x00\x00", b"\x80abc", b"int x; // caf\xe9\n", b"\xc3\x28"]


@pytest.mark.parametrize("data", BINARY_SOURCES, ids=lambda b: b[:6].hex())
def test_binary_source_refused(tmp_path, data):
    refused(write_catalog(tmp_path, source=data), "src/k.cu", "not UTF-8")


def test_utf8_source_with_non_ascii_loads(tmp_path):
    load_catalog(write_catalog(tmp_path, source="// café\n".encode() + b"int x;\n"))


@pytest.mark.parametrize(("fam", "needle"), [({"launch": launch(grid='["0"]')}, "grid[0] = 0"),
                                             ({"launch": launch(block="[1, 2, 3, 4]")}, "1 to 3 dims"),
                                             ({"fallback": '["{nope}"]'}, "unknown key")])
def test_cli_build_exits_2_on_one_line(tmp_path, fam, needle):
    path = write_catalog(tmp_path / "cat", fam)
    code, _, err = cli("build", "--catalog", path, "--out", tmp_path / "out", "--arch", "sm_90a", "-q")
    assert code == 2 and one_line_error(err) and needle in err, err
    assert not (tmp_path / "out").exists()
