"""Autograd of the torch ops and the Mamba layer (issue 24) on the CPU, where torch is installed (a CPU build is
enough): every kernel stood in for by its float64 catalog reference after its real launch contract checked the
call (tests/torch_standins.py), so what these tests prove is the wiring (which kernel gets which operand, in which
layout, which partials fold into which gradient) and the autograd plumbing (formulas, fake implementations,
torch.compile), against float64 torch autograd of float64 transcriptions. tests/gpu/test_training_gpu.py runs the
real kernels.

Tolerances: on CPU every kernel output is the float64 reference rounded once to its tensor's dtype (f32 here), and
a gradient passes through at most ~15 such stored intermediates (each 2^-24 ~ 6e-8 relative), so the gradients
agree with float64 autograd to ~2e-7 of their largest element (measured: 0.5e-7 to 1.7e-7); the bound 2e-6 leaves
10x, and a wiring error (a wrong column, channel group, transpose or missing term) is of the gradient's own size.
"""

from __future__ import annotations

import pytest
from torch_checks import descent_ratio

from mamba_forge.runtime import torch_ops
from mamba_forge.runtime.errors import LaunchRefused

torch = pytest.importorskip("torch")
F = torch.nn.functional
TOL = 2e-6


def test_training_op_table_and_shape_rules():
    assert all(schema.startswith(f"{name}(") for name, schema in torch_ops.TRAIN_SCHEMAS.items())
    assert not set(torch_ops.TRAIN_SCHEMAS) & set(torch_ops.SCHEMAS)
    assert torch_ops.scan_bwd_family("x", 64) == ("ssm_parallel_scan_bwd_fold", 8)
    assert torch_ops.scan_bwd_family("x", 12) == ("ssm_parallel_scan_bwd", 4)
    with pytest.raises(LaunchRefused, match="multiples of 4"):
        torch_ops.scan_bwd_family("x", 10)
    ok = ((2, 5, 16), (64, 16), (32, 1, 4), (17, 32), (32, 1), (32,), (32, 8), (32,), (16, 32))
    assert torch_ops.mixer_shapes(*ok) == (2, 5, 16, 32, 4, 1, 8)
    for i in range(1, 9):
        bad = list(ok)
        bad[i] = tuple(n + 1 for n in bad[i])
        with pytest.raises(LaunchRefused, match="mamba_mixer"):
            torch_ops.mixer_shapes(*bad)
    with pytest.raises(LaunchRefused, match="width 5"):
        torch_ops.mixer_shapes(ok[0], ok[1], (32, 1, 5), *ok[3:])


@pytest.fixture(scope="module")
def mft():
    from torch_standins import register_cpu

    return register_cpu()


@pytest.fixture
def kernels(mft):
    """A fresh stand-in manifest (its launch log empty), registered for the test; the default one after."""
    from torch_standins import RefKernels

    def use(**kw):
        k = RefKernels(**kw)
        mft.register(k)
        return k

    yield use
    mft.register(RefKernels())


def _rel(got, want) -> float:
    return float((got.detach().double() - want).abs().max() / want.abs().max())


def _layer(mft, d_model=16, d_state=8, seed=0, **kw):
    torch.manual_seed(seed)
    m = mft.Mamba(d_model, d_state=d_state, layer_idx=0, dtype=torch.float32, **kw)
    with torch.no_grad():
        m.D.uniform_(-1, 1)
        for p in (m.conv1d.bias, m.in_proj.bias, m.out_proj.bias):
            if p is not None:
                p.uniform_(-0.5, 0.5)
    return m


def _ref_grads(m, h, g):
    """(output, d hidden, {name: d param}) of the float64 reference path, by torch autograd."""
    from torch_standins import layer_params64, reference_mamba

    p = layer_params64(m)
    h64 = h.detach().double().requires_grad_(True)
    out = reference_mamba(p, h64, m.d_conv, m.dt_rank, m.d_state)
    (out * g.double()).sum().backward()
    return out.detach(), h64.grad, {k: v.grad for k, v in p.items()}


@pytest.mark.parametrize("b,L,kw", [(2, 9, {}), (2, 300, {}), (1, 7, {"bias": True, "conv_bias": False}),
                                    (3, 5, {"d_conv": 2, "expand": 1.25}), (2, 9, {"d_state": 20})])
