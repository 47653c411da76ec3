"""The engine-facing runtime on the CPU (real signatures and cubins from the tiny catalog, a fake GPU backend):
keyword launches through the loader (attribute access, fn(), bare families, tiles), every keyword refusal proven
to launch nothing, the load summary (one warning, summary() data, strict=True), stream defaults."""

from __future__ import annotations

import logging
import struct
import sys
import types
from types import SimpleNamespace

import pytest
from runtime_fakes import FakeCAI, FakeTorchTensor
from runtime_support import (
    REJECTED,
    TILED_TOML,
    FakeBackend,
    qualified_body,
    signed_tiny,
    write_with_runtime_table,
)

from mamba_forge.runtime import LaunchRefused, SymbolUnavailable, load, streams
from mamba_forge.runtime.errors import FamilyUnavailable, IncompleteOnDevice, TileRequired
from mamba_forge.runtime.families import BUILT_ONLY, CHECKED, NOT_HERE, tile_label
from mamba_forge.runtime.families import REJECTED as KIND_REJECTED

pytestmark = pytest.mark.usefixtures("fake_tensor_streams", "isolated_trust")  # tests/conftest.py

T = FakeTorchTensor
N = 1000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return signed_tiny(tmp_path_factory.mktemp("engine"), TILED_TOML)


def _signed(tiny, body: dict, name: str):
    p = tiny.build / name
    write_with_runtime_table(body, tiny.priv, p)
    return p


def _load(tiny, path=None, **kw):
    fake = FakeBackend()
    return load(path or tiny.manifest, trusted_keys=[tiny.pub], backend=fake, **kw), fake


# ---- keyword launches ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_keyword_launch_derives_n_and_the_grid(tiny, dtype):
    k, fake = _load(tiny)
    y, x = T(N, dtype), T(N, dtype)
    getattr(k.scale, dtype)(y=y, x=x, a=2.0)  # attribute access on family and dtype
    k.fn("scale", dtype)(y=y, x=x, a=0.5)
    assert len(fake.launches) == 2
    for rec, a in zip(fake.launches, (2.0, 0.5), strict=True):
        assert rec["fn"] == f"scale_{dtype}" and rec["grid"] == (8, 1, 1) and rec["block"] == (128, 1, 1)
        assert rec["values"] == [("ptr", y.data_ptr()), ("ptr", x.data_ptr()), ("f32", a), ("i64", N)]
        assert rec["raw"][3] == struct.pack("<q", N) and all(a % 16 == 0 for a in rec["aligns"])


def test_bare_family_call_and_dtype_choice(tiny):
    k, fake = _load(tiny)
    k.scale(y=T(N), x=T(N), a=1.0)  # the bare alias `scale` (f32)
    assert fake.launches[-1]["fn"] == "scale"
    with pytest.raises(SymbolUnavailable, match="slow_copy has no bare symbol and several variants; choose a dtype"):
        k.slow_copy(y=T(N, "bf16"), x=T(N, "bf16"))  # no bare alias and two dtypes: never guessed
    assert len(fake.launches) == 1


def test_tiles_are_never_picked_silently(tiny):
    k, fake = _load(tiny)
    assert k.tiled_copy.tiles("bf16") == ("w1", "w2")
    for ask in (lambda: k.tiled_copy.bf16, lambda: k.fn("tiled_copy", "bf16"), lambda: k.typed("tiled_copy").get("f16")):
        with pytest.raises(TileRequired, match=r"tiled_copy (bf16|f16) has 2 tiles; choose one with tile=.*: w1, w2") as e:
            ask()
        assert e.value.tiles == ("w1", "w2")
    with pytest.raises(SymbolUnavailable, match="tiled_copy bf16 has no tile 'w3' \\(has 'w1', 'w2'\\)"):
        k.fn("tiled_copy", "bf16", tile="w3")
    with pytest.raises(SymbolUnavailable, match="has several dtypes; name one: bf16, f16"):
        k.fn("tiled_copy")
    k.fn("tiled_copy", "bf16", tile="w2")(y=T(N, "bf16"), x=T(N, "bf16"))
    assert fake.launches[-1]["fn"] == "tiled_copy_w2_bf16" and fake.launches[-1]["grid"] == (4, 1, 1)
    k.fn("tiled_copy", "f16", tile="tiled_copy_w1_f16")(y=T(N, "f16"), x=T(N, "f16"))  # the full name is a tile too
    k.function("tiled_copy_w1_bf16")(y=T(N, "bf16"), x=T(N, "bf16"))
    assert [r["fn"] for r in fake.launches[-2:]] == ["tiled_copy_w1_f16", "tiled_copy_w1_bf16"]
    with pytest.raises(SymbolUnavailable, match="no bare symbol and several variants; choose a dtype: bf16, f16"):
        k.tiled_copy(y=T(N, "bf16"), x=T(N, "bf16"))
    assert len(fake.launches) == 3


