"""The Mamba layer (mamba_forge.runtime.torch.Mamba, Block) on the CPU, where torch is installed (a CPU build is
enough): mamba-ssm's parameter names and shapes, the refusals at construction, the new ops' shape rules and fake
implementations, and the layer's wiring (which columns are x, z, dt, B, C; where the biases go; the states) against
a float64 transcription of mamba-ssm's reference path, with the kernels stood in for by our float64 references
(tests/gpu/test_mamba_layer_gpu.py runs the real kernels)."""

from __future__ import annotations

import math

import pytest

from mamba_forge.runtime.errors import LaunchRefused, SymbolUnavailable
from mamba_forge.runtime.torch_ops import conv_tokens_shapes, scan_tokens_shapes

torch = pytest.importorskip("torch")
F = torch.nn.functional


def test_token_op_shape_rules_refuse_what_does_not_fit():
    assert conv_tokens_shapes((2, 5, 16), (8, 4), (8,), (2, 8, 3)) == (2, 8, 5, 4)
    ok = ((2, 5, 8), (2, 5, 8), (8,), (8, 4), (2, 5, 11), (8,), (2, 5, 16), (2, 8, 4))
    assert scan_tokens_shapes(*ok) == (2, 5, 8, 4, 3)
    bad_conv = [((2, 5, 15), (8, 4), (8,), (2, 8, 3)), ((2, 5, 16), (8, 5), (8,), (2, 8, 4)),
                ((2, 5, 16), (8, 4), (7,), (2, 8, 3)), ((2, 5, 16), (8, 4), (8,), (2, 8, 4)),
                ((2, 5, 16), (8, 1), (8,), (2, 8, 0)), ((5, 16), (8, 4), (8,), (2, 8, 3))]
    for shapes in bad_conv:
        with pytest.raises(LaunchRefused, match="conv_tokens"):
            conv_tokens_shapes(*shapes)
    for i in range(1, 8):
        shapes = list(ok)
        shapes[i] = tuple(n + 1 for n in shapes[i])
        with pytest.raises(LaunchRefused, match="scan_tokens"):
            scan_tokens_shapes(*shapes)
    with pytest.raises(LaunchRefused, match="fewer than 2\\*d_state"):
        scan_tokens_shapes((2, 5, 8), (2, 5, 8), (8,), (8, 4), (2, 5, 7), (8,), (2, 5, 16), (2, 8, 4))


# ---- stand-ins: the kernels' contracts computed by the float64 references, on CPU tensors (tests/torch_standins.py)

@pytest.fixture(scope="module")
def mft():
    from torch_standins import register_cpu

    return register_cpu()


def _RefKernels(**kw):  # noqa: N802
    from torch_standins import RefKernels

    return RefKernels(**kw)


def test_parameters_are_mamba_ssms(mft):
    m = mft.Mamba(64, layer_idx=3, dtype=torch.float32)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    d_inner, dt_rank = 128, math.ceil(64 / 16)
    assert shapes == {"in_proj.weight": (2 * d_inner, 64), "conv1d.weight": (d_inner, 1, 4), "conv1d.bias": (d_inner,),
                      "x_proj.weight": (dt_rank + 32, d_inner), "dt_proj.weight": (d_inner, dt_rank),
                      "dt_proj.bias": (d_inner,), "A_log": (d_inner, 16), "D": (d_inner,), "out_proj.weight": (64, d_inner)}
    assert m.A_log.dtype == torch.float32 and m.D.dtype == torch.float32
    assert torch.allclose(m.A_log[0], torch.log(torch.arange(1, 17, dtype=torch.float32)))
    dt = F.softplus(m.dt_proj.bias.detach().float())
    assert float(dt.min()) >= 1e-4 - 1e-9 and float(dt.max()) <= 0.1 + 1e-6  # dt_min/dt_max init as mamba-ssm
    m2 = mft.Mamba(64, layer_idx=3, dtype=torch.float32)
    m2.load_state_dict(m.state_dict())  # a mamba-ssm state dict has these keys: it loads unchanged


