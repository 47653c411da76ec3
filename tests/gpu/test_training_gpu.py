"""Training the Mamba layer on the qualified backward kernels, on a real GPU (issue 24), from a signed bundle
(MF_RUNTIME_BUNDLE, MF_RUNTIME_KEY) or one built and qualified here (tests/gpu/test_runtime_gpu.py's fixture):

- every parameter's and the input's gradient against float64 torch autograd of mamba-ssm's reference path, within
  the peer's own error (mamba-ssm's Mamba where importable, else its slow path run by torch in the same dtype with
  selective_scan_ref's f32 scan), bf16 and f32;
- gradients bit-identical over 10 runs; sequence 0's input gradient the same bits at batch 1 and batch 8;
- torch.compile (aot_eager and inductor) gradients bit-identical to eager;
- the training forward's output bits == the inference forward's (3 scan chunks), for Mamba and Block;
- a step along the gradient lowers the loss by eps * |grad|^2, as first order predicts (the kernels' own forward);
- the kernels the training path added: the saving scan, transpose_rows (both paths), the token-major fold backward
  (the channel-major fold's bits) and the TN route's 64-row rungs (the 128x256 rung's bits).

    MF_RUNTIME_BUNDLE=dist/h200.tar.gz MF_RUNTIME_KEY=manifests/keys python -m pytest -q -s tests/gpu/test_training_gpu.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/torch_checks.py
from test_runtime_gpu import bundle, kernels  # noqa: E402,F401  (module fixtures: the signed bundle, load())
from torch_checks import descent_ratio  # noqa: E402

F = torch.nn.functional
DT = {"bf16": torch.bfloat16, "f32": torch.float32}
FLOOR = {"bf16": 1e-2, "f32": 1e-4}  # below these a gradient passes whatever the peer's error


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same(a, b) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(_bits(a), _bits(b)))


@pytest.fixture(scope="module")
def mft(kernels):  # noqa: F811
    import mamba_forge.runtime.torch as mft

    mft.register(kernels)
    return mft


def _layer(mft, dtype, d_model=256, seed=0):
    torch.manual_seed(seed)
    m = mft.Mamba(d_model, layer_idx=0, device="cuda", dtype=dtype)
    with torch.no_grad():
        m.D.uniform_(-1, 1)
        m.conv1d.bias.uniform_(-0.5, 0.5)
    m.check_training_kernels()  # the bundle serves every backward kernel (else: which one it lacks)
    return m


def _inputs(b, L, d_model, dtype, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = torch.randn(b, L, d_model, generator=g, device="cuda").to(dtype)
    return h, torch.randn(b, L, d_model, generator=g, device="cuda").to(dtype)


def _grads(m, h, g):
    """(output, d hidden, [d param in named_parameters order]) of one forward + backward."""
    m.zero_grad(set_to_none=True)
    x = h.detach().clone().requires_grad_(True)
    out = m(x)
    out.backward(g)
    return out.detach(), x.grad, [p.grad for _, p in m.named_parameters()]


def _torch_peer(m, h):
    """mamba-ssm's slow path (mamba_simple.Mamba.forward, selective_scan_ref) on torch's kernels in the model's
    dtype: projections and conv in that dtype, the scan in f32, its output cast back (as selective_scan_ref)."""
    b, L, _ = h.shape
    xz = F.linear(h, m.in_proj.weight, m.in_proj.bias).transpose(1, 2)
    x, z = xz.chunk(2, dim=1)
    x = F.silu(F.conv1d(x, m.conv1d.weight, m.conv1d.bias, padding=m.d_conv - 1, groups=m.d_inner)[..., :L])
    x_dbl = F.linear(x.transpose(1, 2).reshape(b * L, -1), m.x_proj.weight)
    dt, B, C = torch.split(x_dbl, [m.dt_rank, m.d_state, m.d_state], dim=-1)
    dt = (dt @ m.dt_proj.weight.t()).reshape(b, L, -1).transpose(1, 2)
    B, C = (t.reshape(b, L, -1).transpose(1, 2).float() for t in (B, C))
    delta = F.softplus(dt.float() + m.dt_proj.bias.float()[None, :, None])
    A, u = -torch.exp(m.A_log.float()), x.float()
    hs = torch.zeros(b, m.d_inner, m.d_state, device=h.device)
    ys = []
    for t in range(L):
        hs = torch.exp(delta[:, :, t, None] * A) * hs + (delta[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((hs * C[:, None, :, t]).sum(-1))
    y = ((torch.stack(ys, -1) + m.D.float()[None, :, None] * u) * F.silu(z.float())).to(h.dtype)
    return F.linear(y.transpose(1, 2), m.out_proj.weight, m.out_proj.bias)


def _peer_grads(m, h, g):
    """(name, d hidden, [d param]) of the peer: mamba-ssm's Mamba where importable, else _torch_peer."""
    peer = copy.deepcopy(m)
    name, run = "torch slow path", lambda x: _torch_peer(peer, x)
    try:
        from mamba_ssm.modules.mamba_simple import Mamba as PeerMamba

        ms = PeerMamba(m.d_model, layer_idx=0, device="cuda", dtype=m.in_proj.weight.dtype)
        ms.load_state_dict(m.state_dict())
        peer, name, run = ms, "mamba-ssm", ms
    except ImportError:
        pass
    x = h.detach().clone().requires_grad_(True)
    run(x).backward(g)
    return name, x.grad, [p.grad for _, p in peer.named_parameters()]