def test_tile_labels_of_catalog_names():
    assert tile_label("gemm_bi_nn_tc16_bf16", "gemm_bi_nn_tc", "bf16") == "tc16"
    assert tile_label("gemm_bi_nn_tc64_f32out_f16", "gemm_bi_nn_tc_f32out", "f16") == "tc64"
    assert tile_label("gemm_bi_nn_tf32_v1_m128n64_bk32_s2", "gemm_bi_nn_tf32_v1", "") == "m128n64_bk32_s2"
    assert tile_label("softplus_forward", "softplus_forward", "f32") == ""  # the bare alias: the variant's tile
    assert tile_label("softplus_forward_f32", "softplus_forward", "f32") == ""


def test_unknown_family_and_dtype_attributes(tiny):
    k, _ = _load(tiny)
    assert not hasattr(k, "nope") and not hasattr(k.scale, "f64") and not hasattr(k, "_private")
    with pytest.raises(FamilyUnavailable, match="no family nope in the manifest"):
        k.nope  # noqa: B018
    with pytest.raises(SymbolUnavailable, match="family scale has no f64 variant"):
        k.fn("scale", "f64")


def _keyword_refusals(dtype: str):
    other = "f16" if dtype != "f16" else "bf16"
    ok = {"y": T(N, dtype), "x": T(N, dtype), "a": 1.0}
    yield {"x": T(N, dtype), "a": 1.0}, f"scale_{dtype}: missing argument y \\(a {dtype} tensor\\)"
    yield {k: v for k, v in ok.items() if k != "a"}, "missing argument a \\(a f32 scalar; qualified with 2\\)"
    yield {**ok, "bogus": 1}, "takes no argument bogus; it takes y, x, a, n"
    yield {**ok, "n": float(N)}, "n of scale_.* is a float .*pass an int"
    yield {**ok, "n": True}, "n of scale_.* is a bool"
    yield {**ok, "a": "1"}, "a of scale_.* is a str"
    yield {**ok, "a": 1e39}, "overflows the f32 parameter"
    yield {**ok, "n": 1 << 63}, "does not fit i64"
    yield {**ok, "x": T(N, other)}, f"x of scale_{dtype} is {other}; the parameter is {dtype}"
    yield {**ok, "x": T(N, dtype, device=("cpu", None))}, "lives in cpu memory"
    yield {**ok, "x": T(N, dtype, device=("cuda", 1))}, "is on device 1; the kernels are loaded on device 0"
    yield {**ok, "x": T(N, dtype, contiguous=False)}, "is not contiguous"
    yield {**ok, "y": T(N - 1, dtype)}, f"y of scale_{dtype} has {N - 1} elements; it needs at least {N}"
    yield {**ok, "n": N + 1}, f"has {N} elements; it needs at least {N + 1}"
    yield {**ok, "y": 0x7F0000001000}, "is an int address, which the keyword launch cannot check"
    yield {**ok, "y": FakeCAI([N], "<f4" if dtype == "f32" else "<f2", readonly=True)}, \
        "read-only but the kernel writes it" if dtype != "bf16" else "is f16; the parameter is bf16"
    yield {**ok, "n": -1}, "dim n = -1 .* is negative"
    yield {**ok, "n": 0}, "grid dimension 0 = 0 .* is outside 1..2147483647"


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_every_keyword_refusal_launches_nothing(tiny, dtype):
    k, fake = _load(tiny)
    f = k.fn("scale", dtype)
    cases = list(_keyword_refusals(dtype))
    for kwargs, match in cases:
        with pytest.raises(LaunchRefused, match=match):
            f(**kwargs)
    with pytest.raises(LaunchRefused, match="takes keyword arguments \\(y, x, a, n\\); for positional"):
        f(T(N, dtype), T(N, dtype), 1.0)
    with pytest.raises(LaunchRefused, match="is not a CUDA stream"):
        f(y=T(N, dtype), x=T(N, dtype), a=1.0, stream=object())
    assert fake.launches == [] and len(cases) >= 17
    f(y=T(N, dtype), x=T(N, dtype), a=1.0)  # and the kernel still launches after every refusal
    assert len(fake.launches) == 1


