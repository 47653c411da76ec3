"""Keyword launches whose memory cannot be right are refused (LaunchRefused naming the arguments) before any
launch: a data pointer of 0, an output partially overlapping an input, outputs aliasing each other, an output exactly
an input it does not declare (in_place_of: a conv reading x[t-1] after another thread wrote out[t-1] over it). Inputs
may share memory, and an output may be exactly the input it declares (an elementwise kernel run in place)."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_fakes import FakeCAI, conv1d, softplus, two_outputs
from runtime_fakes import FakeTorchTensor as T

from mamba_forge.runtime.contract import contract
from mamba_forge.runtime.errors import LaunchRefused

BASE = 0x7E00_0000_0000
N = 1024  # f32: 4096 bytes each


@pytest.mark.parametrize("y_at,x_at", [(BASE, BASE + 4), (BASE, BASE + 4092), (BASE + 8, BASE), (BASE + 4092, BASE),
                                        (BASE, BASE + 2048), (BASE + 2048, BASE), (BASE + 1, BASE)])
def test_output_partially_overlapping_an_input_refused(y_at, x_at):
    with pytest.raises(LaunchRefused, match="y and x|x and y") as info:
        contract(softplus()).bind({"y": FakeCAI((N,), ptr=y_at), "x": FakeCAI((N,), ptr=x_at)})
    assert "partially overlaps" in str(info.value)


@pytest.mark.parametrize("which", ["y", "x"])
def test_null_data_pointer_refused(which):
    args = {"y": FakeCAI((N,), ptr=BASE), "x": FakeCAI((N,), ptr=BASE + (1 << 20))}
    args[which] = FakeCAI((N,), ptr=0)
    with pytest.raises(LaunchRefused, match=f"{which} of softplus_forward_f32: its data pointer is 0"):
        contract(softplus()).bind(args)


@pytest.mark.parametrize("x_at", [BASE + 4096, BASE - 4096, BASE + (1 << 30)])
def test_adjacent_or_distant_memory_binds(x_at):
    assert contract(softplus()).bind({"y": FakeCAI((N,), ptr=BASE), "x": FakeCAI((N,), ptr=x_at)})


def test_in_place_output_exactly_its_input_binds():
    assert contract(softplus()).bind({"y": FakeCAI((N,), ptr=BASE), "x": FakeCAI((N,), ptr=BASE)})


@pytest.mark.parametrize("b_at", [BASE, BASE + 4, BASE + 4092])
def test_outputs_aliasing_each_other_refused(b_at):
    args = {"a": FakeCAI((N,), ptr=BASE), "b": FakeCAI((N,), ptr=b_at), "x": FakeCAI((N,), ptr=BASE + (1 << 30))}
    with pytest.raises(LaunchRefused, match="outputs alias each other"):
        contract(two_outputs()).bind(args)


def test_separate_outputs_bind():
    args = {"a": FakeCAI((N,), ptr=BASE), "b": FakeCAI((N,), ptr=BASE + 4096), "x": FakeCAI((N,), ptr=BASE + 8192)}
    assert contract(two_outputs()).bind(args)


# ---- in place only where the output declares that input (in_place_of) --------------------------------------------

def _calls(c, path: str):
    """The full check (bind), or the memo's path on torch tensors after a first call has made the entry."""
    if path == "full":
        return c.bind, lambda shape, ptr, dtype="<f4": FakeCAI(shape, dtype, ptr=ptr)
    return c.args, lambda shape, ptr, dtype="f32": T(int(np.prod(shape)), dtype, ptr=ptr)


@pytest.mark.parametrize("path", ["full", "memo"])
def test_an_undeclared_exact_alias_of_an_elementwise_family_refused(path):
    declared, undeclared = contract(softplus()), contract(softplus(in_place=False))
    for c in (declared, undeclared):
        call, t = _calls(c, path)
        assert call({"y": t((N,), BASE), "x": t((N,), BASE + (1 << 20))})  # separate memory: binds (and memoizes)
    call, t = _calls(declared, path)
    assert call({"y": t((N,), BASE), "x": t((N,), BASE)})  # the declared pair: in place
    call, t = _calls(undeclared, path)
    with pytest.raises(LaunchRefused, match=r"^x and y of softplus_forward_f32: y is exactly x, which its kernel is "
                                            r"not declared to run in place of \(\[.*\); pass separate memory$"):
        call({"y": t((N,), BASE), "x": t((N,), BASE)})


@pytest.mark.parametrize("path", ["full", "memo"])
def test_a_conv_output_exactly_its_input_refused(path):
    """conv1d reads x[t-1]: with out == x a thread reads what another has already written. Refused, naming both, on
    the full check and on a memo hit."""
    c = contract(conv1d("f16"))
    call, t = _calls(c, path)
    b, d, L, w = 2, 4, 64, 4
    half, single = ("<f2", "<f4") if path == "full" else ("f16", "f32")
    shapes = {"out": ((b * d * L,), half), "x": ((b * d * L,), half), "weight": ((d * w,), single), "bias": ((d,), single)}
    ptrs = {"out": BASE, "x": BASE + (1 << 20), "weight": BASE + (2 << 20), "bias": BASE + (3 << 20)}

    def kw(at):
        return {k: t(shape, at[k], dt) for k, (shape, dt) in shapes.items()} | {"batch": b, "d": d, "L": L, "width": w}

    assert call(kw(ptrs))
    with pytest.raises(LaunchRefused, match="^x and out of conv1d_burnin_forward_nosave_tiled_f16: out is exactly x, "
                                            "which its kernel is not declared to run in place of"):
        call(kw({**ptrs, "x": BASE}))
    assert call(kw(ptrs))  # the refusal left nothing behind


