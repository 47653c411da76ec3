"""Generated extern "C" wrappers (catalog/wrappers.py, issue 28: a parameter is declared once): the exact text for
one built-in symbol, what a small catalog's program composes to and compiles to, and one refusal per rule."""

from __future__ import annotations

import re
import textwrap
import tomllib
from pathlib import Path

import pytest
from test_catalog import ROOT, error_of

from mamba_forge.build.jobs import compose
from mamba_forge.catalog import wrappers
from mamba_forge.catalog.model import default_catalog_path, load_catalog

SOURCE = """
#include <cuda_bf16.h>
#include <cuda_fp16.h>
namespace mf {
struct alignas(64) Blob { unsigned long long w[16]; };
template <typename T, int K>
__device__ __forceinline__ void scale(T* __restrict__ y, const T* __restrict__ x, const Blob& b, float a, long long n) {
  for (long long i = threadIdx.x; i < n; i += blockDim.x) y[i] = (T)((float)x[i] * a * K + (float)b.w[0]);
}
}  // namespace mf
"""

# a by-value blob (as a GEMM's TMA descriptors), an instance key in the body and in the bounds, min blocks by arch
FAMILY = """
[[family]]
name = "scale"
body = "mf::scale<T, K>"
bounds = ["B", { "sm_80+" = 1, "sm_90+" = 2 }]
variants = ["f32", "bf16"]
instances = [{ K = 3, B = 128 }]
symbol = "{name}_k{K}_{dtype}"
launch = { block = "B" }
params = [
  { name = "y", type = "ptr", dtype = "T", role = "out", shape = ["n"] },
  { name = "x", type = "ptr", dtype = "T", shape = ["n"] },
  { name = "blob", type = "bytes", size = 128, align = 64, ctype = "mf::Blob" },
  { name = "a", type = "f32", value = 0.5 },
  { name = "n", type = "i64", value = "n" },
]
"""

SCALE_K3_BF16 = (
    'extern "C" __global__ void __launch_bounds__(128, (__CUDA_ARCH__ >= 900 ? 2 : 1)) scale_k3_bf16('
    "__nv_bfloat16* __restrict__ y, const __nv_bfloat16* __restrict__ x, const __grid_constant__ mf::Blob blob, "
    "float a, long long n) {\n"
    "  mf::scale<__nv_bfloat16, 3>(y, x, blob, a, n);\n"
    "}"
)


def make(tmp_path: Path, family: str = FAMILY, root: str = ROOT) -> Path:  # test_catalog's root, our source
    (tmp_path / "k.cu").write_text(SOURCE)
    (tmp_path / "f.toml").write_text(textwrap.dedent(family))
    (tmp_path / "catalog.toml").write_text(textwrap.dedent(root))
    return tmp_path / "catalog.toml"


def test_a_built_in_symbol_s_wrapper_is_exactly_its_params():
    cat = load_catalog(default_catalog_path())
    sym = cat.symbols["ssm_scan_tokens_f32"]
    fam = cat.module(sym.module).family(sym.family)
    assert fam.instantiate is None and sym.macro_args == []
    assert wrappers.wrapper_text(fam, sym.name, sym.params_env, sym.threads) == (
        'extern "C" __global__ void __launch_bounds__(64, 8) ssm_scan_tokens_f32(float* __restrict__ out, '
        "float* __restrict__ state, const float* __restrict__ u, const float* __restrict__ dt, "
        "const float* __restrict__ dt_bias, const float* __restrict__ A_log, const float* __restrict__ x_dbl, "
        "const float* __restrict__ Dp, const float* __restrict__ xz, int batch, int d_inner, int d_state, "
        "int dt_rank, long long L) {\n"
        "  mf::ssm_scan_tokens<float>(out, state, u, dt, dt_bias, A_log, x_dbl, Dp, xz, batch, d_inner, d_state, "
        "dt_rank, L);\n"
        "}"
    )


