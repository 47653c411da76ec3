"""GPU checks of the fixed-order split-K class wgmma-k16-split8 (kernels/sm90a/wgmma.cu, kernels/routes.toml),
launched through the runtime (``kernels.gemm(..., symbol=...)``) from a signed bundle:

* every rung (the cluster rungs, which sum the 8 parts of K through distributed shared memory, the in-CTA
  reference rung, which folds them in one CTA, and the pair rungs, whose two consumer warpgroups take the parts in
  turn) against a float64 product, from NaN-poisoned outputs; the pair rungs also over several tiles per CTA;
* the class's promise: a row's bits do not depend on M or on the rung. Rows of each rung at M in {1, 3, 17, 64,
  256} equal, bit for bit, the same rows of the reference rung run at M = 1000 on the same A rows and B, at the
  model shapes (x_proj and out_proj of d_model 1024 and 2560) and ragged ones (K not a multiple of 64 * 8: empty
  and short parts);
* the route serves the class at those (N, K) and the whole-K class elsewhere (in_proj, dt_proj).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_runtime_gpu import bundle, kernels  # noqa: E402,F401  (module fixtures: the signed bundle, load())

from mamba_forge.runtime.errors import SymbolUnavailable  # noqa: E402

CLASS = "wgmma-k16-split8"
REF = "gemm_bi_nn_sm90a_wgmma_splitk8_m128n128_s4_{t}"
CLUSTER = [f"gemm_bi_nn_sm90a_wgmma_splitk8_cluster_{s}_{{t}}"
           for s in ("m64n32_s6", "m64n64_s4", "m64n128_s3", "m64n128_s4", "m64n256_s3")]
# the other in-CTA rungs: m64n128, and m128n256 with half of each thread's running total in shared memory
OTHER = ["gemm_bi_nn_sm90a_wgmma_splitk8_m64n128_s8_{t}", "gemm_bi_nn_sm90a_wgmma_splitk8_smt_m128n256_s3_{t}"]
# the pair rungs (two consumer warpgroups taking the parts in turn, the total handed over in shared memory through
# an mbarrier each way: admitted at full level, racecheck included)
PAIR = [f"gemm_bi_nn_sm90a_wgmma_splitk8_pair_{s}_{{t}}"
        for s in ("m64n256_s2", "m128n128_s2", "m64n128_s4", "m64n64_s6")]
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}
# (N, K): x_proj and out_proj at d_model 1024 and 2560; ragged: 18 k-tiles (parts of 3, two empty), K % 64 != 0
NK = [(96, 2048), (1024, 2048), (192, 5120), (2560, 5120), (200, 1096), (8, 1032), (392, 1480)]
MS = (1, 3, 17, 64, 256)
REF_M = 1000


def _rand(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.rand(shape, dtype=torch.float64, device="cuda", generator=g) * 2 - 1).to(dtype)


def _gemm(kernels, A, B, symbol):  # noqa: F811
    out = torch.full((A.shape[0], B.shape[1]), float("nan"), dtype=A.dtype, device="cuda")
    kernels.gemm(A, B, out, symbol=symbol)
    return out


def _bits(t):
    return t.contiguous().view(torch.int16)


@pytest.mark.parametrize("t", sorted(DTYPES))
@pytest.mark.parametrize("N,K", NK)
def test_every_rung_matches_float64_and_the_reference_rows(kernels, t, N, K):  # noqa: F811
    dtype = DTYPES[t]
    A = _rand((REF_M, K), dtype, seed=N * 7 + K)
    B = _rand((K, N), dtype, seed=N * 11 + K + 1)
    ref = _gemm(kernels, A, B, REF.format(t=t))
    want = A.double() @ B.double()
    err = ((ref.double() - want).abs() / (want.abs() + 1)).max().item()
    assert err < (2e-2 if t == "bf16" else 4e-3), f"{REF.format(t=t)} N={N} K={K}: relative error {err:.3g}"
    pair = [p.format(t=t) for p in PAIR]
    for name in [REF.format(t=t)] + [c.format(t=t) for c in CLUSTER + OTHER] + pair:
        for m in MS + ((REF_M,) if name in pair else ()):
            got = _gemm(kernels, A[:m].contiguous(), B, name)
            assert not torch.isnan(got).any(), f"{name} M={m} N={N} K={K}: unwritten (NaN) outputs"
            same = _bits(got) == _bits(ref[:m])
            if not bool(same.all()):
                r, c = (~same).nonzero()[0].tolist()
                pytest.fail(f"{name} at M={m}, N={N}, K={K}: row {r} column {c} is {got[r, c].item()!r}, the "
                            f"reference rung at M={REF_M} gives {ref[r, c].item()!r} (first of "
                            f"{int((~same).sum())} differing elements)")


@pytest.mark.parametrize("name", [p.format(t=t) for p in PAIR for t in sorted(DTYPES)])
def test_pair_rungs_are_admitted(kernels, name):  # noqa: F811
    """Every pair rung is in the manifest: with its hand-off on mbarriers the full qualification (compute-sanitizer's
    racecheck included) admits it; a rejection fails here with the qualifier's check and reason."""
    try:
        kernels.function(name, follow_fallback=False)
    except SymbolUnavailable as err:
        pytest.fail(f"{name}: rejected by {err.check}: {err.reason}")


