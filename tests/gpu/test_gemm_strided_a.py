"""kernels.gemm with a row-strided A on a real GPU (runtime/gemm.py): A = W[:, :K], a column slice of a row-major
[M, lda] matrix, read in place through its tensor map (only tmA's row stride differs from the dense call) gives C
bit for bit equal to the same call on A.contiguous(), for bf16 and f16, M in {1, 4, 64, 2048}, K = 64, lda in
{96, 192}, N = 2048. Both outputs are poisoned with NaN first, and W's columns past K hold NaN and infinities: the
TMA reads only [0, K) of each row (a value from past K would turn C's row into NaN). From a signed bundle
(MF_RUNTIME_BUNDLE, MF_RUNTIME_KEY) or one built and qualified here (tests/gpu/test_runtime_gpu.py's fixture).

    MF_RUNTIME_BUNDLE=dist/h200.tar.gz MF_RUNTIME_KEY=manifests/keys python -m pytest -q tests/gpu/test_gemm_strided_a.py
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_runtime_gpu import bundle, kernels  # noqa: E402,F401  (module fixtures: the signed bundle, load())

DT = {"bf16": torch.bfloat16, "f16": torch.float16}
K, N = 64, 2048


def _bits(t):
    return t.view(torch.int16)


@pytest.fixture(scope="module")
def mft(kernels):  # noqa: F811
    import mamba_forge.runtime.torch as mft

    mft.register(kernels)
    return mft


def _wide(M: int, lda: int, dtype, seed: int):
    """[M, lda] with uniform(-1, 1) in the first K columns and NaN, +inf, -inf in the rest."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.empty((M, lda), dtype=dtype, device="cuda")
    w[:, :K] = (torch.rand((M, K), generator=g, device="cuda") * 2 - 1).to(dtype)
    tail = torch.tensor([float("nan"), float("inf"), float("-inf")], dtype=dtype, device="cuda")
    w[:, K:] = tail.repeat((lda - K + 2) // 3)[:lda - K]
    return w


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("lda", [96, 160 + 32])
@pytest.mark.parametrize("M", [1, 4, 64, 2048])
def test_a_row_strided_a_gives_the_dense_calls_bits(kernels, mft, dtype, lda, M):  # noqa: F811
    route = kernels.gemm_route(M, N, K, dtype)
    if not kernels.symbol(route.symbol).tensor_maps or route.cast:
        pytest.skip(f"{route.symbol} does not read A through a tensor map here: a strided A is refused")
    tdt = DT[dtype]
    W = _wide(M, lda, tdt, seed=M * 1000 + lda)
    A = W[:, :K]
    assert A.stride() == (lda, 1) and A.data_ptr() == W.data_ptr()
    B = ((torch.rand((K, N), generator=torch.Generator(device="cuda").manual_seed(lda), device="cuda") * 2 - 1)
         .to(tdt))
    assert kernels.gemm_reads_a_in_place(A, B)
    strided = torch.full((M, N), float("nan"), dtype=tdt, device="cuda")
    dense = torch.full((M, N), float("nan"), dtype=tdt, device="cuda")
    assert kernels.gemm(A, B, strided) is strided
    dense_a = A.contiguous()
    assert kernels.gemm(dense_a, B, dense) is dense
    torch.cuda.synchronize()
    assert not torch.isnan(dense).any() and not torch.isnan(strided).any()  # every element written, no tail read
    assert torch.equal(_bits(strided), _bits(dense)), f"{dtype} M={M} lda={lda}: the strided A's C differs"
    # a repeat (the remembered call, its maps cached) and the op give the same bits
    again = torch.full((M, N), float("nan"), dtype=tdt, device="cuda")
    kernels.gemm(A, B, again)
    op = torch.ops.mamba_forge.gemm(A, B)  # the op passes A through (no .contiguous())
    torch.cuda.synchronize()
    assert torch.equal(_bits(again), _bits(dense)) and torch.equal(_bits(op), _bits(dense))