# ---- in place only where it is one: an updated argument is no input's memory; an output is an input of its size

def _state_op(in_place: bool = True):
    """conv_tokens-like: an output (which may be exactly x where in_place), an input and a state updated in place
    (role inout)."""
    from runtime_fakes import params, symbol

    return symbol("state_op_f32", "state_op", "f32", params(
        {"name": "out", "type": "ptr", "dtype": "f32", "role": "out", "shape": ["n"],
         **({"in_place_of": "x"} if in_place else {})},
        {"name": "x", "type": "ptr", "dtype": "f32", "shape": ["n"]},
        {"name": "state", "type": "ptr", "dtype": "f32", "role": "inout", "shape": ["n"]},
        {"name": "n", "type": "i64", "value": "n"},
    ), ["ceil_div(n, 256)"], ["n"])


def _widen_op():
    """rmsnorm_f32in-like: a 16-bit output over 2n elements and an f32 input over n: the same bytes."""
    from runtime_fakes import params, symbol

    return symbol("widen_op_f16", "widen_op", "f16", params(
        {"name": "y", "type": "ptr", "dtype": "f16", "role": "out", "shape": ["2*n"]},
        {"name": "w", "type": "ptr", "dtype": "f32", "shape": ["n"]},
        {"name": "n", "type": "i64", "value": "n"},
    ), ["ceil_div(n, 256)"], ["n"])


@pytest.mark.parametrize("path", ["full", "memo"])
def test_a_state_updated_in_place_that_is_an_input_refused(path):
    c = contract(_state_op())
    call = c.bind if path == "full" else c.args
    ok = {"out": FakeCAI((N,), ptr=BASE), "x": FakeCAI((N,), ptr=BASE + (1 << 20)),
          "state": FakeCAI((N,), ptr=BASE + (2 << 20))}
    assert call(ok) and call(ok)  # separate memory binds (twice: the memo's hit too)
    with pytest.raises(LaunchRefused, match="state and x|x and state") as info:
        call({**ok, "state": FakeCAI((N,), ptr=BASE + (1 << 20))})
    assert "an argument updated in place is also an input" in str(info.value)
    assert call({**ok, "out": FakeCAI((N,), ptr=BASE + (1 << 20))})  # the output declaring x may be exactly x
    with pytest.raises(LaunchRefused, match="out is exactly state|state and out|out and state"):
        call({**ok, "out": FakeCAI((N,), ptr=BASE + (2 << 20))})  # never the state updated in place
    undeclared = contract(_state_op(in_place=False))
    call = undeclared.bind if path == "full" else undeclared.args
    assert call(ok)
    with pytest.raises(LaunchRefused, match="out is exactly x, which its kernel is not declared to run in place of"):
        call({**ok, "out": FakeCAI((N,), ptr=BASE + (1 << 20))})


def test_an_output_exactly_an_input_of_another_element_size_refused():
    with pytest.raises(LaunchRefused, match="an output is an input of another element size"):
        contract(_widen_op()).bind({"y": FakeCAI((2 * N,), "<f2", ptr=BASE), "w": FakeCAI((N,), ptr=BASE)})


@pytest.mark.parametrize("addr", [1, 0x100, 0xFFFF])
@pytest.mark.parametrize("path", ["full", "memo"])
def test_a_pointer_in_the_first_64k_is_a_freed_tensor(addr, path):
    c = contract(softplus())
    call = c.bind if path == "full" else c.args
    assert call({"y": FakeCAI((N,), ptr=BASE), "x": FakeCAI((N,), ptr=BASE + 4096)})
    with pytest.raises(LaunchRefused, match=f"x of softplus_forward_f32: its data pointer is {addr:#x}, in the first 64 KiB"):
        call({"y": FakeCAI((N,), ptr=BASE), "x": FakeCAI((N,), ptr=addr)})
    assert call({"y": FakeCAI((N,), ptr=BASE), "x": FakeCAI((N,), ptr=1 << 16)})  # the first address past it


@pytest.mark.parametrize("shape", [(-1,), (N, -2), (1.5,), ("4",)])
def test_an_exported_shape_that_is_not_counts_refused(shape):
    with pytest.raises(LaunchRefused, match="malformed __cuda_array_interface__ shape"):
        contract(softplus()).bind({"y": FakeCAI((N,), ptr=BASE), "x": FakeCAI(shape, ptr=BASE + 8192)})


@pytest.mark.parametrize("data", [None, (BASE,), ("0x7e00", False), [BASE, False]])
def test_an_interface_whose_data_is_not_address_and_flag_refused(data):
    x = FakeCAI((N,), ptr=BASE + 8192)
    x.__cuda_array_interface__["data"] = data
    with pytest.raises(LaunchRefused, match="'data' is not"):
        contract(softplus()).bind({"y": FakeCAI((N,), ptr=BASE), "x": x})


def test_a_negative_dlpack_extent_refused():
    from runtime_fakes import FakeDLPack

    with pytest.raises(LaunchRefused, match="malformed DLPack shape"):
        contract(softplus()).bind({"y": FakeCAI((N,), ptr=BASE), "x": FakeDLPack((-1,))})


def test_a_sparse_torch_tensor_refused_in_one_line():
    torch = pytest.importorskip("torch")
    from mamba_forge.runtime.tensors import describe

    sparse = torch.zeros(4, 4).to_sparse()
    with pytest.raises(LaunchRefused, match="x is a sparse_coo tensor; pass a dense strided one"):
        describe(sparse, "x")
