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