@pytest.mark.parametrize("kw,match", [
    ({"missing": {"ssm_scan_tokens"}}, "ssm_scan_tokens"),
    ({"missing": {"conv1d_tokens_silu"}}, "conv1d_tokens_silu"),
    ({"no_route": True}, "no qualified GEMM serves in_proj"),
])
def test_construction_refuses_what_the_manifest_cannot_serve(mft, kw, match):
    with pytest.raises((LaunchRefused, SymbolUnavailable), match=match):
        mft.Mamba(64, kernels=_RefKernels(**kw), dtype=torch.float32)
    mft.register(_RefKernels())


def test_construction_refuses_without_kernels_and_bad_widths(mft):
    saved = mft._state["kernels"]
    mft._state["kernels"] = None
    try:
        with pytest.raises(LaunchRefused, match="need loaded kernels"):
            mft.Mamba(64, dtype=torch.float32)
    finally:
        mft._state["kernels"] = saved
    for w in (1, 5):
        with pytest.raises(ValueError, match="widths 2..4"):
            mft.Mamba(64, d_conv=w, dtype=torch.float32)
    with pytest.raises(LaunchRefused, match="f32, bf16 or f16"):
        mft.Mamba(64, dtype=torch.float64)


def _reference_block(m, h):
    """mamba-ssm's slow path (mamba_simple.Mamba.forward without the fused kernels), in float64, on h's device."""
    from torch_standins import reference_mamba

    p = {k: v.detach().double().to(h.device) for k, v in m.named_parameters()}
    return reference_mamba(p, h.detach().double(), m.d_conv, m.dt_rank, m.d_state)


def test_layer_wiring_matches_mamba_ssms_reference_path_and_decodes_the_same(mft):
    torch.manual_seed(0)
    m = mft.Mamba(32, d_state=8, layer_idx=0, dtype=torch.float32)
    with torch.no_grad():
        for p in (m.conv1d.bias, m.D):
            p.uniform_(-1, 1)
    h = torch.randn(2, 9, 32, dtype=torch.float32)
    want = _reference_block(m, h).float()
    got = m(h)
    assert torch.allclose(got, want, rtol=2e-5, atol=2e-5), float((got - want).abs().max())
    cache = mft.InferenceParams(max_seqlen=9, max_batch_size=2)
    parts = [m(h[:, :4], inference_params=cache)]
    cache.seqlen_offset = 4
    parts.append(m(h[:, 4:6], inference_params=cache))  # a chunk of prefill continues the sequence
    for t in range(6, 9):
        cache.seqlen_offset = t
        parts.append(m(h[:, t:t + 1], inference_params=cache))  # decode steps
    assert torch.allclose(torch.cat(parts, 1), want, rtol=2e-5, atol=2e-5)
    cache.seqlen_offset = 0  # a new sequence starts from zero states
    assert torch.allclose(m(h, inference_params=cache), want, rtol=2e-5, atol=2e-5)