def test_layer_gradients_match_float64_autograd_of_mamba_ssms_reference_path(mft, kernels, b, L, kw):
    """Every parameter's and the input's gradient (L = 300: two scan chunks, the saved state replayed; biases on
    the projections and none on the conv; d_inner = 20: the W = 4 scan backward; d_state 20: the channel-major fold,
    past the token-major fold's 16 states)."""
    k = kernels()
    m = _layer(mft, **kw)
    h = torch.randn(b, L, 16, requires_grad=True)
    g = torch.randn(b, L, 16)
    out = m(h)
    (out * g).sum().backward()
    want_out, want_h, want = _ref_grads(m, h, g)
    assert _rel(out, want_out) < TOL
    assert _rel(h.grad, want_h) < TOL
    assert set(want) == {k for k, _ in m.named_parameters()}
    for name, grad in want.items():
        param = m.get_parameter(name)
        assert param.grad is not None and param.grad.dtype == param.dtype, name
        assert _rel(param.grad, grad) < TOL, (name, _rel(param.grad, grad))
    ran = {c.rsplit("_", 1)[0] for c in k.calls if isinstance(c, str) and c.startswith("ssm_parallel_scan_bwd")}
    assert ran == {torch_ops.mixer_scan_bwd_family(m.d_inner, m.d_state)[0]}, ran


def test_a_step_along_the_gradient_lowers_the_loss_as_predicted(mft):
    """The gradient against the layer's own forward, not a transcription: -eps * grad lowers the loss by
    eps * |grad|^2 to first order (second order: ~1e-3 of it at this eps)."""
    m, teacher = _layer(mft), _layer(mft, seed=7)
    h = torch.randn(2, 12, 16)
    with torch.no_grad():
        target = teacher(h)
    ratio = descent_ratio(m, h, target)
    assert 0.9 < ratio < 1.1, ratio


def test_training_forward_is_the_inference_forward_bit_for_bit(mft, kernels):
    """Grad recording runs mamba_mixer: the inference kernels from zero states, the scan as ssm_scan_tokens_save
    (ssm_scan_tokens' body writing the states before timesteps 0 and 256 too: L = 300), one launch over the whole
    sequence; no_grad and inference_params run the inference path itself."""
    k = kernels()
    m = _layer(mft)
    h = torch.randn(2, 300, 16)
    train = m(h)
    assert train.requires_grad and train.grad_fn is not None
    scans = [c for c in k.calls if isinstance(c, str) and c.startswith("ssm_scan_tokens")]
    assert scans == ["ssm_scan_tokens_save_f32"]
    with torch.no_grad():
        assert torch.equal(m(h), train.detach())
    cache = mft.InferenceParams(max_seqlen=300, max_batch_size=2)
    inference = m(h, inference_params=cache)
    assert inference.grad_fn is None and torch.equal(inference, train.detach())


def test_the_saved_states_are_the_scan_state_before_each_chunk(mft):
    m = _layer(mft)
    h = torch.randn(2, 300, 16)
    p = (m.in_proj.weight, m.in_proj.bias, m.conv1d.weight, m.conv1d.bias, m.x_proj.weight, m.dt_proj.weight,
         m.dt_proj.bias, m.A_log, m.D, m.out_proj.weight, m.out_proj.bias)
    with torch.no_grad():
        out, xz, x, x_dbl, dt, y, saved = torch.ops.mamba_forge.mamba_mixer(h, *p)
        assert saved.shape == (2, m.d_inner, 2, m.d_state) and not saved[:, :, 0].any()
        cache = mft.InferenceParams(max_seqlen=300, max_batch_size=2)
        m(h[:, :256], inference_params=cache)
        assert torch.equal(saved[:, :, 1], cache.key_value_memory_dict[0][1])  # ssm_state after 256 steps


def test_block_trains_through_the_residual_path(mft):
    """Two Blocks: the norm weights, the mixers and both inputs (hidden and residual) against float64 autograd of
    residual + hidden -> RMSNorm -> mamba-ssm's reference path."""
    from torch_standins import layer_params64, reference_mamba

    torch.manual_seed(4)
    blocks = [mft.Block(16, lambda dim: mft.Mamba(dim, d_state=8, layer_idx=0, dtype=torch.float32)) for _ in range(2)]
    with torch.no_grad():
        for blk in blocks:
            blk.norm.weight.uniform_(0.5, 1.5)
    h = torch.randn(2, 6, 16, requires_grad=True)
    res0 = torch.randn(2, 6, 16, requires_grad=True)
    g1, g2 = torch.randn(2, 6, 16), torch.randn(2, 6, 16)
    hid, res = blocks[0](h, res0)
    hid, res = blocks[1](hid, res)
    ((hid * g1).sum() + (res * g2).sum()).backward()
    ps = [layer_params64(blk.mixer) for blk in blocks]
    ws = [blk.norm.weight.detach().double().requires_grad_(True) for blk in blocks]
    h64, r64 = (t.detach().double().requires_grad_(True) for t in (h, res0))
    x, r = h64, r64
    for blk, p, w in zip(blocks, ps, ws, strict=True):
        r = r + x
        y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + blk.norm.eps) * w
        x = reference_mamba(p, y, 4, blk.mixer.dt_rank, 8)
    ((x * g1.double()).sum() + (r * g2.double()).sum()).backward()
    assert _rel(h.grad, h64.grad) < TOL and _rel(res0.grad, r64.grad) < TOL
    for blk, p, w in zip(blocks, ps, ws, strict=True):
        assert _rel(blk.norm.weight.grad, w.grad) < TOL
        for name, p64 in p.items():
            assert _rel(blk.mixer.get_parameter(name).grad, p64.grad) < TOL, name


