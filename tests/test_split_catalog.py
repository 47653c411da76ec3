"""A family's `split` declaration (catalog/split_rules.py): a valid one loads (the built-in token families
included), and every rule refuses a bad declaration when the catalog loads, with one line naming file, family
and problem."""

from __future__ import annotations

import pytest
from test_catalog import ROOT, error_of, make

from mamba_forge.catalog.model import default_catalog_path, load_catalog

# a token-major running sum: out and x are [batch, L, channels], state [batch, channels] carried between calls
FAMILY = """
[[family]]
name = "run_sum"
instantiate = "RUN_SUM"
variants = ["f32"]
launch = { block = 128, grid = ["ceil_div(channels, 128)", "batch"] }
params = [
  { name = "out", type = "ptr", dtype = "T", role = "out", shape = ["batch", "L", "channels"] },
  { name = "state", type = "ptr", dtype = "f32", role = "inout", shape = ["batch * channels"], fill = "uniform(-1,1)" },
  { name = "x", type = "ptr", dtype = "T", shape = ["batch * L * 2 * channels"], fill = "uniform(-1,1)" },
  { name = "w", type = "ptr", dtype = "f32", shape = ["channels"], fill = "uniform(-1,1)" },
  { name = "batch", type = "i32", value = "batch" },
  { name = "channels", type = "i32", value = "channels" },
  { name = "L", type = "i64", value = "L" },
]
split = { dim = "L", batch = "batch", sequence = ["out", "x"], carried = ["state"], chunks = [1, 5, 16] }
qualify = { dims = { batch = 3, channels = 130, L = 37 } }
"""

SPLIT = 'split = { dim = "L", batch = "batch", sequence = ["out", "x"], carried = ["state"], chunks = [1, 5, 16] }'


def test_a_valid_split_loads_with_its_fields(tmp_path):
    cat = load_catalog(make(tmp_path, ROOT, FAMILY))
    sp = cat.modules[0].family("run_sum").split
    assert (sp.dim, sp.batch, sp.sequence, sp.carried, sp.chunks) == ("L", "batch", ["out", "x"], ["state"], [1, 5, 16])
    axes = FAMILY.replace('shape = ["batch * L * 2 * channels"]', 'shape = ["batch * L", "2", "channels"]')
    assert load_catalog(make(tmp_path, ROOT, axes)).modules[0].family("run_sum").split.sequence == ["out", "x"]
    no_batch = FAMILY.replace(SPLIT, 'split = { dim = "L", sequence = ["out", "x"], carried = ["state"], chunks = [2] }')
    no_batch = no_batch.replace('shape = ["batch", "L", "channels"]', 'shape = ["L", "batch", "channels"]')  # [L, rest]
    assert load_catalog(make(tmp_path, ROOT, no_batch)).modules[0].family("run_sum").split.batch is None


def test_the_builtin_token_families_declare_split():
    fixed = load_catalog(default_catalog_path()).module("Fixed")
    for name in ("ssm_scan_tokens", "ssm_scan_tokens_ws"):
        scan = fixed.family(name).split
        assert (scan.dim, scan.batch, scan.carried) == ("L", "batch", ["state"])
        assert set(scan.sequence) == {"out", "u", "dt", "x_dbl", "xz"} and 1 in scan.chunks
    for name in ("conv1d_tokens_silu", "conv1d_tokens_silu_vec"):
        conv = fixed.family(name).split
        assert (conv.dim, conv.batch, conv.sequence, conv.carried) == ("L", "batch", ["out", "xz"], ["conv_state"])
        assert 1 in conv.chunks
    others = [f.name for m in load_catalog(default_catalog_path()).modules for f in m.families if f.split]
    assert sorted(others) == ["conv1d_tokens_silu", "conv1d_tokens_silu_vec", "ssm_scan_tokens", "ssm_scan_tokens_ws"]


def _bad(split: str) -> str:
    return FAMILY.replace(SPLIT, split)