def test_block_adds_and_normalises_before_the_mixer(mft):
    torch.manual_seed(1)
    blk = mft.Block(32, lambda dim: mft.Mamba(dim, d_state=8, layer_idx=0, dtype=torch.float32))
    h = torch.randn(1, 5, 32, dtype=torch.float32)
    res = torch.randn(1, 5, 32, dtype=torch.float32)
    out, new_res = blk(h, res.clone())
    want_res = res.double() + h
    normed = want_res * torch.rsqrt(want_res.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.allclose(new_res.double(), want_res.float().double(), atol=1e-6)
    assert torch.allclose(out, blk.mixer(normed.float()), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="fused add"):
        mft.Block(32, lambda dim: None, fused_add_norm=False)


def test_fake_implementations_give_shapes(mft):
    from torch._subclasses.fake_tensor import FakeTensorMode

    bf = torch.bfloat16
    with FakeTensorMode():
        xz = torch.empty(2, 5, 16, dtype=bf)
        out = torch.ops.mamba_forge.conv_tokens(xz, torch.empty(8, 4), torch.empty(8), torch.empty(2, 8, 3, dtype=bf))
        assert tuple(out.shape) == (2, 5, 8) and out.dtype == bf
        y = torch.ops.mamba_forge.scan_tokens(torch.empty(2, 5, 8, dtype=bf), torch.empty(2, 5, 8, dtype=bf),
                                              torch.empty(8), torch.empty(8, 4), torch.empty(2, 5, 11, dtype=bf),
                                              torch.empty(8), xz, torch.empty(2, 8, 4))
        assert tuple(y.shape) == (2, 5, 8) and y.dtype == bf


def test_layer_traces_under_torch_compile(mft):
    """torch.compile (aot_eager: the tracing, not code generation) runs the layer through the ops' fake
    implementations and gives the eager bits."""
    torch.manual_seed(2)
    m = mft.Mamba(32, d_state=8, layer_idx=0, dtype=torch.float32)
    h = torch.randn(2, 5, 32, dtype=torch.float32)
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(h), m(h))