# ---- streams ---------------------------------------------------------------------------------------------------


def test_stream_defaults(tiny, monkeypatch):
    k, fake = _load(tiny)
    f = k.fn("scale", "f32")
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # other tests on a GPU machine import both
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    f(y=T(N), x=T(N), a=1.0)  # torch tensors but no torch module: the per-thread default stream
    f(y=FakeCAI([N]), x=FakeCAI([N]), a=1.0)  # CuPy-like, CuPy not imported: per-thread as well
    assert [r["stream"] for r in fake.launches] == [streams.CU_STREAM_PER_THREAD] * 2
    asked = []
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        current_stream=lambda dev: asked.append(dev) or types.SimpleNamespace(cuda_stream=0x7777)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    f(y=T(N), x=T(N), a=1.0)  # torch's current stream on the tensors' device
    f(y=T(N), x=T(N), a=1.0, stream=0)  # the legacy stream only when asked for
    f(y=T(N), x=T(N), a=1.0, stream=types.SimpleNamespace(cuda_stream=0x5150))
    assert [r["stream"] for r in fake.launches[2:]] == [0x7777, 0, 0x5150] and asked == [0]


# ---- the load summary ------------------------------------------------------------------------------------------


def _runtime_warnings(caplog):
    return [r for r in caplog.records if r.name == "mamba_forge.runtime" and r.levelno == logging.WARNING]


def test_summary_is_logged_once_and_returned_as_data(tiny, caplog):
    caplog.set_level(logging.WARNING, logger="mamba_forge.runtime")
    k, _ = _load(tiny)
    with pytest.warns(RuntimeWarning, match="using its fallback slow_copy_bf16"):
        k.function("fast_copy_bf16")
    k.function("fast_copy_bf16")
    k.load_all()
    logged = _runtime_warnings(caplog)
    assert len(logged) == 1
    text = logged[0].getMessage()
    for name in ("fast_copy_f16", "mid_copy_bf16", "mid_copy_f16", "slow_copy_f16"):
        assert REJECTED[name][1] in text
    assert "fallbacks in effect: fast_copy_bf16 -> slow_copy_bf16" in text
    s = k.summary()
    assert s is k.summary() and s.device == "NVIDIA H200"
    assert s.available["scale"] == ("f32", "bf16", "f16") and s.available["fast_copy"] == ("bf16",)
    assert s.available["slow_copy"] == ("bf16",) and s.available["tiled_copy"] == ("bf16", "f16")
    assert "mid_copy" not in s.available
    assert {(u.family, u.dtype): u.kind for u in s.unavailable} == {
        ("fast_copy", "f16"): KIND_REJECTED, ("mid_copy", "bf16"): KIND_REJECTED, ("mid_copy", "f16"): KIND_REJECTED,
        ("slow_copy", "f16"): KIND_REJECTED}
    mid = next(u for u in s.unavailable if u.label == "mid_copy bf16")
    assert mid.symbols == ("mid_copy_bf16",) and REJECTED["mid_copy_bf16"][1] in mid.reason
    assert s.fallbacks == {"fast_copy_bf16": "slow_copy_bf16"}


def test_strict_raises_and_activates_nothing(tiny, caplog):
    caplog.set_level(logging.WARNING, logger="mamba_forge.runtime")
    fake = FakeBackend()
    with pytest.raises(IncompleteOnDevice, match=r"\(strict\): 5 kernels do not serve on NVIDIA H200: .*mid_copy bf16 "
                                                 r"\(rejected: .*fast_copy_bf16 \(rejected; its fallback slow_copy_bf16") as e:
        load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake, strict=True)
    assert len(e.value.summary.unavailable) == 4
    assert fake.activated == [] and fake.loaded == [] and _runtime_warnings(caplog) == []


