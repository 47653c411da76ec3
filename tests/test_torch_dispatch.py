"""The differentiable ops' Autograd-key kernel (mamba_forge/runtime/torch_dispatch.py) on the CPU: which path a call
takes (the implementation directly, a redispatch, or the autograd.Function), that each gives the bits of the
others, and that the formulas see every schema argument when the dispatcher dropped trailing defaults."""

from __future__ import annotations

import itertools

import pytest

torch = pytest.importorskip("torch")

from mamba_forge.runtime import torch_dispatch  # noqa: E402  (needs torch)

_names = itertools.count()


class _CountingOp:
    """An OpOverload's stand-in for autograd_kernel: its schema and names, and redispatch counted."""

    def __init__(self, op):
        self.op, self.redispatches = op, 0
        self._schema, self._namespace, self._opname, self._overloadname = (op._schema, op._namespace, op._opname,
                                                                           op._overloadname)

    def redispatch(self, keyset, *args):
        self.redispatches += 1
        return self.op.redispatch(keyset, *args)


@pytest.fixture
def scaled():
    """A scratch op ``scaled(Tensor x, Tensor? w=None, float s=2.0) -> Tensor`` (x * s, times w where given),
    its CPU implementation counting calls, a fake implementation, and torch_dispatch's Autograd kernel with a
    formula that records what it was told; CPU served directly for the test only."""
    name = f"scaled{next(_names)}"
    lib = torch.library.Library("mf_dispatch_test", "FRAGMENT")
    lib.define(f"{name}(Tensor x, Tensor? w=None, float s=2.0) -> Tensor")
    calls = {"impl": 0, "needs": None, "inputs": None}

    def impl(x, w=None, s=2.0):
        calls["impl"] += 1
        return x * s if w is None else x * s * w

    def fake(x, w=None, s=2.0):
        return torch.empty_like(x)

    def setup(ctx, inputs, output):
        calls["inputs"] = tuple(type(a).__name__ for a in inputs)
        x, w, s = inputs
        ctx.save_for_backward(x, w)
        ctx.s = s

    def backward(ctx, g):
        calls["needs"] = ctx.needs_input_grad
        x, w = ctx.saved_tensors
        return (g * ctx.s if w is None else g * ctx.s * w), (None if w is None else g * ctx.s * x), None

    lib.impl(name, impl, "CPU")
    torch.library.register_fake(f"mf_dispatch_test::{name}", fake, lib=lib)
    op = _CountingOp(getattr(torch.ops.mf_dispatch_test, name).default)
    lib.impl(name, torch_dispatch.autograd_kernel(op, impl, setup, backward), "Autograd", with_keyset=True)
    before = torch_dispatch.served_directly()
    torch_dispatch.serve_directly(torch._C.DispatchKey.CPU)
    yield op.op, op, calls
    torch_dispatch.serve_directly(torch._C.DispatchKey.CPU, on=torch._C.DispatchKey.CPU in before)
    lib._destroy()


def test_a_call_that_records_no_graph_calls_the_implementation_directly(scaled):
    op, counted, calls = scaled
    x = torch.randn(7)
    assert torch.equal(op(x), x * 2.0)
    assert (calls["impl"], counted.redispatches) == (1, 0)
    with torch.no_grad():  # inputs that require grad, grad mode off: no graph, the direct path
        assert torch.equal(op(x.clone().requires_grad_(), None, 3.0), x * 3.0)
    assert (calls["impl"], counted.redispatches) == (2, 0)


def test_without_the_backend_key_in_direct_keys_the_call_redispatches(scaled):
    """The negative case: the direct path is taken only for a key whose kernel is the implementation."""
    op, counted, calls = scaled
    x = torch.randn(5)
    assert torch.equal(op(x), x * 2.0)  # remembered as direct for this keyset
    assert (calls["impl"], counted.redispatches) == (1, 0)
    torch_dispatch.serve_directly(torch._C.DispatchKey.CPU, on=False)  # forgets what it remembered
    assert torch.equal(op(x), x * 2.0)
    assert (calls["impl"], counted.redispatches) == (2, 1)