def test_composed_program_holds_the_wrappers_and_compiles(tmp_path):
    cat = load_catalog(make(tmp_path))
    module = cat.modules[0]
    source = compose(module)
    assert SCALE_K3_BF16 in source
    tail = source.split('#line 1 "<instantiations>"\n', 1)[1]
    assert tail.count('extern "C"') == 2 and "scale_k3_f32(float* __restrict__ y" in tail
    from mamba_forge.build import nvrtc

    for arch, min_blocks in (("sm_80", 1), ("sm_90a", 2)):  # the min blocks by arch, as the bounds' table says
        result = nvrtc.compile_program(source, "m.cu", ["-std=c++17", f"-arch={arch}", nvrtc.CUDA_INCLUDE_TOKEN], {})
        assert result.ok, result.log
        ptx = result.ptx.decode()
        entry = ptx[ptx.index(".entry scale_k3_bf16(") :]
        entry = entry[: entry.index("{")]
        # the blob by value with the catalog's size and align (the ABI the qualifier's census checks)
        assert re.findall(r"\.param ([^\n,]+)", entry) == [
            ".u64 scale_k3_bf16_param_0",
            ".u64 scale_k3_bf16_param_1",
            ".align 64 .b8 scale_k3_bf16_param_2[128]",
            ".f32 scale_k3_bf16_param_3",
            ".u64 scale_k3_bf16_param_4",
        ]
        assert ".maxntid 128, 1, 1" in entry and f".minnctapersm {min_blocks}" in entry


def case(old: str, new: str, expected: str, why: str):
    """A refusal: FAMILY with `old` replaced by `new` is refused with a message holding `expected`."""
    return pytest.param(old, new, expected, id=why)


REFUSALS = [
    case('body = "', 'instantiate = "SCALE"\nbody = "', "names both instantiate", "macro and body"),
    case('bounds = ["B", { "sm_80+" = 1, "sm_90+" = 2 }]\n', "", "needs bounds", "bounds missing"),
    case('body = "mf::scale<T, K>"', 'instantiate = "SCALE"', "bounds shape a generated wrapper only", "no body"),
    case('body = "', 'args = ["T"]\nbody = "', "args are a macro's arguments", "macro args with a body"),
    case("<T, K>", "<T>(y); evil()", "is not a qualified C name", "body not a name"),
    case("<T, K>", "<T, BM>", "template argument 'BM' is neither an instance key", "body argument not a key"),
    case('["B", {', '["B", 1, {', "at most 2 entries", "bounds too long"),
    case('["B", {', '[{ "sm_80+" = 64 }, {', "bounds[0] (threads)", "threads by arch"),
    case('"sm_90+" = 2', '"sm_90a" = 2', "not of the form sm_NN+", "gate not sm_NN+"),
    case('"sm_90+" = 2', '"sm_90+" = 0', "min_blocks 0 for sm_90+", "min blocks zero"),
    case('{ "sm_80+" = 1, "sm_90+" = 2 }', "{}", "an empty table by arch", "empty arch table"),
    case('"sm_80+" = 1, ', "", "no entry covers sm_80", "arch table above the module's lowest"),
    case('block = "B"', 'block = "2 * B"', "fewer than the launch's block of 256", "fewer threads than the block"),
    case('["B",', '["BM",', "bounds:", "bounds name no key"),
    case('{ "sm_80+" = 1, "sm_90+" = 2 }', '"K - 3"', "bounds[1] = 0 min blocks", "min blocks below one"),
    case('name = "a"', 'name = "a) { evil(); } void f(int b"', "is not a C identifier", "param not an identifier"),
    case('ctype = "mf::Blob"', 'ctype = "mf::Blob*"', "is not a qualified C name", "ctype not a name"),
    case(', ctype = "mf::Blob"', "", "needs ctype", "bytes without ctype"),
    case('"f32", value', '"f32", ctype = "float", value', "takes neither shape, role nor ctype", "scalar ctype"),
    case('type = "f32", value', 'type = "f16", value', "type", "unknown scalar type"),
    case('"T", shape = ["n"] }', '"E", shape = ["n"] }', "dtype 'E' is neither a dtype token", "unknown dtype"),
]


@pytest.mark.parametrize(("old", "new", "expected"), REFUSALS)
def test_an_inconsistent_declaration_is_refused(tmp_path, old, new, expected):
    assert FAMILY.count(old) == 1
    msg = error_of(make(tmp_path, FAMILY.replace(old, new)))
    assert expected in msg and "family[0] (name=scale)" in msg, msg


CONVERTED = ("activation", "conv1d", "elementwise", "norm", "optim", "scan", "tokens")


def test_the_fixed_families_have_no_hand_written_entry_point():
    """Every family of these files is generated: a body and bounds, no macro, no extern "C" left in its source."""
    cat = load_catalog(default_catalog_path())
    kernels = cat.path.parent
    fixed = cat.module("Fixed")
    for name in CONVERTED:
        assert f"fixed/{name}.toml" in fixed.module.families
        assert "__global__" not in (kernels / f"fixed/{name}.cu").read_text(), name
        for fam in tomllib.loads((kernels / f"fixed/{name}.toml").read_text())["family"]:
            assert "instantiate" not in fam and fam["body"] and "bounds" in fam, fam["name"]