def test_nothing_unavailable_no_warning_and_strict_loads(tiny, caplog):
    caplog.set_level(logging.WARNING, logger="mamba_forge.runtime")
    p = _signed(tiny, qualified_body(tiny.bm, tiny.cat, rejected={}), "all.toml")
    k, fake = _load(tiny, p, strict=True)
    assert _runtime_warnings(caplog) == [] and fake.activated == [0]
    s = k.summary()
    assert s.unavailable == () and s.fallbacks == {} and s.strict_problems == []
    assert set(s.available) == {"scale", "fast_copy", "mid_copy", "slow_copy", "tiled_copy"}


def test_summary_kinds_checked_built_only_and_not_qualified_here(tiny, caplog):
    caplog.set_level(logging.WARNING, logger="mamba_forge.runtime")
    body = qualified_body(tiny.bm, tiny.cat, rejected={})
    status = {"mid_copy_bf16": "checked", "mid_copy_f16": "checked", "tiled_copy_w2_bf16": "built-only"}
    body["symbols"] = [dict(s, status=status.get(s["name"], s["status"])) for s in body["symbols"]]
    k, _ = _load(tiny, _signed(tiny, body, "kinds.toml"), strict=True)  # other GPUs' symbols: strict still loads
    kinds = {u.label: u.kind for u in k.summary().unavailable}
    assert kinds == {"mid_copy bf16": CHECKED, "mid_copy f16": CHECKED, "tiled_copy bf16 tile w2": BUILT_ONLY}
    assert k.summary().available["tiled_copy"] == ("bf16", "f16")  # w1 still serves
    text = _runtime_warnings(caplog)[0].getMessage()
    assert "checked-only (2 variants): mid_copy" in text and "built-only (1 variant" in text
    # admitted symbols whose artifact is only a check artifact: not qualified here, which strict refuses
    body2 = dict(body, artifacts=[dict(a, role="check") for a in body["artifacts"]])
    p2 = _signed(tiny, body2, "check-role.toml")
    k2, _ = _load(tiny, p2)
    assert {u.kind for u in k2.summary().unavailable} >= {NOT_HERE} and k2.summary().available == {}
    with pytest.raises(IncompleteOnDevice, match="scale f32 \\(not qualified here: its artifact is only for checking"):
        _load(tiny, p2, strict=True)


# ---- the torch op table (torch itself is needed only to register: tests/gpu/test_runtime_gpu.py) ---------------


def test_torch_op_table_names_catalog_kernels_and_refuses_what_it_cannot_serve():
    from runtime_fakes import catalog_records

    from mamba_forge.runtime import torch_ops
    from mamba_forge.runtime.families import index_families

    assert all(schema.startswith(f"{name}(") for name, schema in torch_ops.SCHEMAS.items())
    families = index_families(r for r, _ in catalog_records())
    for family, dtype in torch_ops.kernels_used():
        assert tuple(families[family][dtype]) == ("",), (family, dtype)  # one tile: nothing to choose
    assert torch_ops.rms_norm_kernel("f32", "bf16") == ("rmsnorm_forward_f32in", "bf16")
    assert torch_ops.rms_norm_shapes((2, 3, 8), (8,)) == (6, 8)
    for call, match in ((lambda: torch_ops.softplus_kernel("f64"), "x is f64; it takes f32, bf16, f16"),
                        (lambda: torch_ops.rms_norm_kernel("bf16", "bf16"), "no kernel for x bf16 -> bf16"),
                        (lambda: torch_ops.rms_norm_shapes((2, 8), (4,)), r"x \[2, 8\] and weight \[4\] do not fit"),
                        (lambda: torch_ops.rms_norm_shapes((), (4,)), "do not fit"),
                        (lambda: torch_ops.sequence_kernel("causal_conv1d", "f", "i32"), "activations are i32"),
                        (lambda: torch_ops.conv1d_shapes((2, 8), (8, 4), (8,)), "must be \\[batch, d, L\\]"),
                        (lambda: torch_ops.conv1d_shapes((2, 8, 9), (7, 4), (8,)), r"weight is \[7, 4\], expected \[8, 4\]"),
                        (lambda: torch_ops.conv1d_shapes((2, 8, 9), (8, 4), (7,)), r"bias is \[7\], expected \[8\]"),
                        *[(lambda bad=bad: torch_ops.scan_shapes(*bad), "expected") for bad in _bad_scan_shapes()],
                        (lambda: torch_ops.scan_shapes((2, 8), *SCAN_OK[1:]), "must be \\[batch, d_inner, L\\]")):
        with pytest.raises(LaunchRefused, match=match):
            call()
    assert torch_ops.conv1d_shapes((2, 8, 9), (8, 4), (8,)) == (2, 8, 9, 4)
    assert torch_ops.scan_shapes(*SCAN_OK) == (2, 8, 16, 9)