def test_the_keyset_memo_is_bounded_and_answers_as_the_full_check(monkeypatch):
    K, DKS = torch._C.DispatchKey, torch._C.DispatchKeySet
    monkeypatch.setattr(torch_dispatch, "DIRECT_MEMO_ENTRIES", 2)
    before = torch_dispatch.served_directly()
    torch_dispatch.serve_directly(K.CUDA)
    try:
        cases = [(DKS(K.CUDA).add(K.AutogradCUDA).add(K.ADInplaceOrView), True),
                 (DKS(K.CUDA).add(K.Python).add(K.AutogradCUDA), False),  # a fake or subclass tensor
                 (DKS(K.CPU).add(K.AutogradCPU), K.CPU in before),
                 (DKS(K.CUDA).add(K.Functionalize).add(K.AutogradCUDA), False)]
        for _ in range(2):
            for keyset, want in cases:
                assert torch_dispatch._goes_direct(keyset) is want
                assert len(torch_dispatch._direct_memo) <= 2
    finally:
        torch_dispatch.serve_directly(K.CUDA, on=K.CUDA in before)


def test_fake_tensors_and_modes_redispatch_to_the_fake_implementation(scaled):
    """A Python key below autograd (FakeTensorMode, as torch.compile traces) must reach the fake implementation:
    the implementation is never called with fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op, counted, calls = scaled
    with FakeTensorMode() as mode:
        x = mode.from_tensor(torch.randn(4))
        y = op(x)
    assert type(y).__name__ == "FakeTensor"
    assert (calls["impl"], counted.redispatches) == (0, 1)
    with FakeTensorMode() as mode:  # and with a graph to record (AOTAutograd's joint trace)
        x = mode.from_tensor(torch.randn(4)).requires_grad_()
        y = op(x)
    assert type(y).__name__ == "FakeTensor" and y.grad_fn is not None
    assert (calls["impl"], counted.redispatches) == (0, 2)


def test_a_call_that_records_a_graph_runs_the_formula_with_every_argument(scaled):
    """The dispatcher drops trailing arguments equal to their defaults (w=None, s=2.0 here): the formula still sees
    all three inputs and a needs_input_grad of three, and the gradient is right."""
    op, counted, calls = scaled
    x = torch.randn(6, requires_grad=True)
    y = op(x)
    assert y.grad_fn is not None and (calls["impl"], counted.redispatches) == (1, 0)  # the Function's forward: direct
    assert calls["inputs"] == ("Tensor", "NoneType", "float")
    y.sum().backward()
    assert calls["needs"] == (True, False, False)
    assert torch.equal(x.grad, torch.full_like(x, 2.0))
    w = torch.randn(6, requires_grad=True)
    x.grad = None
    out = op(x, w, 0.5)
    assert torch.equal(out.detach(), (x * 0.5 * w).detach())
    out.sum().backward()
    assert calls["needs"] == (True, True, False)
    assert torch.equal(x.grad, (0.5 * w).detach()) and torch.equal(w.grad, (0.5 * x).detach())


def test_every_path_gives_the_same_bits(scaled):
    op, _, _ = scaled
    x, w = torch.randn(9), torch.randn(9)
    direct = op(x, w, 1.7)
    graph = op(x.clone().requires_grad_(), w, 1.7).detach()
    torch_dispatch.serve_directly(torch._C.DispatchKey.CPU, on=False)
    redispatched = op(x, w, 1.7)
    assert torch.equal(direct, graph) and torch.equal(direct, redispatched)


def test_the_mamba_forge_gemm_backward_with_its_defaults_dropped():
    """torch.ops.mamba_forge.gemm(A, B): bias and layout dropped by the dispatcher; the backward once failed here
    (the formula unpacked three needs_input_grad from two)."""
    from torch_standins import register_cpu

    register_cpu()
    A = torch.randn(5, 12, dtype=torch.float64).float().requires_grad_()
    B = torch.randn(12, 8).requires_grad_()
    C = torch.ops.mamba_forge.gemm(A, B)
    dC = torch.randn(5, 8)
    C.backward(dC)
    want_a = (dC.double() @ B.detach().double().T).float()
    want_b = (A.detach().double().T @ dC.double()).float()
    assert torch.allclose(A.grad, want_a, rtol=1e-6, atol=1e-6)
    assert torch.allclose(B.grad, want_b, rtol=1e-6, atol=1e-6)