def test_sequence_0s_input_gradient_does_not_depend_on_the_batch(mft):
    m = _layer(mft)
    h = torch.randn(3, 20, 16)
    g = torch.randn(3, 20, 16)
    grads = []
    for b in (1, 3):
        x = h[:b].clone().requires_grad_(True)
        (m(x) * g[:b]).sum().backward()
        grads.append(x.grad[0])
    assert torch.equal(grads[0], grads[1])


def test_tn_gradients_run_the_nn_route_on_a_transposed_copy_where_no_tn_route_serves(mft, kernels):
    m = _layer(mft)
    h = torch.randn(2, 9, 16, requires_grad=True)
    g = torch.randn(2, 9, 16)
    runs = []
    for layouts in (("nn", "nt", "tn"), ("nn",)):
        k = kernels(layouts=layouts)
        m.zero_grad()
        h.grad = None
        (m(h) * g).sum().backward()
        runs.append([h.grad] + [p.grad.clone() for p in m.parameters()])
        used = {c[1] for c in k.calls if isinstance(c, tuple)}
        assert used == set(layouts) - {"nt"}, used  # the layer's gradients are nn (dX) and tn (dW) products
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)  # the same float64 products either way: the choice changes the route, not math


@pytest.mark.parametrize("missing,says", [
    ("ssm_parallel_scan_bwd_fold_tokens", "ssm_parallel_scan_bwd_fold_tokens f32"), ("conv1d_bwd_tiled", "conv1d_bwd_tiled f32"),
    ("ssm_reduce_d_a_log", "ssm_reduce_d_a_log"), ("ssm_reduce_d_BC_groups_tmajor", "ssm_reduce_d_BC_groups_tmajor"),
    ("residual_add_f32", "residual_add f32"), ("rmsnorm_backward", "rmsnorm_backward f32"),
    ("vec_add_inplace", "vec_add_inplace f32"), ("reduce_sum_axis0", "reduce_sum_axis0 f32")])
def test_a_missing_backward_kernel_is_refused_never_replaced(mft, kernels, missing, says):
    """An inference-only manifest registers and runs the forward; the backward refuses, naming the kernel, and
    leaves no gradient behind; check_training_kernels says so before any forward."""
    k = kernels(missing={missing})
    blk = mft.Block(16, lambda dim: mft.Mamba(dim, d_state=8, layer_idx=0, dtype=torch.float32))
    with pytest.raises(LaunchRefused, match=says):
        blk.check_training_kernels()
    h = torch.randn(2, 5, 16, requires_grad=True)
    out, res = blk(h)
    launched = len(k.calls)
    with pytest.raises(LaunchRefused, match=rf"needs {says}\b.*nothing falls back"):
        (out.sum() + res.sum()).backward()
    assert h.grad is None
    assert not any(isinstance(c, str) and c.startswith(missing) for c in k.calls[launched:])
    kernels()  # the full stand-in manifest again: the same layer trains
    blk.check_training_kernels()
    out, res = blk(h)
    (out.sum() + res.sum()).backward()
    assert h.grad is not None and all(p.grad is not None for p in blk.parameters())


def test_register_and_the_forward_ops_need_no_backward_kernel(mft, kernels):
    k = kernels(missing={"softplus_backward"})
    x = torch.randn(5, 7, requires_grad=True)
    y = torch.ops.mamba_forge.softplus_forward(x)
    assert torch.allclose(y, F.softplus(x.detach()), rtol=1e-6)
    with pytest.raises(LaunchRefused, match="softplus_backward"):
        y.sum().backward()
    assert "softplus_backward_f32" not in k.calls and x.grad is None


# ---- each op's gradient against float64 autograd of its transcription ----------------------------------------------