def _rel(got, want) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_gradients_match_float64_within_the_peers_error(mft, dtype):
    from torch_standins import layer_params64, reference_mamba

    m = _layer(mft, DT[dtype])
    h, g = _inputs(2, 512, 256, DT[dtype])  # 512 timesteps: two scan chunks, the saved state replayed
    _, dh, dps = _grads(m, h, g)
    p64 = layer_params64(m)
    h64 = h.double().requires_grad_(True)
    (reference_mamba(p64, h64, m.d_conv, m.dt_rank, m.d_state) * g.double()).sum().backward()
    peer, peer_dh, peer_dps = _peer_grads(m, h, g)
    rows = [("hidden", dh, peer_dh, h64.grad)] + [
        (name, got, pg, p64[name].grad) for (name, _), got, pg in zip(m.named_parameters(), dps, peer_dps,
                                                                       strict=True)]
    report = []
    for name, got, pg, want in rows:
        ours, theirs = _rel(got, want), _rel(pg, want)
        report.append(f"{name}: ours {ours:.2e}, {peer} {theirs:.2e}")
        assert ours <= max(3 * theirs, FLOOR[dtype]), "\n".join(report)
    print(f"\n{dtype} gradient error against float64 (max abs / max |ref|):\n  " + "\n  ".join(report))


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_gradients_are_bit_identical_over_ten_runs(mft, dtype):
    m = _layer(mft, DT[dtype], d_model=512)
    h, g = _inputs(4, 1024, 512, DT[dtype])
    first = _grads(m, h, g)
    for run in range(9):
        again = _grads(m, h, g)
        assert _same(first[0], again[0]) and _same(first[1], again[1]), f"run {run + 2}: output or d hidden"
        for (name, _), a, b in zip(m.named_parameters(), first[2], again[2], strict=True):
            assert _same(a, b), f"run {run + 2}: {name}"


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_sequence_0s_input_gradient_does_not_depend_on_the_batch(mft, dtype):
    m = _layer(mft, DT[dtype], d_model=512)
    h, g = _inputs(8, 640, 512, DT[dtype])
    out8, dh8, _ = _grads(m, h, g)
    out1, dh1, _ = _grads(m, h[:1], g[:1])
    assert _same(out1[0], out8[0])
    assert _same(dh1[0], dh8[0])


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_gradients_are_the_eager_bits(mft, backend):
    torch.manual_seed(5)
    blocks = torch.nn.ModuleList([mft.Block(512, lambda dim: mft.Mamba(dim, layer_idx=0, device="cuda",
                                                                       dtype=torch.bfloat16)) for _ in range(2)])
    blocks.cuda()

    def model(x):
        res = None
        for blk in blocks:
            x, res = blk(x, res)
        return x, res

    h, g = _inputs(2, 300, 512, torch.bfloat16)
    gr = torch.randn(2, 300, 512, device="cuda")
    results = []
    torch._dynamo.reset()
    for fn in (model, torch.compile(model, backend=backend)):
        blocks.zero_grad(set_to_none=True)
        x = h.detach().clone().requires_grad_(True)
        out, res = fn(x)
        torch.autograd.backward((out, res), (g, gr))
        results.append([out.detach(), res.detach(), x.grad] + [p.grad for p in blocks.parameters()])
    for i, (a, b) in enumerate(zip(*results, strict=True)):
        assert b is not None and _same(a, b), i


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_training_forward_output_is_the_inference_forward_bits(mft, dtype):
    m = _layer(mft, DT[dtype], d_model=512)
    h, _ = _inputs(3, 600, 512, DT[dtype])  # 600 = 256 + 256 + 88: three scan chunks
    train = m(h)
    assert train.grad_fn is not None
    with torch.no_grad():
        assert _same(train.detach(), m(h))
    blk = mft.Block(512, lambda dim: mft.Mamba(dim, layer_idx=0, device="cuda", dtype=DT[dtype])).cuda()
    res = torch.randn(3, 600, 512, device="cuda")
    out_t, res_t = blk(h, res)
    with torch.no_grad():
        out_i, res_i = blk(h, res.clone())
    assert out_t.grad_fn is not None and _same(out_t.detach(), out_i) and _same(res_t.detach(), res_i)