@pytest.mark.parametrize(("family", "expect"), [
    # field rules (the schema)
    (_bad('split = { dim = "L", sequence = [], chunks = [1] }'), "split.sequence is empty"),
    (_bad('split = { dim = "L", sequence = ["out", "out"], chunks = [1] }'), "split.sequence names 'out' twice"),
    (_bad('split = { dim = "L", sequence = ["out", "x"], carried = ["x"], chunks = [1] }'),
     "'x' is both a sequence and a carried param"),
    (_bad('split = { dim = "L", batch = "L", sequence = ["out", "x"], carried = ["state"], chunks = [1] }'),
     "split.batch and split.dim are both 'L'"),
    (_bad('split = { dim = "L", sequence = ["out", "x"], carried = ["state"], chunks = [] }'),
     "split.chunks holds 0 lengths; give 1 to 8"),
    (_bad('split = { dim = "L", sequence = ["out", "x"], carried = ["state"], chunks = [0, 3] }'),
     "split.chunks: 0 is not a length"),
    (_bad('split = { dim = "L", sequence = ["out", "x"], carried = ["state"], chunks = [3, 3] }'),
     "split.chunks names 3 twice"),
    (_bad('split = { dim = "L", sequence = ["out", "x"], carried = ["state"], chunks = [1], colour = "red" }'),
     "colour"),
    # rules over the family's params and dims
    (_bad('split = { dim = "T", batch = "batch", sequence = ["out", "x"], carried = ["state"], chunks = [1] }'),
     "split.dim 'T' is not a qualification dim (qualify.dims: L, batch, channels)"),
    (_bad('split = { dim = "L", batch = "rows", sequence = ["out", "x"], carried = ["state"], chunks = [1] }'),
     "split.batch 'rows' is not a qualification dim"),
    (_bad('split = { dim = "L", batch = "batch", sequence = ["out", "y"], carried = ["state"], chunks = [1] }'),
     "split.sequence names 'y', which is not a pointer param of the family (pointer params: out, state, x, w)"),
    (_bad('split = { dim = "L", batch = "batch", sequence = ["out", "L"], carried = ["state"], chunks = [1] }'),
     "split.sequence names 'L', which is not a pointer param"),
    (_bad('split = { dim = "L", batch = "batch", sequence = ["out", "x"], carried = ["w"], chunks = [1] }'),
     "split.carried 'w' has role 'in'; a carried param is read and written by every call"),
    (_bad('split = { dim = "L", batch = "batch", sequence = ["x"], carried = ["state"], chunks = [1] }'),
     "output 'out' is neither a sequence nor a carried param"),
    (_bad('split = { dim = "L", batch = "batch", sequence = ["out", "x"], carried = ["state"], chunks = [1, 37] }'),
     "split.chunks: 37 does not split L = 37 (the qualification dims)"),
    (FAMILY.replace('qualify = { dims = { batch = 3, channels = 130, L = 37 } }',
                    'qualify = { dims = { batch = 3, channels = 130, L = 37 }, skip = "no harness" }'),
     "the qualifier does not launch this family"),
    (FAMILY.replace('qualify = { dims = { batch = 3, channels = 130, L = 37 } }', ""),
     "the qualifier does not launch this family"),
    (FAMILY.replace('role = "out", shape = ["batch", "L", "channels"] }',
                    'role = "scratch", shape = ["batch", "L", "channels"] }')
           .replace('{ name = "state", type = "ptr", dtype = "f32", role = "inout"',
                    '{ name = "y", type = "ptr", dtype = "f32", role = "out", shape = [1] },\n'
                    '  { name = "state", type = "ptr", dtype = "f32", role = "inout"')
           .replace('sequence = ["out", "x"]', 'sequence = ["out", "x", "y"]'),
     "split.sequence 'out' is a scratch param"),
    (FAMILY.replace('shape = ["batch * L * 2 * channels"], fill = "uniform(-1,1)" }', 'shape = ["batch * L * 2 * channels"] }')
           .replace("qualify = { dims", 'qualify = { prepare = "m:f", dims'),
     "split.sequence 'x' is an input without a fill (qualify.prepare builds it)"),
    # rules that need a symbol's values: layouts, shapes independent of L, every chunk's call launchable
    (FAMILY.replace('shape = ["batch * L * 2 * channels"]', 'shape = ["batch * round_up(L, 8) * channels"]'),
     "split.sequence 'x': shape ['batch * round_up(L, 8) * channels'] (15600 elements at the qualification dims) "
     "is not laid out [batch, L, rest]"),
    (FAMILY.replace('shape = ["batch * L * 2 * channels"]', 'shape = ["L * channels"]'),
     "split.sequence 'x': shape ['L * channels']"),
    (FAMILY.replace('shape = ["batch * L * 2 * channels"]', 'shape = ["batch * L * channels + 1"]'),
     "is not laid out [batch, L, rest]"),
    (FAMILY.replace('shape = ["batch * L * 2 * channels"]', 'shape = ["L", "batch", "2 * channels"]'),
     "split.sequence 'x': shape ['L', 'batch', '2 * channels'] (28860 elements at the qualification dims) is not "
     "laid out [batch, L, rest]"),  # the count divides, the axes are in another order
    (FAMILY.replace('shape = ["batch * L * 2 * channels"]', 'shape = ["2 * channels", "batch * L"]'),
     "split.sequence 'x': shape ['2 * channels', 'batch * L']"),
    (_bad('split = { dim = "L", sequence = ["out", "x"], carried = ["state"], chunks = [2] }'),
     "split.sequence 'out': shape ['batch', 'L', 'channels'] (14430 elements at the qualification dims) is not laid "
     "out [L, rest]"),  # without split.batch the rows are part of rest, so they may not come before L
    (FAMILY.replace('shape = ["batch * channels"], fill', 'shape = ["channels", "batch"], fill'),
     "split.carried 'state': shape ['channels', 'batch'] is not laid out [batch, rest]"),
    (FAMILY.replace('shape = ["batch * channels"], fill', 'shape = ["batch * channels * L"], fill'),
     "split.carried 'state': shape ['batch * channels * L'] is not laid out [batch, rest] with rest independent"),
    (FAMILY.replace('shape = ["batch * channels"], fill', 'shape = ["channels"], fill'),
     "split.carried 'state': shape ['channels'] is not laid out [batch, rest]"),
    (FAMILY.replace('shape = ["channels"], fill', 'shape = ["channels * L"], fill'),
     "'w' is passed whole to every call, but its shape ['channels * L'] changes with L"),
    (FAMILY.replace('grid = ["ceil_div(channels, 128)", "batch"]', 'grid = ["ceil_div(channels, 128)", "L // 2"]'),
     "split.chunks: a call over L = 1 has launch.grid[1] = 0; CUDA needs 1..65535"),
    (FAMILY.replace('grid = ["ceil_div(channels, 128)", "batch"]', 'grid = ["ceil_div(channels, 128)", "L - 5"]')
           .replace("chunks = [1, 5, 16]", "chunks = [16]"),
     "split.chunks: a call over L = 5 has launch.grid[1] = 0"),  # 37 = 16 + 16 + 5: the short tail call
    (FAMILY.replace('shape = ["channels"], fill', 'shape = ["channels * (L - 37) + channels"], fill'),
     "'w' is passed whole to every call, but its shape"),
    (FAMILY.replace('[[family]]', '[[family]]\ndeterministic = false'), "the family is not deterministic"),
])
def test_a_bad_split_is_refused_at_load_naming_the_problem(tmp_path, family, expect):
    msg = error_of(make(tmp_path, ROOT, family))
    assert expect in msg, msg
    assert str(tmp_path) in msg and "run_sum" in msg  # names the file and the family


def test_aux_buffers_and_split_are_refused(tmp_path):
    fam = FAMILY.replace('qualify = { dims = { batch = 3, channels = 130, L = 37 } }',
                         'qualify = { dims = { batch = 3, channels = 130, L = 37 }, prepare = "m:f", '
                         'aux = [{ name = "pool", type = "ptr", dtype = "f32", shape = [4], fill = "const(0)" }] }')
    assert "qualify.aux buffers, which a chunked call could not cut or carry" in error_of(make(tmp_path, ROOT, fam))