@pytest.mark.parametrize("t", sorted(DTYPES))
def test_pair_rungs_over_several_tiles_per_cta_give_the_reference_bits(kernels, t):  # noqa: F811
    """M = 9000: more tiles than CTAs (grid <= 132), so each CTA's consumers hand the total over for tile after tile
    (the hand-off mbarriers' phases across tiles); ragged K (23 k-tiles: parts of 3, the last of 2); every element compared."""
    dtype = DTYPES[t]
    M, N, K = 9000, 392, 1480
    A, B = _rand((M, K), dtype, seed=5), _rand((K, N), dtype, seed=6)
    ref = _gemm(kernels, A, B, REF.format(t=t))
    for name in [p.format(t=t) for p in PAIR + OTHER[1:]]:  # and the in-CTA rung whose total is partly in smem
        got = _gemm(kernels, A, B, name)
        same = _bits(got) == _bits(ref)
        assert bool(same.all()), f"{name}: {int((~same).sum())} elements differ from the reference rung, first at " \
                                 f"{(~same).nonzero()[0].tolist()}"


def test_the_route_serves_the_split_class_where_its_region_says(kernels):  # noqa: F811
    for (n, k), want in {(96, 2048): CLASS, (1024, 2048): CLASS, (192, 5120): CLASS, (2560, 5120): CLASS,
                         (4096, 1024): "wgmma-k16", (2048, 64): "wgmma-k16", (10240, 2560): "wgmma-k16"}.items():
        for m in (1, 64, 2048):
            route = kernels.gemm_route(m, n, k, "bf16", "bf16", "bf16")
            assert route.eq_class == want, f"M={m} N={n} K={k}: served by {route.symbol} ({route.eq_class})"


@pytest.mark.parametrize("t", sorted(DTYPES))
def test_cluster_rungs_short_a_box_keeps_stale_rows_out_of_c(kernels, t):  # noqa: F811
    """The cluster rungs read A at M < 64 through a box of M rounded up to 8 rows (SHORT_A); the rest of each
    stage's 64 rows is what shared memory held. After a launch on an all-NaN A at M = 64 (NaN rows left in every
    CTA's ring), the rows at M = 1, 5, 13, 41 are bitwise the reference rung's, and a buffer's rows past M keep
    their poison (stale rows reach neither the cluster's sum nor C)."""
    dtype = DTYPES[t]
    N, K = 392, 1480
    A, B = _rand((64, K), dtype, seed=51), _rand((K, N), dtype, seed=52)
    nan_a = torch.full((64, K), float("nan"), dtype=dtype, device="cuda")
    ref = _gemm(kernels, A, B, REF.format(t=t))
    for name in [c.format(t=t) for c in CLUSTER]:
        assert kernels.function(name, follow_fallback=False).symbol.constants.get("SHORT_A") == 1, name
        for m in (1, 5, 13, 41):
            _gemm(kernels, nan_a, B, name)
            C = torch.full((64, N), -7.0, dtype=dtype, device="cuda")
            kernels.gemm(A[:m].contiguous(), B, C[:m], symbol=name)
            assert bool((_bits(C[:m]) == _bits(ref[:m])).all()), f"{name} M={m}: rows differ from the reference rung"
            assert bool((C[m:] == -7.0).all()), f"{name} M={m}: a row past M was written"