def _check_op(op, ref, inputs, grads_out, tol=TOL):
    """op(*inputs) (f32, the stand-ins) and ref(*inputs in float64): outputs and every input's gradient."""
    xs = [t.detach().clone().requires_grad_(t.is_floating_point()) if torch.is_tensor(t) else t for t in inputs]
    x64 = [t.detach().double().requires_grad_(True) if torch.is_tensor(t) else t for t in inputs]
    got, want = op(*xs), ref(*x64)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    sum(((a * g).sum() for a, g in zip(got, grads_out, strict=False) if g is not None)).backward()
    sum(((a * g.double()).sum() for a, g in zip(want, grads_out, strict=False) if g is not None)).backward()
    for a, b in zip(got, want, strict=False):
        assert _rel(a, b.detach()) < tol
    for i, (a, b) in enumerate(zip(xs, x64, strict=True)):
        if torch.is_tensor(a):
            assert a.grad is not None and _rel(a.grad, b.grad) < tol, (i, a.grad is not None and _rel(a.grad, b.grad))


@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_gemm_gradients(mft, kernels, layout):
    a_shape, b_shape = {"nn": ((5, 12), (12, 8)), "nt": ((5, 12), (8, 12)), "tn": ((12, 5), (12, 8))}[layout]
    A, B, bias = torch.randn(a_shape), torch.randn(b_shape), torch.randn(8)
    opA = (lambda t: t.t()) if layout == "tn" else (lambda t: t)
    opB = (lambda t: t.t()) if layout == "nt" else (lambda t: t)
    for layouts in (("nn", "nt", "tn"), {"nn", layout}):  # the second: gradients of other layouts by nn
        k = kernels(layouts=layouts)
        _check_op(lambda a, b, c: torch.ops.mamba_forge.gemm(a, b, c, layout),
                  lambda a, b, c: opA(a) @ opB(b) + c, (A, B, bias), (torch.randn(5, 8),))
        assert "reduce_bias_f32" in k.calls


def test_softplus_rms_norm_and_conv_gradients(mft):
    x = torch.randn(4, 33) * 8
    _check_op(torch.ops.mamba_forge.softplus_forward, F.softplus, (x,), (torch.randn(4, 33),))
    w = torch.rand(24) + 0.5
    rms = lambda a, b: a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-5) * b  # noqa: E731
    _check_op(lambda a, b: torch.ops.mamba_forge.rms_norm(a, b, 1e-5)[0], rms, (torch.randn(3, 5, 24), w),
              (torch.randn(3, 5, 24),))
    _check_op(lambda a, r, b: torch.ops.mamba_forge.rms_norm_residual(a, r, b, 1e-5)[:2],
              lambda a, r, b: (rms(r + a, b), r + a), (torch.randn(6, 24), torch.randn(6, 24), w),
              (torch.randn(6, 24), torch.randn(6, 24)))
    xc, wc, bc = torch.randn(2, 8, 40), torch.randn(8, 4), torch.randn(8)
    conv = lambda a, b, c: F.silu(F.conv1d(a, b[:, None], c, padding=3, groups=8)[..., :40])  # noqa: E731
    _check_op(torch.ops.mamba_forge.causal_conv1d, conv, (xc, wc, bc), (torch.randn(2, 8, 40),))


def test_rms_norm_gradient_with_a_bfloat16_output(mft):
    """x is the f32 residual stream, y bf16 (rmsnorm_backward_f32in): dx stays f32; bf16's 2^-9 rounding of dy
    and y bounds the agreement."""
    x, w = torch.randn(4, 32), torch.rand(32) + 0.5
    xs, ws = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y, rstd = torch.ops.mamba_forge.rms_norm(xs, ws, 1e-5, torch.bfloat16)
    assert y.dtype == torch.bfloat16 and not rstd.requires_grad
    g = torch.randn(4, 32).bfloat16()
    (y * g).float().sum().backward()
    x64, w64 = x.double().requires_grad_(True), w.double().requires_grad_(True)
    ((x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * w64) * g.double()).sum().backward()
    assert xs.grad.dtype == torch.float32 and _rel(xs.grad, x64.grad) < 1e-5 and _rel(ws.grad, w64.grad) < 1e-5