SCAN_OK = ((2, 8, 9), (2, 8, 9), (8, 16), (2, 16, 9), (2, 16, 9), (8,), (2, 8, 9), (8,))


def _bad_scan_shapes():
    """Each operand but u made wrong in turn (u fixes batch, d_inner and L; A_log d_state)."""
    for i in range(1, 8):
        shapes = list(SCAN_OK)
        shapes[i] = tuple(n + 1 for n in shapes[i]) if i != 2 else (9, 16)
        yield tuple(shapes)


def test_torch_ops_register_refuses_kernels_without_the_families():
    pytest.importorskip("torch")
    import mamba_forge.runtime.torch as mft

    def fn(family, dtype):
        raise SymbolUnavailable(family, f"no {family}")

    before = mft._state["kernels"]
    with pytest.raises(SymbolUnavailable, match="no softplus_forward"):
        mft.register(SimpleNamespace(fn=fn))
    assert mft._state["kernels"] is before  # refused before anything changed


def test_gemm_routes_skip_rejected_rungs_and_say_so(tiny, caplog):
    """The manifest's route table through the loader: a rejected rung (fast_copy_bf16 stands in for a skinny
    rung) is skipped in favour of its class's rung that serves every M, the summary and the one warning say
    which, and a force rung serves only by name."""
    caplog.set_level(logging.WARNING, logger="mamba_forge.runtime")
    body = dict(tiny.body)
    rungs = [{"symbol": "fast_copy_bf16", "eq_class": "k16", "m_min": 1, "m_max": 64},
             {"symbol": "slow_copy_bf16", "eq_class": "k16"},
             {"symbol": "scale_bf16", "eq_class": "", "mode": "force"}]
    body["routes"] = [{"layout": "nn", "a": "bf16", "b": "bf16", "c": "bf16",
                       "symbols": [r["symbol"] for r in rungs], "rungs": rungs}]
    k, _ = _load(tiny, _signed(tiny, body, "routes.toml"))
    assert {m: k.gemm_route(m, 64, 64, "bf16").symbol for m in (1, 64, 65)} == {
        1: "slow_copy_bf16", 64: "slow_copy_bf16", 65: "slow_copy_bf16"}
    assert k.gemm_route(1, 64, 64, "bf16", symbol="scale_bf16").symbol == "scale_bf16"
    with pytest.raises(LookupError, match="does not serve on this device"):
        k.gemm_route(1, 64, 64, "bf16", symbol="fast_copy_bf16")
    assert k.summary().skipped_rungs == {"nn bf16xbf16->bf16": ["fast_copy_bf16"]}
    text = _runtime_warnings(caplog)[0].getMessage()
    assert "GEMM route rungs skipped (the rest of their routes serve): nn bf16xbf16->bf16: fast_copy_bf16" in text


def test_a_launch_from_another_thread_makes_the_context_current_there_once(tiny):
    """torch's autograd engine runs backward on a thread of its own: a launch there must make the device's context
    current on that thread first (else the driver answers CUDA_ERROR_INVALID_CONTEXT), once per thread."""
    import threading

    k, fake = _load(tiny)
    y, x = T(N), T(N)
    k.scale(y=y, x=x, a=1.0)
    k.scale(y=y, x=x, a=1.0)
    before = len(fake.activated)

    def worker():
        k.scale(y=y, x=x, a=2.0)
        k.scale(y=y, x=x, a=3.0)

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert fake.activated[before:] == [0]  # one activation on the new thread, none for its second launch
    assert len(fake.launches) == 4
    k.scale(y=y, x=x, a=4.0)
    assert len(fake.activated) == before + 1  # the first thread stays current: nothing more