def test_a_step_along_the_gradient_lowers_the_loss_as_predicted(mft):
    """The gradient against the kernels' own forward, not a transcription: a small step -eps * grad lowers the loss
    by eps * |grad|^2 to first order (f32; a teacher layer's output is the target)."""
    m = _layer(mft, torch.float32, d_model=256)
    teacher = _layer(mft, torch.float32, d_model=256, seed=7)
    h, _ = _inputs(4, 300, 256, torch.float32, seed=9)
    with torch.no_grad():
        target = teacher(h)
    ratio = descent_ratio(m, h, target)
    assert 0.9 < ratio < 1.1, ratio


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_saving_scan_is_the_scan_and_saves_the_chunked_states(kernels, dtype):  # noqa: F811
    """ssm_scan_tokens_save on the GPU: out and final state are ssm_scan_tokens' bits over the whole sequence, and
    saved[:, :, c] is the state a 256-step chunked ssm_scan_tokens holds before chunk c, bit for bit (L 700: a
    partial last chunk). Outputs start poisoned (NaN)."""
    b, L, d, n, r = 3, 700, 96, 16, 8
    g = torch.Generator(device="cuda").manual_seed(11)
    u = lambda lo, hi, *s, dt=DT[dtype]: (torch.rand(*s, generator=g, device="cuda") * (hi - lo) + lo).to(dt)  # noqa: E731
    x = {"u": u(-1, 1, b, L, d), "dt": u(-4, 0, b, L, d), "x_dbl": u(-1, 1, b, L, r + 2 * n),
         "xz": u(-3, 3, b, L, 2 * d), "dt_bias": u(-1, 1, d, dt=torch.float32),
         "A_log": u(-1, 1.5, d, n, dt=torch.float32), "Dp": u(-1, 1, d, dt=torch.float32)}
    h0 = u(-1, 1, b, d, n, dt=torch.float32)
    dims = {"batch": b, "d_inner": d, "d_state": n, "dt_rank": r}
    nc = -(-L // 256)
    out = torch.full((b, L, d), float("nan"), dtype=DT[dtype], device="cuda")
    saved = torch.full((b, d, nc, n), float("nan"), device="cuda")
    st = h0.clone()
    kernels.fn("ssm_scan_tokens_save", dtype)(out=out, state=st, saved=saved, **x, **dims, L=L)
    want_st, parts = h0.clone(), []
    for c in range(nc):
        assert _same(saved[:, :, c], want_st), f"saved state before chunk {c}"
        s = slice(256 * c, min(L, 256 * (c + 1)))
        part = {k: (v[:, s].contiguous() if v.dim() == 3 else v) for k, v in x.items()}
        o = torch.empty((b, s.stop - s.start, d), dtype=DT[dtype], device="cuda")
        kernels.fn("ssm_scan_tokens", dtype)(out=o, state=want_st, **part, **dims, L=s.stop - s.start)
        parts.append(o)
    assert _same(out, torch.cat(parts, dim=1)) and _same(st, want_st)


@pytest.mark.parametrize("d", [75, 128])  # 75: odd offsets, the per-element path; 128: whole tiles in words
@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
def test_transpose_rows_reads_and_writes_strided_rows(kernels, dtype, d):  # noqa: F811
    """transpose_rows against torch: a column slice read in place (z = xz[..., d:]) into a dense [b, d, L], and a
    dense [b, d, L] written into one half of [b, L, 2d] rows, the other half untouched; edge tiles both ways."""
    b, L = 3, 130
    t = DT.get(dtype, torch.float16)
    xz = torch.randn(b, L, 2 * d, device="cuda").to(t)
    got = torch.full((b, d, L), float("nan"), dtype=t, device="cuda")
    kernels.fn("transpose_rows", dtype)(out=got.view(-1), src=xz.view(-1)[d:], batch=b, rows=L, cols=d, in_pad=d,
                                         out_pad=0)
    assert _same(got, xz[..., d:].transpose(1, 2).contiguous())
    dst = torch.randn(b, L, 2 * d, device="cuda").to(t)
    before = dst.clone()
    kernels.fn("transpose_rows", dtype)(out=dst.view(-1)[d:], src=got.view(-1), batch=b, rows=d, cols=L, in_pad=0,
                                         out_pad=d)
    assert _same(dst[..., d:], xz[..., d:]) and _same(dst[..., :d], before[..., :d])


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
def test_token_major_fold_is_the_channel_major_folds_bits(kernels, dtype):  # noqa: F811
    """ssm_parallel_scan_bwd_fold_tokens on the layer's token-major operands (z in xz's second half, B and C in
    x_dbl's columns, dz written into dxz's second half) gives, bit for bit, what ssm_parallel_scan_bwd_fold gives
    on the same operands transposed to [b, d, L]: the same arithmetic in the same order. Outputs poisoned; dxz's
    first half keeps its values. L 700: three chunks, the last ragged."""
    b, L, d, n, r = 2, 700, 128, 16, 8
    t, dev = DT[dtype], "cuda"
    g = torch.Generator(device=dev).manual_seed(5)
    rnd = lambda *s, lo=-1.0, hi=1.0: (torch.rand(*s, generator=g, device=dev) * (hi - lo) + lo).to(t)  # noqa: E731
    x, dt, dy = rnd(b * L, d), rnd(b * L, d, lo=-4.0, hi=0.0), rnd(b * L, d)
    xz, x_dbl = rnd(b * L, 2 * d, lo=-3.0, hi=3.0), rnd(b * L, r + 2 * n)
    saved = torch.rand(b, d, 3, n, generator=g, device=dev) * 2 - 1
    A_log = torch.rand(d, n, generator=g, device=dev) * 2.5 - 1
    D, bias = (torch.rand(d, generator=g, device=dev) * 2 - 1 for _ in range(2))
    f32 = lambda *s: torch.full(s, float("nan"), device=dev)  # noqa: E731
    parts = lambda: dict(dB_part=f32(b, d // 8, n, L), dC_part=f32(b, d // 8, n, L), dA_part=f32(b, d, n),  # noqa: E731
                         dD_part=f32(b, d), dbias_part=f32(b, d))
    common = dict(saved=saved, A_log=A_log, Dp=D, delta_bias=bias, batch=b, d_inner=d, d_state=n, L=L,
                  delta_softplus=1)
    dxz = torch.full((b * L, 2 * d), float("nan"), dtype=t, device=dev)
    dxz[:, :d] = 7.0
    tok = dict(du=torch.full((b * L, d), float("nan"), dtype=t, device=dev), ddelta=torch.full_like(x, float("nan")),
               **parts())
    kernels.fn("ssm_parallel_scan_bwd_fold_tokens", dtype)(
        dz=dxz.view(-1)[d:], dout=dy, u=x, delta=dt, Bm=x_dbl.view(-1)[r:], Cm=x_dbl.view(-1)[r + n:],
        z=xz.view(-1)[d:], z_pad=d, bc_pad=r + n, **tok, **common)
    cm = lambda v: v.view(b, L, -1).transpose(1, 2).contiguous()  # noqa: E731
    ch = dict(du=torch.empty(b, d, L, dtype=t, device=dev), ddelta=torch.empty(b, d, L, dtype=t, device=dev),
              dz=torch.empty(b, d, L, dtype=t, device=dev), **parts())
    kernels.fn("ssm_parallel_scan_bwd_fold", dtype)(
        dout=cm(dy), u=cm(x), delta=cm(dt), Bm=cm(x_dbl[:, r:r + n]), Cm=cm(x_dbl[:, r + n:]), z=cm(xz[:, d:]),
        **ch, **common)
    tm = lambda v: v.transpose(1, 2).reshape(b * L, d)  # noqa: E731
    assert _same(tok["du"], tm(ch["du"])) and _same(tok["ddelta"], tm(ch["ddelta"]))
    assert _same(dxz[:, d:], tm(ch["dz"])) and bool((dxz[:, :d] == 7.0).all())
    for k in ("dB_part", "dC_part", "dA_part", "dD_part", "dbias_part"):
        assert _same(tok[k], ch[k]), k


TN_REF = "gemm_bi_tn_sm90a_wgmma_ws2_m128n256_s4"
# (M, N, K): x_proj's dW at d_model 1024 (M 96) over a long K, dt_proj's dW^T (M 64), ragged N and K, M past 64
TN_SHAPES = [(96, 2048, 4096), (64, 2048, 1000), (8, 392, 331), (200, 136, 72), (520, 392, 331)]


@pytest.mark.parametrize("tile", ["m64n64_s12", "m64n128_s8"])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_tn_skinny_rungs_match_float64_and_the_reference_rungs_bits(kernels, dtype, tile):  # noqa: F811
    """The TN route's 64-row rungs (weight gradients with a small M) against a float64 product, and every element
    bit-identical to the route's reference rung (128x256 tiles) on the same operands: only the tile differs.
    Outputs poisoned (NaN)."""
    t = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(11)
    for M, N, K in TN_SHAPES:
        A = (torch.rand(K, M, generator=g, device="cuda") * 2 - 1).to(t)
        B = (torch.rand(K, N, generator=g, device="cuda") * 2 - 1).to(t)
        got, ref = (torch.full((M, N), float("nan"), dtype=t, device="cuda") for _ in range(2))
        kernels.gemm(A, B, got, layout="tn", symbol=f"gemm_bi_tn_sm90a_wgmma_skinny_{tile}_{dtype}")
        kernels.gemm(A, B, ref, layout="tn", symbol=f"{TN_REF}_{dtype}")
        a, b = A.double(), B.double()
        tol = 2 * 2.0**-8 * (a.T @ b).abs() + 1e-5 * (a.abs().T @ b.abs()) + 1e-6
        what = f"{tile}_{dtype} M={M} N={N} K={K}"
        assert bool(torch.isfinite(got).all()) and bool(((got.double() - a.T @ b).abs() <= tol).all()), what
        assert _same(got, ref), f"{what}: bits differ from {TN_REF}"
    # the route picks the 64-row rung for a small M, the reference rung past 256
    assert "skinny_m64n64" in kernels.gemm_route(96, 2048, 4096, dtype, layout="tn").symbol
    assert kernels.gemm_route(1024, 2048, 4096, dtype, layout="tn").symbol.startswith(TN_REF)