def _scan64(u, delta, A_log, B, C, D, z, delta_bias):
    """Mamba-1's selective_scan_ref (delta_softplus, D, z) in float64."""
    dl = F.softplus(delta + delta_bias[None, :, None])
    A = -torch.exp(A_log)
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1], dtype=u.dtype)
    ys = []
    for t in range(u.shape[2]):
        h = torch.exp(dl[:, :, t, None] * A) * h + (dl[:, :, t] * u[:, :, t])[..., None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    return (torch.stack(ys, -1) + D[None, :, None] * u) * F.silu(z)


@pytest.mark.parametrize("d,L", [(16, 300), (12, 9)])
def test_selective_scan_gradients(mft, kernels, d, L):
    """d = 16: the fold (W = 8), L = 300: the states saved every 256 steps replayed; d = 12: the W = 4 backward."""
    k = kernels()
    torch.manual_seed(d)
    b, n = 2, 4
    u, z = torch.rand(b, d, L) * 2 - 1, torch.rand(b, d, L) * 6 - 3
    delta, A_log = torch.rand(b, d, L) * 4 - 4, torch.rand(d, n) * 2.5 - 1
    B, C, D, bias = torch.randn(b, n, L), torch.randn(b, n, L), torch.randn(d), torch.rand(d) * 2 - 1
    _check_op(lambda *a: torch.ops.mamba_forge.selective_scan(*a)[0], _scan64, (u, delta, A_log, B, C, D, z, bias),
              (torch.randn(b, d, L),))
    assert ("ssm_parallel_scan_bwd_fold_f32" if d % 8 == 0 else "ssm_parallel_scan_bwd_f32") in k.calls
    assert not torch.ops.mamba_forge.selective_scan(u, delta, A_log, B, C, D, z, bias)[1].requires_grad


def test_opcheck_the_differentiable_ops(mft):
    """torch.library.opcheck: schema, fake implementation against the real one, autograd registration, and
    AOT dispatch (the torch.compile path, static and dynamic shapes) for each op with a formula."""
    r = lambda *s: torch.randn(*s, requires_grad=True)  # noqa: E731
    cases = [("gemm", (r(5, 12), r(12, 8), r(8), "nn")), ("gemm", (r(12, 5), r(12, 8), None, "tn")),
             ("softplus_forward", (r(3, 7),)), ("rms_norm", (r(3, 16), r(16), 1e-5, None)),
             ("rms_norm_residual", (r(3, 16), r(3, 16), r(16), 1e-5)), ("causal_conv1d", (r(2, 8, 11), r(8, 4), r(8))),
             ("selective_scan", (r(1, 8, 6), r(1, 8, 6), r(8, 4), r(1, 4, 6), r(1, 4, 6), r(8), r(1, 8, 6), r(8))),
             ("mamba_mixer", (r(2, 5, 16), r(64, 16), r(64), r(32, 1, 4), r(32), r(17, 32), r(32, 1), r(32), r(32, 8),
                              r(32), r(16, 32), None))]
    for name, args in cases:
        torch.library.opcheck(getattr(torch.ops.mamba_forge, name).default, args,
                              test_utils=("test_schema", "test_autograd_registration", "test_faketensor",
                                          "test_aot_dispatch_static", "test_aot_dispatch_dynamic"))


def test_compiled_training_step_gives_the_eager_gradients(mft):
    """torch.compile (aot_eager: AOTAutograd traces forward and backward through the fake implementations) of a
    two-Block model: the loss and every gradient are the eager bits."""
    torch.manual_seed(6)
    blocks = torch.nn.ModuleList(
        [mft.Block(16, lambda dim: mft.Mamba(dim, d_state=8, layer_idx=0, dtype=torch.float32)) for _ in range(2)])

    def model(x):
        res = None
        for blk in blocks:
            x, res = blk(x, res)
        return (x * x).mean() + res.mean()

    h = torch.randn(2, 12, 16, requires_grad=True)
    results = []
    torch._dynamo.reset()
    for fn in (model, torch.compile(model, backend="aot_eager")):
        blocks.zero_grad(set_to_none=True)
        h.grad = None
        loss = fn(h)
        loss.backward()
        results.append([loss.detach(), h.grad] + [p.grad for p in blocks.parameters()])
    assert all(t is not None for t in results[1])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
    # aot_eager's compilers, recording: one forward and one backward graph, holding the training ops
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    seen: dict[str, list] = {"fw": [], "bw": []}

    def record(kind):
        def compiler(gm, _inputs):
            seen[kind].append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
            return make_boxed_func(gm.forward)
        return compiler

    torch._dynamo.reset()
    torch.compile(model, backend=aot_autograd(fw_compiler=record("fw"), bw_compiler=record("bw")))(h).backward()
    assert len(seen["fw"]) == len(seen["bw"]) == 1
    assert {"mamba_forge.mamba_mixer.default", "mamba_forge.rms_norm_residual.default"} <= seen["fw"][0]
    assert {"mamba_forge.mamba_mixer_backward.default",
            "mamba_forge.rms_norm_residual_backward.default"} <= seen["bw"][0]
