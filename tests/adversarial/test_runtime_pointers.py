"""Keyword launches whose memory cannot be right are refused (LaunchRefused naming the arguments) before any
launch: a data pointer of 0, an output partially overlapping an input, outputs aliasing each other. Inputs may share
memory, and an output may be exactly its input (in place)."""

from __future__ import annotations

import pytest
from runtime_fakes import FakeCAI, softplus, two_outputs

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


# ---- in place only where it is one: an updated argument is no input's memory; an output is an input of its size

def _state_op():
    """conv_tokens-like: an output, an input and a state updated in place (role inout)."""
    from runtime_fakes import params, symbol

    return symbol("state_op_f32", "state_op", "f32", params(
        {"name": "out", "type": "ptr", "dtype": "f32", "role": "out", "shape": ["n"]},
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
    assert call({**ok, "out": FakeCAI((N,), ptr=BASE + (1 << 20))})  # the plain output may be exactly x (in place)


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
