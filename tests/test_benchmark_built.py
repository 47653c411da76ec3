"""benchmarks/built.py on the CPU: modules a benchmark builds itself (real NVRTC builds of the tiny and the negative
fixture catalogs) served as runtime Kernels on a fake GPU backend, so every launch is the runtime's keyword launch
of the symbol's contract; a symbol the build rejected does not serve, and a module that does not compile stops."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from runtime_fakes import FakeTorchTensor as T
from runtime_support import FakeBackend, write_tiny_catalog

from mamba_forge.runtime import LaunchRefused, SymbolUnavailable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from built import built_kernels, bytes_moved, contract_kwargs  # noqa: E402  (benchmarks/built.py)

pytestmark = pytest.mark.usefixtures("fake_tensor_streams")  # tests/conftest.py
NEGATIVE = Path(__file__).resolve().parent / "fixtures" / "build_negative" / "catalog.toml"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    backend = FakeBackend()
    cat = write_tiny_catalog(tmp_path_factory.mktemp("built") / "cat")
    return built_kernels(("Tiny",), catalog=cat, backend=backend), backend


def test_built_symbols_launch_through_their_contract(tiny):
    kernels, backend = tiny
    assert {"scale_f32", "scale_bf16", "fast_copy_bf16"} <= set(kernels.admitted())
    y, x = T(1000, "bf16"), T(1000, "bf16")
    kernels.function("scale_bf16")(y=y, x=x, a=3.0)
    launch = backend.launches[-1]
    assert launch["fn"] == "scale_bf16" and launch["grid"] == (8, 1, 1) and launch["block"] == (128, 1, 1)
    assert launch["values"] == [("ptr", y.data_ptr()), ("ptr", x.data_ptr()), ("f32", 3.0), ("i64", 1000)]
    with pytest.raises(LaunchRefused, match="missing argument a"):
        kernels.function("scale_bf16")(y=y, x=x)  # the contract's checks hold for built symbols too


def test_contract_kwargs_are_the_contracts_at_the_dims(tiny):
    kernels, backend = tiny
    kern = kernels.function("scale_f32")
    kwargs = contract_kwargs(kern, {"n": 4096, "unused": 1}, lambda p, count: T(count, p.dtype))
    assert sorted(kwargs) == ["a", "n", "x", "y"]
    assert kwargs["a"] == 2.0 and kwargs["n"] == 4096 and kwargs["y"].numel() == 4096  # a: the qualified value
    assert bytes_moved(kern, kwargs) == 2 * 4096 * 4
    kern(**kwargs)
    assert backend.launches[-1]["grid"] == (32, 1, 1)


def test_rejected_symbols_do_not_serve_and_a_failed_compile_stops():
    heard = {}
    kernels = built_kernels(("Controls",), catalog=NEGATIVE, backend=FakeBackend(),
                            on_rejected=lambda name, reason: heard.setdefault(name, reason))
    assert "good" in kernels.admitted() and "register_hog" in heard and "register_hog" not in kernels.admitted()
    with pytest.raises(SymbolUnavailable):
        kernels.function("register_hog")
    with pytest.raises(SystemExit, match="Broken failed to compile"):
        built_kernels(("Broken",), catalog=NEGATIVE, backend=FakeBackend())
    with pytest.raises(SystemExit, match="no symbol selected"):  # an --only that matched nothing: not "build all"
        built_kernels(("Controls",), kernels=[], catalog=NEGATIVE, backend=FakeBackend())
