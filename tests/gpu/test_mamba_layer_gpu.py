"""The Mamba layer and its token-major kernels on a real GPU (issues 23 and 25), from a signed bundle
(MF_RUNTIME_BUNDLE, MF_RUNTIME_KEY) or one built and qualified here (tests/gpu/test_runtime_gpu.py's fixture):

- ssm_scan_tokens over L equals L launches at L = 1 and L steps of the production decode step
  (ssm_step_forward_fused), bit for bit, out and state; any chunking too; ssm_scan_tokens_ws gives its bits; conv1d_tokens_silu likewise against
  conv1d_step_forward_silu, and conv1d_tokens_silu_vec gives its bits; bf16, f16, f32;
- the layer against a float64 transcription of mamba-ssm's reference path; prefill == chunked prefill == decode
  bit for bit; sequence 0 the same bits at batch 1 and batch 8; CUDA-graph replay and torch.compile as eager;
- where mamba-ssm is importable, its Mamba's state dict loads unchanged and the outputs agree to bf16 rounding;
- a 16-bit ssm_state (ssm_step_forward_fused_state16): the f32 step's bits on the rounded state, and the layer's
  decode from a bf16 cache within bf16 rounding of the f32 one, graph replay as eager.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_runtime_gpu import SpyBackend, bundle, captured, kernels  # noqa: E402,F401  (fixtures: the signed bundle, load())

DT = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same(a, b) -> bool:
    return a.shape == b.shape and bool(torch.equal(_bits(a), _bits(b)))


@pytest.fixture(scope="module")
def mft(kernels):  # noqa: F811
    import mamba_forge.runtime.torch as mft

    mft.register(kernels)
    return mft


def _scan_inputs(b, L, d, n, r, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    u = lambda *s, lo=-1.0, hi=1.0: (torch.rand(s, generator=g, device="cuda") * (hi - lo) + lo)  # noqa: E731
    return {"u": u(b, L, d).to(dtype), "dt": u(b, L, d, lo=-4, hi=0).to(dtype), "dt_bias": u(d),
            "A_log": u(d, n, lo=-1, hi=1.5), "x_dbl": u(b, L, r + 2 * n).to(dtype), "D": u(d),
            "xz": u(b, L, 2 * d, lo=-3, hi=3).to(dtype), "state": u(b, d, n)}


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
# batch 1..256, L in {1, 7, 256, 2048} (issue 23); d_inner 70 and dt_rank 13: the scalar-load path (rows not in
# whole quads), d_inner 256: the vector path; L past one 16-step tile with a partial last tile
@pytest.mark.parametrize("b,L,d,r", [(1, 1, 256, 16), (3, 7, 256, 16), (256, 7, 256, 16), (256, 1, 256, 16),
                                     (2, 256, 256, 16), (64, 33, 256, 16), (1, 2048, 256, 16), (3, 37, 70, 13)])
def test_scan_tokens_equals_the_decode_step_bit_for_bit(mft, kernels, dtype, b, L, d, r):  # noqa: F811
    n = 16
    x = _scan_inputs(b, L, d, n, r, DT[dtype], seed=b * 1000 + L)
    ops = torch.ops.mamba_forge
    state = x["state"].clone()
    out = ops.scan_tokens(x["u"], x["dt"], x["dt_bias"], x["A_log"], x["x_dbl"], x["D"], x["xz"], state)
    step = kernels.fn("ssm_step_forward_fused", dtype)
    sp = x["state"].clone()
    steps = min(L, 40)  # the production step for the first 40 timesteps (each a launch)
    for t in range(steps):
        o = torch.empty(b, d, dtype=DT[dtype], device="cuda")
        step(out=o, state=sp, u=x["u"][:, t].contiguous(), dt=x["dt"][:, t].contiguous(), dt_bias=x["dt_bias"],
             A_log=x["A_log"], x_dbl=x["x_dbl"][:, t].contiguous(), Dp=x["D"],
             z=x["xz"][:, t].contiguous().view(-1)[d:], batch=b, d_inner=d, d_state=n, dt_rank=r, z_pad=d)
        assert _same(o, out[:, t]), f"step {t} differs"
    if steps == L:
        assert _same(sp, state)
    for chunk in (1, 64, 1000):
        if chunk >= L and chunk != 1:
            continue
        st, parts = x["state"].clone(), []
        for l0 in range(0, L, chunk):
            sl = slice(l0, min(L, l0 + chunk))
            parts.append(ops.scan_tokens(x["u"][:, sl].contiguous(), x["dt"][:, sl].contiguous(), x["dt_bias"],
                                         x["A_log"], x["x_dbl"][:, sl].contiguous(), x["D"],
                                         x["xz"][:, sl].contiguous(), st))
        assert _same(torch.cat(parts, 1), out) and _same(st, state), f"chunks of {chunk}"


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
# the op's route picks by grid size; both scans by name here at grids on either side of it, scalar and vector loads,
# d_state 16 and below, partial last tiles, L of one step
@pytest.mark.parametrize("b,L,d,n,r", [(1, 2048, 2048, 16, 64), (2, 300, 4096, 16, 64), (24, 40, 2048, 16, 64),
                                       (3, 37, 70, 13, 13), (5, 1, 256, 16, 16), (1, 16, 16, 8, 4)])
def test_warp_specialised_scan_gives_the_four_lane_bits(kernels, dtype, b, L, d, n, r):  # noqa: F811
    """ssm_scan_tokens_ws and ssm_scan_tokens: the same out and final state, every bit (so the op may serve a call
    from either), from a poisoned output."""
    x = _scan_inputs(b, L, d, n, r, DT[dtype], seed=7 * b + L)
    got = []
    for fam in ("ssm_scan_tokens", "ssm_scan_tokens_ws"):
        state, out = x["state"].clone(), torch.full_like(x["u"], float("nan"))
        kernels.fn(fam, dtype)(out=out, state=state, u=x["u"], dt=x["dt"], dt_bias=x["dt_bias"], A_log=x["A_log"],
                               x_dbl=x["x_dbl"], Dp=x["D"], xz=x["xz"], batch=b, d_inner=d, d_state=n, dt_rank=r, L=L)
        got.append((out, state))
    assert not torch.isnan(got[1][0].float()).any()
    assert _same(got[0][0], got[1][0]) and _same(got[0][1], got[1][1])


def test_scan_tokens_tells_a_last_bit_input_apart(mft):
    """Negative control of the bitwise comparison: u with the last bit of every element flipped gives other bits."""
    x = _scan_inputs(1, 9, 64, 16, 8, torch.float32, seed=5)
    ops = torch.ops.mamba_forge
    a = ops.scan_tokens(x["u"], x["dt"], x["dt_bias"], x["A_log"], x["x_dbl"], x["D"], x["xz"], x["state"].clone())
    u2 = (x["u"].view(torch.int32) ^ 1).view(torch.float32)
    b = ops.scan_tokens(u2, x["dt"], x["dt_bias"], x["A_log"], x["x_dbl"], x["D"], x["xz"], x["state"].clone())
    assert not _same(a, b)


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("b,L", [(1, 1), (3, 77), (8, 2048)])
def test_conv_tokens_equals_the_conv_step_bit_for_bit(mft, kernels, dtype, b, L):  # noqa: F811
    d, w = 512, 4
    g = torch.Generator(device="cuda").manual_seed(L)
    xz = (torch.rand(b, L, 2 * d, generator=g, device="cuda") * 4 - 2).to(DT[dtype])
    st0 = (torch.rand(b, d, w - 1, generator=g, device="cuda") * 4 - 2).to(DT[dtype])
    weight = torch.rand(d, w, generator=g, device="cuda") * 2 - 1
    bias = torch.rand(d, generator=g, device="cuda") * 2 - 1
    ops = torch.ops.mamba_forge
    st = st0.clone()
    out = ops.conv_tokens(xz, weight, bias, st)
    step = kernels.fn("conv1d_step_forward_silu", dtype)
    sp = st0.clone()
    for t in range(min(L, 40)):
        o = torch.empty(b, d, dtype=DT[dtype], device="cuda")
        step(out=o, conv_state=sp, x=xz[:, t, :d].contiguous(), weight=weight, bias=bias, batch=b, d=d, width=w)
        assert _same(o, out[:, t]), f"step {t}"
    for chunk in (1, 64, 1000):
        s, parts = st0.clone(), []
        for l0 in range(0, L, chunk):
            parts.append(ops.conv_tokens(xz[:, l0:l0 + chunk].contiguous(), weight, bias, s))
        assert _same(torch.cat(parts, 1), out) and _same(s, st), f"chunks of {chunk}"


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
# the op serves L <= CONV_TOKENS_VEC_MAX_L from the vectorised conv; both by name here: the vector path (4 | d,
# aligned), the element path (d not a multiple of 4; xz one element off its 16-byte alignment), widths 2..4
@pytest.mark.parametrize("b,L,d,w,offset", [(256, 1, 2048, 4, 0), (1, 1, 5120, 4, 0), (7, 4, 1032, 4, 0),
                                            (3, 3, 1030, 3, 0), (5, 2, 512, 2, 1), (2, 9, 64, 4, 0)])
def test_vectorised_conv_gives_the_tiled_bits(kernels, dtype, b, L, d, w, offset):  # noqa: F811
    """conv1d_tokens_silu_vec and conv1d_tokens_silu: the same out and new state, every bit, from a poisoned out."""
    g = torch.Generator(device="cuda").manual_seed(b * 31 + L)
    flat = (torch.rand(b * L * 2 * d + offset, generator=g, device="cuda") * 4 - 2).to(DT[dtype])
    xz = flat[offset:]  # offset 1: not 16-byte aligned
    st0 = (torch.rand(b, d, w - 1, generator=g, device="cuda") * 4 - 2).to(DT[dtype])
    weight = torch.rand(d, w, generator=g, device="cuda") * 2 - 1
    bias = torch.rand(d, generator=g, device="cuda") * 2 - 1
    got = []
    for fam in ("conv1d_tokens_silu", "conv1d_tokens_silu_vec"):
        st, out = st0.clone(), torch.full((b, L, d), float("nan"), dtype=DT[dtype], device="cuda")
        kernels.fn(fam, dtype)(out=out, conv_state=st, xz=xz, weight=weight, bias=bias, batch=b, d=d, L=L, width=w)
        got.append((out, st))
    assert not torch.isnan(got[1][0].float()).any()
    assert _same(got[0][0], got[1][0]) and _same(got[0][1], got[1][1])


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
# the vector path (d_inner 256, d_state 16) and the scalar-load one (d_inner 70, dt_rank 13, d_state 13)
@pytest.mark.parametrize("b,d,n,r", [(1, 256, 16, 16), (3, 256, 16, 16), (256, 256, 16, 16), (3, 70, 13, 13)])
def test_the_16bit_state_step_is_the_f32_step_on_the_rounded_state(mft, kernels, dtype, b, d, n, r):  # noqa: F811
    """ssm_step_forward_fused_state16 (scan_tokens at L = 1 with a state of the activations' dtype) reads the
    state, computes as the f32 step does and rounds the new state: its out is the f32 step's on the state's
    values, bit for bit, and its new state that step's rounded to the dtype; row 0 alone gives row 0's bits."""
    x = _scan_inputs(b, 1, d, n, r, DT[dtype], seed=b * 7 + d)
    ops = torch.ops.mamba_forge
    args = [x[k] for k in ("u", "dt", "dt_bias", "A_log", "x_dbl", "D", "xz")]
    s16 = x["state"].to(DT[dtype])
    s32 = s16.float()
    before, ptr = s16.clone(), s16.data_ptr()
    out16 = ops.scan_tokens(*args, s16)
    out32 = ops.scan_tokens(*args, s32)
    assert s16.data_ptr() == ptr and s16.dtype == DT[dtype]
    assert _same(out16, out32) and _same(s16, s32.to(DT[dtype]))
    assert not torch.equal(s16, before)  # updated in place
    if b > 1:
        row = x["state"][:1].to(DT[dtype])
        one = ops.scan_tokens(*[t[:1].contiguous() if t.dim() == 3 else t for t in args], row)
        assert _same(one[0], out16[0]) and _same(row[0], s16[0])


def test_layer_decodes_from_a_bf16_cache_in_graphs_as_eagerly(mft):
    """A bf16 ssm_state (allocate_inference_cache(..., ssm_dtype=torch.bfloat16), mamba-ssm's default): prefill then
    decode steps within bf16 rounding of the float32-state decode, and a decode step replayed from a CUDA graph
    the same bits as eager."""
    m = _layer(mft)
    h = torch.randn(4, 80, 1024, device="cuda", dtype=torch.bfloat16)
    outs = {}
    with torch.no_grad():
        for ssm_dtype in (torch.float32, torch.bfloat16):
            cache = mft.InferenceParams(max_seqlen=80, max_batch_size=4)
            cache.key_value_memory_dict[0] = m.allocate_inference_cache(4, 80, dtype=torch.bfloat16,
                                                                        ssm_dtype=ssm_dtype)
            parts = [m(h[:, :64], inference_params=cache)]
            for t in range(64, 80):
                cache.seqlen_offset = t
                parts.append(m(h[:, t:t + 1], inference_params=cache))
            outs[ssm_dtype] = torch.cat(parts, 1).float()
            assert cache.key_value_memory_dict[0][1].dtype == ssm_dtype
        err = (outs[torch.bfloat16] - outs[torch.float32]).abs().max().item()
        assert err < 0.1 * outs[torch.float32].abs().max().item(), err
        _replay_is_eager(m, h[:, 79:80].clone(), cache)


def _replay_is_eager(m, tok, cache):
    """One decode step of `tok` from the cache's state, eager and then captured in a CUDA graph (warmed up outside
    the capture) and replayed from the same state: the replay's output is the eager bits."""
    start = [t.clone() for t in cache.key_value_memory_dict[0]]

    def restore():
        for t, t0 in zip(cache.key_value_memory_dict[0], start, strict=True):
            t.copy_(t0)

    eager = m(tok, inference_params=cache).clone()
    m.prepare()
    restore()
    out = torch.empty_like(eager)
    graph = captured(lambda: out.copy_(m(tok, inference_params=cache)))
    restore()
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert _same(out, eager)


def _layer(mft, d_model=1024, seed=0, dtype=torch.bfloat16):
    torch.manual_seed(seed)
    m = mft.Mamba(d_model, layer_idx=0, device="cuda", dtype=dtype)
    with torch.no_grad():
        m.D.uniform_(-1, 1)
        m.conv1d.bias.uniform_(-0.5, 0.5)
    return m


def test_layer_matches_the_float64_reference(mft):
    from test_torch_layer import _reference_block

    m = _layer(mft)
    h = torch.randn(2, 256, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        got = m(h).double()
        ref = _reference_block(m, h.double())
    rel = float((got - ref.to(got.device)).abs().max() / ref.abs().max())
    assert rel < 2e-2, rel  # bf16 activations: mamba-ssm's own error against float64 is 4.3e-3 (anchors.md)


def test_layer_prefill_chunks_and_decode_agree_bit_for_bit(mft):
    m = _layer(mft)
    h = torch.randn(2, 272, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        whole = m(h)
        cache = mft.InferenceParams(max_seqlen=272, max_batch_size=2)
        parts = [m(h[:, :256], inference_params=cache)]
        for t in range(256, 272):
            cache.seqlen_offset = t
            parts.append(m(h[:, t:t + 1], inference_params=cache))
        assert _same(torch.cat(parts, 1), whole)
        cache = mft.InferenceParams(max_seqlen=272, max_batch_size=2)
        parts = []
        for l0 in range(0, 272, 64):
            cache.seqlen_offset = l0
            parts.append(m(h[:, l0:l0 + 64], inference_params=cache))
        assert _same(torch.cat(parts, 1), whole)


def test_layer_batch_invariance_graphs_and_compile(mft):
    m = _layer(mft)
    h = torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        b8 = m(h)
        b1 = m(h[:1])
        assert _same(b1[0], b8[0])
        # decode of one token in a CUDA graph, replayed, against eager
        cache = mft.InferenceParams(max_seqlen=2, max_batch_size=8)
        m(h[:, :1], inference_params=cache)
        cache.seqlen_offset = 1
        _replay_is_eager(m, h[:, 1:2].clone(), cache)
        compiled = torch.compile(lambda x: m(x), fullgraph=False)
        assert _same(compiled(h[:2, :64]), m(h[:2, :64]))


def test_mamba_ssm_state_dict_loads_and_agrees(mft):
    ms = pytest.importorskip("mamba_ssm.modules.mamba_simple")
    torch.manual_seed(3)
    peer = ms.Mamba(1024, layer_idx=0, device="cuda", dtype=torch.bfloat16)
    ours = mft.Mamba(1024, layer_idx=0, device="cuda", dtype=torch.bfloat16)
    ours.load_state_dict(peer.state_dict())
    h = torch.randn(2, 256, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        a, b = ours(h).float(), peer(h).float()
    assert float((a - b).abs().max() / b.abs().max()) < 3e-2


@pytest.fixture(scope="module")
def pdl_kernels(bundle):  # noqa: F811
    """(plain, with_pdl, spy): the bundle loaded with pdl=False, and loaded as usual through a SpyBackend."""
    from mamba_forge.runtime import load
    from mamba_forge.runtime.backend import CudaBackend

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("programmatic dependent launch needs sm_90+")
    path, key = bundle
    spy = SpyBackend(CudaBackend())
    return load(path, trusted_keys=[key], pdl=False), load(path, trusted_keys=[key], backend=spy), spy


def _decode_chain(mft, m, h, steps, graph):
    """Prefill h[:, :1], then `steps` decode steps of h[:, 1 + t] (eager, or captured once in a CUDA graph and
    replayed): (the outputs, conv_state, ssm_state)."""
    batch = h.shape[0]
    cache = mft.InferenceParams(max_seqlen=steps + 1, max_batch_size=batch)
    m(h[:, :1], inference_params=cache)
    cache.seqlen_offset = 1
    toks = h[:, 1:1 + steps].clone()
    outs = torch.empty(steps, batch, 1, h.shape[2], device="cuda", dtype=h.dtype)

    def run():
        for t in range(steps):
            outs[t].copy_(m(toks[:, t:t + 1], inference_params=cache))

    if not graph:
        run()
    else:
        start = [t.clone() for t in cache.key_value_memory_dict[0]]
        g = captured(run)
        for t, t0 in zip(cache.key_value_memory_dict[0], start, strict=True):
            t.copy_(t0)
        outs.fill_(float("nan"))
        g.replay()
    torch.cuda.synchronize()
    conv_state, ssm_state = cache.key_value_memory_dict[0]
    return outs.clone(), conv_state.clone(), ssm_state.clone()


def test_layer_decode_chain_under_programmatic_dependent_launch_equals_plain_launches(mft, kernels, pdl_kernels):  # noqa: F811
    """Every kernel of the layer's decode chain (in_proj, conv, x_proj, dt_proj, step, out_proj) declares
    pdl_max_blocks, so on sm_90+ each may start before the one before it has finished and must wait before it reads
    (the GEMMs' TMA producer included). 12 decode steps, eager and replayed from one CUDA graph, give the same
    outputs and states, bit for bit, as the same steps from kernels loaded with pdl=False."""
    plain, with_pdl, spy = pdl_kernels
    assert with_pdl.fn("conv1d_tokens_silu_vec", "bf16").pdl_max_blocks == 2048
    assert plain.fn("conv1d_tokens_silu_vec", "bf16").pdl_max_blocks == 0
    m = _layer(mft)
    try:
        for batch in (1, 16, 256):
            h = torch.randn(batch, 13, 1024, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                mft.register(plain)
                want = _decode_chain(mft, m, h, 12, graph=False)
                mft.register(with_pdl)
                spy.launches.clear()
                got = _decode_chain(mft, m, h, 12, graph=False)
                launches = list(spy.launches)
                graphed = _decode_chain(mft, m, h, 12, graph=True)
            assert not torch.isnan(want[0].float()).any()
            assert all(_same(a, b) for a, b in zip(got, want, strict=True)), f"batch {batch}: eager PDL differs"
            assert all(_same(a, b) for a, b in zip(graphed, want, strict=True)), f"batch {batch}: graphed PDL differs"
            if batch == 1:  # every launch of the chain at batch 1 is within its kernel's bound
                assert len(launches) >= 6 * 13 and all(p for _, p in launches), [g for g, p in launches if not p]
    finally:
        mft.register(kernels)


def test_block_decode_under_programmatic_dependent_launch_equals_plain_launches(mft, kernels, pdl_kernels):  # noqa: F811
    """A Block's decode: the fused residual add + RMSNorm (rmsnorm_forward_resadd_f32in, pdl_max_blocks 2048) then
    the mixer's chain, 8 tokens at batch 4: every launch with PDL, and the hidden states and residuals the same
    bits as from kernels loaded with pdl=False."""
    import functools

    plain, with_pdl, spy = pdl_kernels
    torch.manual_seed(3)
    blk = mft.Block(1024, functools.partial(mft.Mamba, layer_idx=0, device="cuda", dtype=torch.bfloat16)).cuda()
    with torch.no_grad():
        blk.norm.weight.uniform_(0.5, 1.5)
    h = torch.randn(4, 8, 1024, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(4, 8, 1024, device="cuda", dtype=torch.float32)

    def run():
        cache = mft.InferenceParams(max_seqlen=8, max_batch_size=4)
        outs = []
        for t in range(8):
            cache.seqlen_offset = t
            hid, r = blk(h[:, t:t + 1], res[:, t:t + 1].contiguous(), inference_params=cache)
            outs += [hid.clone(), r.clone()]
        torch.cuda.synchronize()
        return outs

    try:
        with torch.no_grad():
            mft.register(plain)
            want = run()
            mft.register(with_pdl)
            spy.launches.clear()
            got = run()
    finally:
        mft.register(kernels)
    assert all(_same(a, b) for a, b in zip(got, want, strict=True))
    assert len(spy.launches) == 8 * 7 and all(p for _, p in spy.launches), spy.launches


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
# dim <= 4096: the row kept in registers (one group a thread); 4104 and 6144: the loop that re-reads it; 1000 and the
# offset x: the scalar loads (rows not 16-byte aligned)
@pytest.mark.parametrize("rows,dim,offset", [(1, 2560, 0), (3, 768, 0), (300, 2048, 0), (2, 4096, 0), (5, 1000, 0),
                                             (4, 2560, 1), (1, 4104, 0), (7, 6144, 0)])
def test_add_rmsnorm_is_the_plain_rmsnorm_of_the_sum_bit_for_bit(kernels, dtype, rows, dim, offset):  # noqa: F811
    """rmsnorm_forward_resadd_f32in: residual + x in float32 (torch's own add, bit for bit), then y and rstd the bits
    of rmsnorm_forward on that sum (the same sums in the same order, whichever path serves the row), within float32
    rounding of a float64 reference; outputs poisoned first."""
    g = torch.Generator(device="cuda").manual_seed(rows * 7 + dim)
    act = DT[dtype]
    x = (torch.rand(rows * dim + offset, generator=g, device="cuda") * 2 - 1).to(act)[offset:].view(rows, dim)
    res = torch.rand(rows, dim, generator=g, device="cuda") * 4 - 2
    w = torch.rand(dim, generator=g, device="cuda") + 0.5
    want_res = res + x.float()
    y, rstd = torch.full_like(x, float("nan")), torch.full((rows,), float("nan"), device="cuda")
    got_res = res.clone()
    kernels.fn("rmsnorm_forward_resadd_f32in", dtype)(y=y, rstd=rstd, residual=got_res, x=x, w=w, rows=rows, dim=dim,
                                                       eps=1e-5)
    plain = (kernels.fn("rmsnorm_forward", "f32") if dtype == "f32"
             else kernels.fn("rmsnorm_forward_f32in", dtype))
    y2, rstd2 = torch.full_like(y, float("nan")), torch.full_like(rstd, float("nan"))
    plain(y=y2, rstd=rstd2, x=want_res, w=w, rows=rows, dim=dim, eps=1e-5)
    torch.cuda.synchronize()
    assert _same(got_res, want_res) and _same(y, y2) and _same(rstd, rstd2)
    h = want_res.double()
    ref = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    tol = {"bf16": 1e-2, "f16": 2e-3, "f32": 1e-5}[dtype]
    assert torch.allclose(y.double(), ref, rtol=tol, atol=tol)


def test_a_derived_tensor_is_never_made_inside_a_capture(mft):
    """A layer captured before any eager call would make its derived tensors (transposes, f32 copies) inside the
    capture, where they hold values only once the graph replays: refused with what to do; after prepare() the
    capture takes them as they are."""
    m = _layer(mft, d_model=256)
    norm = mft.RMSNorm(256, device="cuda", dtype=torch.bfloat16)
    tok = torch.randn(1, 1, 256, device="cuda", dtype=torch.bfloat16)
    cache = mft.InferenceParams(max_seqlen=4, max_batch_size=1)
    cache.key_value_memory_dict[0] = m.allocate_inference_cache(1, 4)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    for fn in (lambda: m(tok, inference_params=cache), norm.weight_f32):
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="prepare"), torch.no_grad(), torch.cuda.graph(g, stream=s):
            fn()
    torch.cuda.synchronize()
    m.prepare()
    norm.weight_f32()
    with torch.no_grad():
        eager = m(tok, inference_params=cache).clone()
    cache.key_value_memory_dict[0] = m.allocate_inference_cache(1, 4)
    out = torch.empty_like(eager)
    graph = captured(lambda: out.copy_(m(tok, inference_params=cache)))
    cache.key_value_memory_dict[0][0].zero_()
    cache.key_value_memory_dict[0][1].zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert _same(out, eager)
