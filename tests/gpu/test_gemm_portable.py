"""GPU checks for the portable batch-invariant GEMM and matvec families (Fixed, TriadScalar, TriadSm80).

Symbols are launched with the catalog's block, dynamic shared memory and grid expressions (evaluated over the
shape and the symbol's instance parameters). Outputs are poisoned with 0xFF bytes first and carry a guard tail
that must stay poisoned. Checked, per symbol:
  * correctness vs float64 (the reference gets the inputs rounded to their dtype) with an error bound scaled by
    (|A| |B|) per element: output rounding + TF32 input rounding + f32 accumulation; aligned shapes (vector
    paths), unaligned / ragged shapes (scalar paths), with and without bias (null pointer);
  * exact f32 symbols: bit for bit equal to the host FFMA-chain reference and to each other; the TN / NT triads
    on transposed inputs bit for bit equal to NN;
  * batch invariance: row i of C bit-identical for M in {1, 3, 17, 64, 1000, 4096} with the same A rows;
  * five runs bitwise equal.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/gpu_support.py

from gpu_support import bits, empty_device, from_device, kernels, round_to, to_device  # noqa: E402

from mamba_forge.catalog.model import default_catalog_path, load_catalog  # noqa: E402
from mamba_forge.core import expr  # noqa: E402
from mamba_forge.gpu import driver as cu  # noqa: E402
from mamba_forge.references import gemm as R  # noqa: E402

pytestmark = pytest.mark.gpu

MODULES = ("Fixed", "TriadScalar", "TriadSm80")
GUARD = 64  # poisoned elements after C that no launch may touch
EXACT = ["gemm_bi_f32_f32", "gemm_bi_f32_f32_s2", "gemm_bi_f32_f32_m128n64_s2", "gemm_bi_f32_f32_n128_s2",
         "gemm_bi_f32_f32_skinny_n64", "gemm_bi_f32_f32_skinny_n32",
         "gemm_bi_f32_f32_decode_n64", "gemm_bi_f32_f32_decode_n32",
         "triad_scalar_nn_f32", "triad_scalar_tn_f32", "triad_scalar_nt_f32"]
BATCH_MS = (1, 3, 17, 64, 1000, 4096)
EPS_OUT = {"f32": 2.0**-23, "bf16": 2.0**-8, "f16": 2.0**-10}


def _catalog():
    return load_catalog(default_catalog_path())


CAT = _catalog()


def _is_mine(sym) -> bool:
    return sym.module in MODULES and (sym.name.startswith(("gemm_bi", "matvec_bi", "triad_")))


NAMES = sorted(s.name for s in CAT.symbols.values() if _is_mine(s))


class Sym:
    """What a test needs to launch one symbol: layout, dtypes, math class, launch shape."""

    def __init__(self, name: str):
        s = CAT.symbols[name]
        self.sym = s
        self.name = name
        self.fam = CAT.module(s.module).family(s.family)
        env = s.params_env

        def resolve(tok):
            return env[tok] if tok in env else tok

        self.a = resolve(self.fam.params[1].dtype)
        self.c = resolve(self.fam.params[0].dtype)
        self.layout = "tn" if "_tn_" in name else "nt" if "_nt_" in name else "nn"
        rnd = env.get("R", 0)
        self.math = "tf32_trunc" if (self.a == "f32" and rnd == 1) else "tf32_rna" if (self.a == "f32" and rnd == 2) else "f32"
        self.exact = name in EXACT

    def grid(self, m: int, n: int, k: int) -> tuple[int, ...]:
        env = {k_: v for k_, v in self.sym.params_env.items() if isinstance(v, int)}
        env.update({"M": m, "N": n, "K": k})
        g = [int(expr.evaluate(e, env)) for e in self.fam.launch.grid]
        return tuple(g) + (1,) * (3 - len(g))

    def run(self, a2: np.ndarray, b2: np.ndarray, bias: np.ndarray | None, m: int, n: int, k: int):
        """Launch on host operands given in the C = op(A) op(B) sense: a2 [M, K], b2 [K, N] (float64)."""
        k_ = kernels()
        a_store = {"nn": a2, "tn": a2.T, "nt": a2}[self.layout]
        b_store = {"nn": b2, "tn": b2, "nt": b2.T}[self.layout]
        A = to_device(np.ascontiguousarray(a_store).reshape(-1), self.a)
        B = to_device(np.ascontiguousarray(b_store).reshape(-1), self.a)
        C = empty_device(m * n + GUARD, self.c)
        bias_arg = to_device(bias, self.c) if bias is not None else np.uint64(0)
        k_.launch(self.name, self.grid(m, n, k), self.sym.block,
                  (C, A, B, bias_arg, np.int32(m), np.int32(n), np.int32(k)), smem=self.sym.dynamic_smem)
        guard = C[m * n:].view(np.uint8).get()
        assert (guard == 0xFF).all(), f"{self.name}: wrote past C[M*N] at M={m} N={n} K={k}"
        return C[: m * n]


def _operands(rng, m, n, k, dtype, bias=True, scale=1.0):
    a2 = round_to(rng.uniform(-scale, scale, (m, k)), dtype)
    b2 = round_to(rng.uniform(-scale, scale, (k, n)), dtype)
    bb = rng.uniform(-1, 1, n) if bias else None
    return a2, b2, bb


def _bound(s: Sym, a2, b2, bias_r, ref, k):
    """Per-element error bound: output rounding + input (TF32) rounding + f32 accumulation, scaled by |A||B|."""
    mag = np.abs(a2) @ np.abs(b2)
    c_in = {"tf32_trunc": 2.0**-9, "tf32_rna": 2.0**-10, "f32": 0.0}[s.math]
    c_acc = max(k, 16) * 2.0**-23
    return EPS_OUT[s.c] * np.abs(ref) + (c_in + c_acc) * mag + 1e-30


def _check(s: Sym, got, a2, b2, bias, m, n, k):
    bias_r = round_to(bias, s.c) if bias is not None else None
    ref = R.matmul_f64(a2, b2, bias_r)
    g = from_device(got, s.c).reshape(m, n)
    err = np.abs(g - ref)
    bound = _bound(s, a2, b2, bias_r, ref, k)
    bad = ~(err <= bound)
    if bad.any():
        i = np.argwhere(bad)[0]
        raise AssertionError(f"{s.name} M={m} N={n} K={k}: {int(bad.sum())} of {m * n} outside the bound; first "
                             f"at {tuple(i)}: got {g[tuple(i)]!r}, ref {ref[tuple(i)]!r}, bound {bound[tuple(i)]:.3g}")


@pytest.fixture(scope="module")
def rng():
    seed = int(np.random.SeedSequence().entropy % 2**32)
    print(f"seed {seed}")
    return np.random.default_rng(seed)


def test_every_symbol_is_built_and_admitted_here():
    k_ = kernels()
    bad = [f"{n}: {k_.verdict(n).reason}" for n in NAMES if k_.verdict(n).status != "admitted"]
    assert not bad, "\n".join(bad)
    assert len(NAMES) >= 47


SHAPES = [
    (301, 264, 200),   # vector paths (N, K multiples of 8), ragged M, N and K tiles
    (77, 131, 75),     # scalar paths: N, K odd
    (1, 1, 1),
    (130, 9, 257),
    (16, 520, 64),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_correct_vs_float64(name, shape, rng):
    s = Sym(name)
    m, n, k = shape
    for with_bias in (True, False):
        a2, b2, bias = _operands(rng, m, n, k, s.a, with_bias)
        got = s.run(a2, b2, bias, m, n, k)
        _check(s, got, a2, b2, bias, m, n, k)


def test_error_bound_rejects_a_wrong_result(rng):
    """Negative control for the bound: a transposed-B GEMM and a 1-ulp-of-bf16 shift are caught."""
    s = Sym("gemm_bi_nn_tc128_bf16")
    m = n = k = 64
    a2, b2, bias = _operands(rng, m, n, k, "bf16")
    wrong = to_device((R.matmul_f64(a2, b2.T, bias)).reshape(-1), "f32")
    s32 = Sym("gemm_bi_nn_tc128_f32out_bf16")
    with pytest.raises(AssertionError):
        _check(s32, wrong, a2, b2, bias, m, n, k)
    right = R.matmul_f64(a2, b2, round_to(bias, "bf16"))
    shifted = to_device((right * (1 + 2.0**-6)).reshape(-1), "bf16")
    with pytest.raises(AssertionError):
        _check(s, shifted, a2, b2, bias, m, n, k)


@pytest.mark.parametrize("shape", [(70, 50, 37), (129, 131, 64), (5, 260, 333)], ids=lambda s: "x".join(map(str, s)))
def test_exact_symbols_equal_the_chain_reference_bit_for_bit(shape, rng):
    m, n, k = shape
    for corpus in ("uniform", "logu"):
        a2 = rng.uniform(-1, 1, (m, k))
        b2 = rng.uniform(-1, 1, (k, n))
        if corpus == "logu":
            a2 = np.sign(a2) * 10.0 ** rng.uniform(-3, 3, (m, k))
            b2 = np.sign(b2) * 10.0 ** rng.uniform(-3, 3, (k, n))
        a2, b2 = round_to(a2, "f32"), round_to(b2, "f32")
        bias = round_to(rng.uniform(-1, 1, n), "f32")
        want = R.chain_f32(a2, b2, bias)
        outs = {}
        for name in EXACT:
            got = Sym(name).run(a2, b2, bias, m, n, k).get()
            outs[name] = got.tobytes()
            if not np.array_equal(got.view(np.uint32), want.reshape(-1).view(np.uint32)):
                i = int(np.argmax(got.view(np.uint32) != want.reshape(-1).view(np.uint32)))
                raise AssertionError(f"{name} {shape} {corpus}: differs from the FFMA chain first at {i}: "
                                     f"{got[i]!r} != {want.reshape(-1)[i]!r}")
        assert len(set(outs.values())) == 1


def test_exact_symbols_keep_special_values_in_the_chain(rng):
    m, n, k = 33, 40, 29
    a2 = round_to(rng.uniform(-1, 1, (m, k)), "f32")
    b2 = round_to(rng.uniform(-1, 1, (k, n)), "f32")
    a2[0, 3] = np.inf
    a2[1, :] = -0.0
    b2[:, 1] = -0.0
    a2[2, 5] = np.nan
    b2[7, 2] = 1e-40  # a denormal input
    want = R.chain_f32(a2, b2, None).reshape(-1)
    for name in EXACT:
        got = Sym(name).run(a2, b2, None, m, n, k).get()
        same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
        assert same.all(), f"{name}: {int((~same).sum())} elements differ from the chain"


def _nn_names():
    return [n for n in NAMES if Sym(n).layout == "nn"] + [n for n in NAMES if Sym(n).layout == "nt"]


@pytest.mark.parametrize("name", _nn_names())
def test_batch_invariance_rows_are_bit_identical_for_any_m(name, rng):
    s = Sym(name)
    n, k = 200, 328
    a_big, b2, bias = _operands(rng, max(BATCH_MS), n, k, s.a)
    full = s.run(a_big, b2, bias, max(BATCH_MS), n, k).get()
    row_bytes = full.reshape(max(BATCH_MS), n)
    for m in BATCH_MS[:-1]:
        got = s.run(a_big[:m], b2, bias, m, n, k).get().reshape(m, n)
        assert got.tobytes() == row_bytes[:m].tobytes(), f"{name}: rows differ between M={m} and M={max(BATCH_MS)}"


@pytest.mark.parametrize("name", NAMES)
def test_five_runs_are_bitwise_equal(name, rng):
    s = Sym(name)
    m, n, k = 1000, 264, 520
    a2, b2, bias = _operands(rng, m, n, k, s.a)
    first = bits(s.run(a2, b2, bias, m, n, k))
    for _ in range(4):
        assert bits(s.run(a2, b2, bias, m, n, k)) == first, name


@pytest.mark.parametrize("lay", ["tn", "nt"])
def test_triad_scalar_layouts_equal_nn_on_transposed_inputs(lay, rng):
    m, n, k = 150, 90, 211
    a2 = round_to(rng.uniform(-1, 1, (m, k)), "f32")
    b2 = round_to(rng.uniform(-1, 1, (k, n)), "f32")
    nn = Sym("triad_scalar_nn_f32").run(a2, b2, None, m, n, k).get()
    other = Sym(f"triad_scalar_{lay}_f32").run(a2, b2, None, m, n, k).get()
    assert nn.tobytes() == other.tobytes()


def test_misaligned_pointers_take_the_scalar_path_with_the_same_bits(rng):
    """A/B offset by one element (not 16-byte aligned): same bits as the aligned launch (vector path)."""
    k_ = kernels()
    for name in ("gemm_bi_f32_f32_n128_s2", "gemm_bi_f32_f32_decode_n64", "gemm_bi_f32_f32_decode_n32",
                 "gemm_bi_nn_tc128_bf16", "matvec_bi_bf16_bf16", "triad_sm80_nt_tf32"):
        s = Sym(name)
        m, n, k = 40, 256, 128
        a2, b2, bias = _operands(rng, m, n, k, s.a)
        aligned = s.run(a2, b2, bias, m, n, k).get()
        a_store = {"nn": a2, "tn": a2.T, "nt": a2}[s.layout]
        b_store = {"nn": b2, "tn": b2, "nt": b2.T}[s.layout]
        A = to_device(np.concatenate([[0.0], np.ascontiguousarray(a_store).reshape(-1)]), s.a)[1:]
        B = to_device(np.concatenate([[0.0], np.ascontiguousarray(b_store).reshape(-1)]), s.a)[1:]
        C = empty_device(m * n, s.c)
        k_.launch(name, s.grid(m, n, k), s.sym.block, (C, A, B, to_device(bias, s.c), np.int32(m), np.int32(n),
                  np.int32(k)), smem=s.sym.dynamic_smem)
        cu.context_synchronize()
        assert C.get().tobytes() == aligned.tobytes(), name