def test_scan_tokens_ws_serves_small_grids_only():
    from mamba_forge.runtime.torch_ops import SCAN_TOKENS_WS_BLOCKS_PER_SM, SCAN_TOKENS_WS_WAVES, scan_tokens_ws_serves

    limit = SCAN_TOKENS_WS_WAVES * SCAN_TOKENS_WS_BLOCKS_PER_SM * 132  # blocks: 16 channels x one batch row each
    assert scan_tokens_ws_serves(1, 2048, 16, 132)
    assert scan_tokens_ws_serves(limit // 128, 2048, 16, 132)
    assert not scan_tokens_ws_serves(limit // 128 + 1, 2048, 16, 132)
    assert scan_tokens_ws_serves(1, 16 * limit, 16, 132) and not scan_tokens_ws_serves(1, 16 * limit + 1, 16, 132)
    assert not scan_tokens_ws_serves(1, 2048, 17, 132)  # past its registers: d_state <= 16
    assert not scan_tokens_ws_serves(1, 2048, 16, 0)


def test_scan_tokens_ws_blocks_per_sm_is_its_launch_bounds():
    """The op's wave arithmetic reads the instance's minimum blocks per SM: the constant and the catalog agree."""
    from mamba_forge.catalog.model import default_catalog_path, load_catalog
    from mamba_forge.runtime.torch_ops import (
        SCAN_TOKENS_WS_BLOCKS_PER_SM,
        SCAN_TOKENS_WS_FAMILY,
        SCAN_TOKENS_WS_MAX_STATE,
    )

    fam = load_catalog(default_catalog_path()).module("Fixed").family(SCAN_TOKENS_WS_FAMILY)
    assert [i["MINB"] for i in fam.instances] == [SCAN_TOKENS_WS_BLOCKS_PER_SM]
    assert SCAN_TOKENS_WS_MAX_STATE == 16


@pytest.mark.parametrize("batch,d,length,missing,want", [
    (2, 32, 5, (), "ssm_scan_tokens_ws_f32"),  # a small grid: the warp-specialised scan
    (2, 32, 5, ("ssm_scan_tokens_ws",), "ssm_scan_tokens_f32"),  # a manifest without it: the four-lane scan
    (300, 32, 3, (), "ssm_scan_tokens_f32"),  # 600 blocks: past its waves
    (2, 32, 1, (), "ssm_step_forward_fused_f32"),  # L = 1: the decode step
])
def test_scan_tokens_routes_by_shape_to_kernels_with_the_same_bits(mft, batch, d, length, missing, want):
    k = _RefKernels(missing=missing)
    mft.register(k)
    try:
        n, r = 16, 4
        g = torch.Generator().manual_seed(0)
        u, dt = torch.rand(batch, length, d, generator=g), torch.rand(batch, length, d, generator=g) - 4
        x_dbl, xz = torch.rand(batch, length, r + 2 * n, generator=g), torch.rand(batch, length, 2 * d, generator=g)
        state = torch.zeros(batch, d, n)
        torch.ops.mamba_forge.scan_tokens(u, dt, torch.zeros(d), torch.zeros(d, n), x_dbl, torch.ones(d), xz, state)
        assert [c for c in k.calls if "scan" in c or "step" in c] == [want]
    finally:
        mft.register(_RefKernels())


def _scan_tokens_args(batch, length, d, dtype, state_dtype, seed=0):
    n, r = 16, 4
    g = torch.Generator().manual_seed(seed)
    u, dt = torch.rand(batch, length, d, generator=g), torch.rand(batch, length, d, generator=g) - 4
    x_dbl, xz = torch.rand(batch, length, r + 2 * n, generator=g), torch.rand(batch, length, 2 * d, generator=g)
    state = (torch.rand(batch, d, n, generator=g) * 2 - 1).to(state_dtype)
    return ([t.to(dtype) for t in (u, dt)] + [torch.zeros(d), torch.zeros(d, n), x_dbl.to(dtype), torch.ones(d),
                                              xz.to(dtype), state])


@pytest.mark.parametrize("length,want", [(1, ["ssm_step_forward_fused_state16_bf16"]),
                                         (5, ["ssm_scan_tokens_ws_bf16"])])
def test_scan_tokens_takes_a_16bit_state_of_the_activations_dtype(mft, length, want):
    """A bf16 state (mamba-ssm's cache default): a decode step runs the 16-bit-state step in place; a chunk of
    prefill runs the token scan on the state's values in f32 and writes the new state back rounded. Both give the
    f32-state path's outputs within bf16 rounding, and the state stays bf16 (the caller's tensor, updated)."""
    k = _RefKernels()
    mft.register(k)
    try:
        args16 = _scan_tokens_args(2, length, 32, torch.bfloat16, torch.bfloat16)
        args32 = [*args16[:-1], args16[-1].float()]
        state16 = args16[-1]
        ptr, before = state16.data_ptr(), state16.clone()
        y16 = torch.ops.mamba_forge.scan_tokens(*args16)
        assert [c for c in k.calls if "scan" in c or "step" in c] == want
        y32 = torch.ops.mamba_forge.scan_tokens(*args32)
        assert state16.dtype == torch.bfloat16 and state16.data_ptr() == ptr
        assert torch.allclose(y16.float(), y32.float(), rtol=2e-2, atol=2e-2)
        assert torch.allclose(state16.float(), args32[-1], rtol=1e-2, atol=1e-2)
        assert not torch.equal(state16, before)  # updated in place
    finally:
        mft.register(_RefKernels())


def test_scan_tokens_refuses_a_state_dtype_it_does_not_serve(mft):
    k = _RefKernels(missing={"ssm_step_forward_fused_state16"})
    mft.register(k)
    try:
        with pytest.raises(LaunchRefused, match="ssm_step_forward_fused_state16_bf16.*keep the state in float32"):
            torch.ops.mamba_forge.scan_tokens(*_scan_tokens_args(2, 1, 32, torch.bfloat16, torch.bfloat16))
        for act, st in ((torch.bfloat16, torch.float16), (torch.float32, torch.bfloat16),
                        (torch.bfloat16, torch.float64)):
            with pytest.raises(LaunchRefused, match="float32 or, for 16-bit activations, their dtype"):
                torch.ops.mamba_forge.scan_tokens(*_scan_tokens_args(2, 1, 32, act, st))
        assert not [c for c in k.calls if "scan" in c or "step" in c]  # refused before any launch
    finally:
        mft.register(_RefKernels())


def test_layer_decodes_from_a_16bit_cache_as_mamba_ssm_allocates_it(mft):
    """allocate_inference_cache(..., ssm_dtype=torch.bfloat16): prefill then decode steps from a bf16 ssm_state,
    within bf16 rounding of the float32-state decode (the default); a state of another dtype is refused."""
    torch.manual_seed(0)
    m = mft.Mamba(32, d_state=16, layer_idx=0, dtype=torch.bfloat16)
    h = torch.randn(2, 7, 32, dtype=torch.bfloat16)
    outs = {}
    for ssm_dtype in (None, torch.bfloat16):
        cache = mft.InferenceParams(max_seqlen=7, max_batch_size=2)
        cache.key_value_memory_dict[0] = m.allocate_inference_cache(2, 7, dtype=torch.bfloat16, ssm_dtype=ssm_dtype)
        parts = [m(h[:, :4], inference_params=cache)]
        for t in range(4, 7):
            cache.seqlen_offset = t
            parts.append(m(h[:, t:t + 1], inference_params=cache))
        assert cache.key_value_memory_dict[0][1].dtype == (ssm_dtype or torch.float32)
        outs[ssm_dtype] = torch.cat(parts, 1).float()
    assert torch.allclose(outs[torch.bfloat16], outs[None], rtol=5e-2, atol=5e-2)
    with pytest.raises(ValueError, match="ssm_dtype torch.float16 is neither float32 nor"):
        m.allocate_inference_cache(2, 7, dtype=torch.bfloat16, ssm_dtype=torch.float16)
    cache = mft.InferenceParams(max_seqlen=7, max_batch_size=2)
    conv, _ = m.allocate_inference_cache(2, 7, dtype=torch.bfloat16)
    cache.key_value_memory_dict[0] = (conv, torch.zeros(2, m.d_inner, 16, dtype=torch.float16))
    cache.seqlen_offset = 1
    with pytest.raises(LaunchRefused, match="float32 or the activations' dtype"):
        m(h[:, :1], inference_params=cache)


def test_conv_tokens_vec_serves_a_few_timesteps_on_large_grids_only():
    from mamba_forge.runtime.torch_ops import (
        CONV_TOKENS_VEC_MAX_L,
        CONV_TOKENS_VEC_MIN_BLOCKS_PER_SM,
        conv_tokens_vec_serves,
    )

    least = CONV_TOKENS_VEC_MIN_BLOCKS_PER_SM * 132  # blocks of the tiled conv: 128 channels x one batch row each
    assert conv_tokens_vec_serves(-(-least // 16), 2048, 1, 132)
    assert not conv_tokens_vec_serves(least // 16 - 1, 2048, 1, 132)
    assert conv_tokens_vec_serves(256, 2048, CONV_TOKENS_VEC_MAX_L, 132)
    assert not conv_tokens_vec_serves(256, 2048, CONV_TOKENS_VEC_MAX_L + 1, 132)
    assert not conv_tokens_vec_serves(256, 2048, 0, 132) and not conv_tokens_vec_serves(256, 2048, 1, 0)
    assert conv_tokens_vec_serves(least, 1, 1, 132) and not conv_tokens_vec_serves(least - 1, 1, 1, 132)


@pytest.mark.parametrize("batch,length,missing,want", [
    (300, 1, (), "conv1d_tokens_silu_vec_f32"),  # a decode step on a large grid: the vectorised conv
    (300, 4, (), "conv1d_tokens_silu_vec_f32"),  # CONV_TOKENS_VEC_MAX_L
    (300, 5, (), "conv1d_tokens_silu_f32"),  # past it: the tiled conv
    (2, 1, (), "conv1d_tokens_silu_f32"),  # a small grid: the tiled conv
    (300, 1, ("conv1d_tokens_silu_vec",), "conv1d_tokens_silu_f32"),  # a manifest without it
])
def test_conv_tokens_routes_by_shape_to_kernels_with_the_same_bits(mft, batch, length, missing, want):
    k = _RefKernels(missing=missing)
    mft.register(k)
    try:
        d, w = 16, 4
        g = torch.Generator().manual_seed(1)
        xz, state = torch.rand(batch, length, 2 * d, generator=g), torch.rand(batch, d, w - 1, generator=g)
        torch.ops.mamba_forge.conv_tokens(xz, torch.rand(d, w, generator=g), torch.rand(d, generator=g), state)
        assert [c for c in k.calls if "conv" in c] == [want]
    finally:
        mft.register(_RefKernels())


# ---- dt_proj reads x_dbl[:, :dt_rank] in place (runtime/gemm.py's row-strided A) ------------------------------------


def _dt_proj_operands(mft, strided: bool, train: bool = False):
    """A decode step (batch 3) of a layer whose x_dbl rows are 4 + 2*8 = 20 f32 apart (80 bytes: a tensor map's
    stride), or (train) its training forward; returns (out, the dt_proj GEMM's A, x_proj's C = x_dbl)."""
    k = _RefKernels(strided_a=strided)
    mft.register(k)
    try:
        torch.manual_seed(3)
        m = mft.Mamba(32, d_state=8, dt_rank=4, layer_idx=0, dtype=torch.float32)
        h = torch.randn(3, 2, 32, dtype=torch.float32)
        if train:
            out = m(h)
            assert out.requires_grad  # the training op ran (mamba_forge::mamba_mixer)
        else:
            cache = mft.InferenceParams(max_seqlen=2, max_batch_size=3)
            m(h[:, :1], inference_params=cache)
            cache.seqlen_offset = 1
            del k.gemms[:]
            out = m(h[:, 1:], inference_params=cache)
        (_, _), (_, x_dbl), (a, _), (_, _) = k.gemms[-4:]  # in_proj, x_proj, dt_proj, out_proj
        return out.detach(), a, x_dbl
    finally:
        mft.register(_RefKernels())


@pytest.mark.parametrize("train", [False, True], ids=["decode", "training-forward"])
def test_dt_proj_reads_x_dbl_in_place_where_the_rung_reads_a_through_a_tensor_map(mft, train):
    """Where the serving rung takes a row-strided A, the A handed to kernels.gemm is x_dbl[:, :dt_rank] itself (a
    view of x_proj's output, stride (20, 1): no copy); where it does not, a dense copy; the output bits are the same."""
    out, a, x_dbl = _dt_proj_operands(mft, strided=True, train=train)
    assert a.stride() == (20, 1) and not a.is_contiguous() and a.data_ptr() == x_dbl.data_ptr()
    assert a.untyped_storage().data_ptr() == x_dbl.untyped_storage().data_ptr()
    dense_out, copy, x_dbl2 = _dt_proj_operands(mft, strided=False, train=train)
    assert copy.is_contiguous() and copy.stride() == (4, 1) and copy.data_ptr() != x_dbl2.data_ptr()
    assert torch.equal(copy, x_dbl2[:, :4]) and torch.equal(out, dense_out)


def test_the_gemm_op_passes_a_row_strided_a_through_and_its_fake_takes_one(mft):
    """mamba_forge::gemm: no .contiguous() of an A its rung reads in place; a copy where it does not (an A the
    kernels refuse); the fake implementation gives [M, N] for a strided A."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    wide, w = torch.randn(5, 24), torch.randn(8, 16)
    for strided, in_place in ((True, True), (False, False)):
        k = _RefKernels(strided_a=strided)
        mft.register(k)
        try:
            c = torch.ops.mamba_forge.gemm(wide[:, :8], w)
            ((a, _),) = k.gemms
            assert (a.data_ptr() == wide.data_ptr() and a.stride() == (24, 1)) is in_place
            assert torch.equal(c, (wide[:, :8].double() @ w.double()).float())
        finally:
            mft.register(_RefKernels())
    with FakeTensorMode():
        a = torch.empty(5, 24, dtype=torch.bfloat16)[:, :8]
        c = torch.ops.mamba_forge.gemm(a, torch.empty(8, 16, dtype=torch.bfloat16))
        assert tuple(c.shape) == (5, 16) and c.dtype == torch.bfloat16


# ---- the derived tensors (transposed weights, f32 vectors): remade when a source parameter changes ---------------

def test_derived_weights_follow_every_change_of_their_sources(mft):
    """Mamba._weights answers a repeat call from one key over all its sources (a decode step asks every call); an
    in-place update, a replaced parameter, a replaced submodule and a load_state_dict each remake what they touch,
    so the layer's output is a fresh layer's with the same parameters."""
    torch.manual_seed(11)
    m = mft.Mamba(16, d_state=8, layer_idx=0, dtype=torch.float32)
    h = torch.randn(2, 5, 16)

    def same_as_fresh():
        fresh = mft.Mamba(16, d_state=8, layer_idx=0, dtype=torch.float32)
        fresh.load_state_dict(m.state_dict())
        with torch.no_grad():
            return torch.equal(m(h), fresh(h))

    with torch.no_grad():
        first = m._weights()
        assert m._weights() is first  # the memo: nothing remade
        m(h)
        m.out_proj.weight.mul_(0.5)  # an optimizer's in-place step
    assert m._weights() is not first and same_as_fresh()
    m.D = torch.nn.Parameter(torch.randn(m.d_inner))  # a replaced parameter
    assert same_as_fresh()
    m.x_proj = torch.nn.Linear(m.d_inner, m.dt_rank + 2 * m.d_state, bias=False)  # a replaced submodule
    assert same_as_fresh()
    other = mft.Mamba(16, d_state=8, layer_idx=0, dtype=torch.float32)
    m.load_state_dict(other.state_dict())
    with torch.no_grad():
        assert torch.equal(m(h), other(h))
    key = m._sources_key()
    assert len(key) == len(m._SOURCES) and all(k is not None for k in key)
    m.conv1d.bias = None  # a layer without the conv bias: the zero vector serves instead
    assert m._sources_key()[m._SOURCES.index(("conv1d", "bias"))] is None
    with torch.no_grad():
        m(h)


def test_norm_weight_f32_is_made_once_per_version_of_a_16bit_weight(mft):
    """RMSNorm.weight_f32: a float32 weight is handed over as it is; a 16-bit one's float32 copy is made once and
    remade after an in-place update, a replaced parameter or a move of dtype, so the Block never reads a stale
    weight (its output equals a fresh Block's with the same parameters) and launches no cast at a repeat call."""
    norm = mft.RMSNorm(32, dtype=torch.float32)
    assert norm.weight_f32() is norm.weight
    norm = mft.RMSNorm(32, dtype=torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 32))
    first = norm.weight_f32()
    assert first.dtype == torch.float32 and torch.equal(first, norm.weight.float())
    assert norm.weight_f32() is first  # nothing remade
    with torch.no_grad():
        norm.weight.mul_(0.5)  # an optimizer's in-place step
    second = norm.weight_f32()
    assert second is not first and torch.equal(second, norm.weight.float())
    norm.weight = torch.nn.Parameter(torch.full((32,), 2.0, dtype=torch.bfloat16))  # a replaced parameter
    assert torch.equal(norm.weight_f32(), torch.full((32,), 2.0))
    norm.float()  # a move to float32: the parameter itself again
    assert norm.weight_f32() is norm.weight

    torch.manual_seed(3)
    blk = mft.Block(32, lambda dim: mft.Mamba(dim, d_state=8, layer_idx=0, dtype=torch.float32))
    blk.norm.weight = torch.nn.Parameter(torch.rand(32, dtype=torch.bfloat16) + 0.5)
    h, res = torch.randn(1, 5, 32), torch.randn(1, 5, 32)

    def fresh_out():
        fresh = mft.Block(32, lambda dim: mft.Mamba(dim, d_state=8, layer_idx=0, dtype=torch.float32))
        fresh.norm.weight = torch.nn.Parameter(blk.norm.weight.detach().clone())
        fresh.mixer.load_state_dict(blk.mixer.state_dict())
        with torch.no_grad():
            return fresh(h, res.clone())[0]

    with torch.no_grad():
        assert torch.equal(blk(h, res.clone())[0], fresh_out())
        blk.norm.weight.mul_(1.25)
        assert torch.equal(blk(h, res.clone())[0], fresh_out())
