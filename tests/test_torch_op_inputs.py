"""The torch ops' inputs from the outside (a review's findings): an empty input gives the op's result over nothing
without a launch (an empty output; a sum over no rows or timesteps is 0; a state is left as it is) where a kernel's
grid or pointer check refused it with a message about null tensors; a backward op refuses an incoming gradient that is
not its tensor's shape (it was read in the other's layout); causal_conv1d refuses a width its kernels do not serve
(they wrote nothing: the output was uninitialised memory); an RMSNorm over dim 0 is refused. Kernels stood in for on
CPU (tests/torch_standins.py), which record every launch."""

from __future__ import annotations

import pytest

from mamba_forge.runtime.errors import LaunchRefused

torch = pytest.importorskip("torch")
ops = None


@pytest.fixture(scope="module")
def mft():
    global ops
    from torch_standins import RefKernels, register_cpu

    kern = RefKernels()
    m = register_cpu(kern)
    ops = torch.ops.mamba_forge
    m.kern = kern
    return m


def _launches(mft) -> int:
    return len(mft.kern.calls)


# ---- empty inputs -------------------------------------------------------------------------------------------------

def test_empty_forward_inputs_launch_nothing_and_give_the_result_over_nothing(mft):
    before = _launches(mft)
    assert ops.softplus_forward(torch.empty(0)).shape == (0,)
    y, rstd = ops.rms_norm(torch.empty(0, 8), torch.ones(8), 1e-5)
    assert y.shape == (0, 8) and rstd.shape == (0,)
    assert ops.causal_conv1d(torch.empty(2, 8, 0), torch.ones(8, 4), torch.zeros(8)).shape == (2, 8, 0)
    out, last = ops.selective_scan(*_scan_args(batch=2, d=8, n=4, length=0))
    assert out.shape == (2, 8, 0) and torch.equal(last, torch.zeros(2, 8, 4))  # the state after no step: zero
    state = torch.randn(2, 8, 3)
    keep = state.clone()
    out = ops.conv_tokens(torch.empty(2, 0, 16), torch.ones(8, 4), torch.zeros(8), state)
    assert out.shape == (2, 0, 8) and torch.equal(state, keep)  # the state is left as it is
    residual = torch.randn(0, 8)
    assert ops.rms_norm_add(torch.empty(0, 8), residual, torch.ones(8), 1e-5).shape == (0, 8)
    assert _launches(mft) == before


def test_empty_backward_inputs_give_zero_weight_gradients(mft):
    before = _launches(mft)
    dx, dw, db = ops.causal_conv1d_backward(torch.empty(2, 8, 0), torch.empty(2, 8, 0), torch.ones(8, 4),
                                            torch.zeros(8))
    assert dx.shape == (2, 8, 0) and torch.equal(dw, torch.zeros(8, 4)) and torch.equal(db, torch.zeros(8))
    dx, dweight = ops.rms_norm_backward(torch.empty(0, 8), torch.empty(0, 8), torch.ones(8), torch.empty(0))
    assert dx.shape == (0, 8) and torch.equal(dweight, torch.zeros(8))
    assert _launches(mft) == before


def test_a_non_empty_call_still_launches(mft):
    before = _launches(mft)
    ops.softplus_forward(torch.randn(16))
    assert _launches(mft) == before + 1


# ---- backward ops: the incoming gradient is its tensor's shape ----------------------------------------------------

@pytest.mark.parametrize("call, match", [
    (lambda: ops.softplus_backward(torch.randn(8, 4), torch.randn(4, 8)), "softplus_backward: dy is \\[8, 4\\]"),
    (lambda: ops.softplus_backward(torch.randn(100), torch.randn(4, 8)), "dy is \\[100\\], expected \\[4, 8\\]"),
    (lambda: ops.rms_norm_backward(torch.randn(8, 4), torch.randn(4, 8), torch.ones(8), torch.ones(4)),
     "rms_norm_backward: dy"),
    (lambda: ops.rms_norm_backward(torch.randn(4, 8), torch.randn(4, 8), torch.ones(8), torch.ones(99)),
     "rms_norm_backward: rstd is \\[99\\], expected \\[4\\]"),
    (lambda: ops.causal_conv1d_backward(torch.randn(1, 16, 8), torch.randn(1, 8, 16), torch.ones(8, 4),
                                        torch.zeros(8)), "causal_conv1d_backward: dout"),
    (lambda: ops.selective_scan_backward(torch.randn(2, 8, 6), *_scan_args(batch=2, d=8, n=4, length=5)),
     "selective_scan_backward: dout is \\[2, 8, 6\\]"),
])
def test_a_gradient_of_another_shape_is_refused(mft, call, match):
    before = _launches(mft)
    with pytest.raises(LaunchRefused, match=match):
        call()
    assert _launches(mft) == before


def test_the_right_gradient_shape_still_runs(mft):
    x = torch.randn(4, 8)
    assert ops.softplus_backward(torch.randn(4, 8), x).shape == (4, 8)


# ---- widths and dims the kernels serve -----------------------------------------------------------------------------

@pytest.mark.parametrize("width", [5, 8])
def test_a_conv_width_the_kernels_do_not_serve_is_refused(mft, width):
    with pytest.raises(LaunchRefused, match=f"width {width}; the kernels take 1..4"):
        ops.causal_conv1d(torch.randn(1, 8, 16), torch.ones(8, width), torch.zeros(8))
    with pytest.raises(LaunchRefused, match=f"width {width}"):
        ops.causal_conv1d_backward(torch.randn(1, 8, 16), torch.randn(1, 8, 16), torch.ones(8, width), torch.zeros(8))
    assert ops.causal_conv1d(torch.randn(1, 8, 16), torch.ones(8, 4), torch.zeros(8)).shape == (1, 8, 16)


def test_rms_norm_over_dim_zero_is_refused(mft):
    with pytest.raises(LaunchRefused, match="dim >= 1"):
        ops.rms_norm(torch.empty(4, 0), torch.ones(0), 1e-5)


def _scan_args(*, batch, d, n, length):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return (r(batch, d, length), r(batch, d, length), r(d, n), r(batch, n, length), r(batch, n, length), r(d),
            r(batch, d, length), r(d))
