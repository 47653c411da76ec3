"""mamba_forge.runtime.torch_optim on the real kernels (a signed bundle from MF_RUNTIME_BUNDLE / MF_RUNTIME_KEY, or one
built and qualified here by tests/gpu/test_runtime_gpu.py's fixture): AdamW (adamw_step_multi) against
torch.optim.AdamW on the GPU within f32 rounding, 16-bit parameters with f32 state, the capturable path giving the
multi path's bits and replaying in a CUDA graph as eager steps do, clip_grad_norm_ against torch's and bit-identical
run to run, and the refusals with a real manifest. The CPU twin is tests/test_torch_optim.py.

    MF_RUNTIME_BUNDLE=dist/h200.tar.gz MF_RUNTIME_KEY=manifests/keys python -m pytest -q tests/gpu/test_torch_optim_gpu.py
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_runtime_gpu import bundle, kernels  # noqa: E402,F401  (module fixtures: the signed bundle, load())

from mamba_forge.runtime import torch_optim as mo  # noqa: E402
from mamba_forge.runtime.errors import LaunchRefused  # noqa: E402

# as tests/test_torch_optim.py: the kernels receive f32 hyperparameters; torch's f32 steps round several times
TOL = {"p": (1e-6, 5e-7), "exp_avg": (1e-5, 2e-7), "exp_avg_sq": (6e-5, 1e-9)}
SHAPES = [(257, 129), (1_000_003,), (), (3, 1, 5), (0,), (2049,), (64, 64)]
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def _params(shapes, dtype=torch.float32, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.nn.Parameter((torch.rand(s, generator=g, device="cuda") * 2 - 1).to(dtype)) for s in shapes]


def _grads(params, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [(torch.rand(p.shape, generator=g, device="cuda") * 2 - 1).to(p.dtype) for p in params]


def _groups(params, **over):
    return [{"params": params[:3], "weight_decay": 0.1, "lr": 2e-2},
            {"params": params[3:], "weight_decay": 0.0, "lr": 5e-3, **over}]


def _bits(t):
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def test_adamw_matches_torch_adamw(kernels):  # noqa: F811
    params = _params(SHAPES)
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = mo.AdamW(_groups(params), kernels=kernels)
    ref = torch.optim.AdamW(_groups(twin), foreach=False)
    for step in range(1, 7):
        for p, q, g in zip(params, twin, _grads(params, 100 + step), strict=True):
            skip = step == 2 and p is params[1]  # a lagging step count: two launches for group 0 afterwards
            p.grad, q.grad = (None, None) if skip else (g.clone(), g.clone())
        opt.step()
        ref.step()
        for i, (p, q) in enumerate(zip(params, twin, strict=True)):
            torch.testing.assert_close(p, q, rtol=TOL["p"][0], atol=TOL["p"][1], msg=lambda m, i=i: f"param {i}: {m}")
            if q in ref.state:
                assert float(opt.state[p]["step"]) == float(ref.state[q]["step"])
                for k in ("exp_avg", "exp_avg_sq"):
                    torch.testing.assert_close(opt.state[p][k], ref.state[q][k], rtol=TOL[k][0], atol=TOL[k][1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_parameters(kernels, dtype):  # noqa: F811
    params = _params([(513, 77), (5,)], dtype=dtype, seed=3)
    twin = [torch.nn.Parameter(p.detach().float()) for p in params]
    opt = mo.AdamW(params, lr=0.1, weight_decay=0.05, kernels=kernels)
    ref = torch.optim.AdamW(twin, lr=0.1, weight_decay=0.05, foreach=False)
    for step in range(1, 5):
        for p, q, g in zip(params, twin, _grads(params, step), strict=True):
            p.grad, q.grad = g.clone(), g.float()
        opt.step()
        ref.step()
        with torch.no_grad():
            for p, q in zip(params, twin, strict=True):
                want = q.to(dtype)
                off = int((p.float() != want.float()).sum())
                assert off <= max(1, p.numel() // 100), f"{off} of {p.numel()} elements differ"
                # one ulp: relative for normals, the subnormal spacing below them (the H200 gave one f16 element
                # 5.96e-8 = 2^-24 off torch's, a last-bit difference that no relative bound admits)
                sub = torch.finfo(dtype).tiny * torch.finfo(dtype).eps
                torch.testing.assert_close(p.float(), want.float(), rtol=ULP[dtype], atol=sub)
                q.copy_(p.float())
                for k in ("exp_avg", "exp_avg_sq"):
                    assert opt.state[p][k].dtype == torch.float32
                    torch.testing.assert_close(opt.state[p][k], ref.state[q][k], rtol=TOL[k][0], atol=TOL[k][1])


def test_capturable_gives_the_multi_bits_and_replays_in_a_cuda_graph(kernels):  # noqa: F811
    pa, pb, pc = (_params(SHAPES, seed=5) for _ in range(3))
    plain = mo.AdamW(_groups(pa), kernels=kernels)
    eager = mo.AdamW(_groups(pb), capturable=True, kernels=kernels)
    graphed = mo.AdamW(_groups(pc), capturable=True, kernels=kernels)
    static = _grads(pa, 7)
    for ps in (pa, pb, pc):
        for p, g in zip(ps, static, strict=True):
            p.grad = g.clone()
    for opt in (plain, eager, graphed):  # warm-up: the state exists before the capture
        opt.step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        graphed.step()  # one more eager step on the capture stream (the arrival counters exist)
        torch.cuda.synchronize()
        with torch.cuda.graph(g, stream=s):
            graphed.step()
    torch.cuda.current_stream().wait_stream(s)
    plain.step()
    eager.step()
    for _ in range(3):
        plain.step()
        eager.step()
        g.replay()
    torch.cuda.synchronize()
    for a, b, c in zip(pa, pb, pc, strict=True):
        assert torch.equal(_bits(a), _bits(b)), "capturable differs from multi"
        assert torch.equal(_bits(b), _bits(c)), "graph replay differs from eager steps"
        if a.numel():
            for k in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(_bits(plain.state[a][k]), _bits(graphed.state[c][k]))
            assert int(eager.state[b]["step"]) == int(graphed.state[c]["step"]) == 5 == int(plain.state[a]["step"])


def test_clip_grad_norm_matches_torch_and_repeats_bit_for_bit(kernels):  # noqa: F811
    params = _params([(300, 7), (1,), (0,), (3_000_017,), ()], seed=4)
    grads = _grads(params, 6)
    results = []
    for _ in range(3):
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        norm = mo.clip_grad_norm_(params, 0.5, kernels=kernels)
        results.append((_bits(norm).clone(), [_bits(p.grad).clone() for p in params]))
    for bits, gs in results[1:]:
        assert torch.equal(bits, results[0][0]) and all(torch.equal(a, b) for a, b in zip(gs, results[0][1], strict=True))
    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for q, g in zip(twin, grads, strict=True):
        q.grad = g.clone()
    want = torch.nn.utils.clip_grad_norm_(twin, 0.5, foreach=False)
    torch.testing.assert_close(norm, want, rtol=1e-6, atol=0)
    for p, q in zip(params, twin, strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-9)


def test_refusals_with_a_real_manifest(kernels):  # noqa: F811
    with pytest.raises(LaunchRefused, match="is f64, which this manifest's adamw_step_multi"):
        mo.AdamW(_params([(3,)], dtype=torch.float64), kernels=kernels)
    with pytest.raises(LaunchRefused, match="is on cpu; the kernels run on cuda"):
        mo.AdamW([torch.nn.Parameter(torch.zeros(3))], kernels=kernels)
    with pytest.raises(LaunchRefused, match="bf16, which this manifest's adamw_step_capturable"):
        mo.AdamW(_params([(3,)], dtype=torch.bfloat16), capturable=True, kernels=kernels)
    p = _params([(3,)], dtype=torch.bfloat16)
    p[0].grad = torch.ones_like(p[0])
    with pytest.raises(LaunchRefused, match="bf16, which this manifest's grad_sumsq_partial"):
        mo.clip_grad_norm_(p, 1.0, kernels=kernels)


def test_a_non_capturable_step_refuses_to_be_captured(kernels):  # noqa: F811
    params = _params([(1000,)])
    opt = mo.AdamW(params, kernels=kernels)
    params[0].grad = torch.ones_like(params[0])
    opt.step()
    before = params[0].detach().clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with pytest.raises(LaunchRefused, match="capturable=False"), torch.cuda.graph(g, stream=s):
        opt.step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(params[0], before) and float(opt.state[params[0]]["step"]) == 1.0
