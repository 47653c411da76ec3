"""The launch path's memos (issue 25 item 4: host time per call), on the CPU with fake tensors: the contract's memo of
evaluated launches (runtime/contract.py Contract.args) gives exactly what the full check gives, for every catalog
contract at many random shapes; a changed shape, scalar, dtype, device or density never reuses a stale entry; the
per-call pointer checks (null, overlap) still refuse on a memo hit; the memo is bounded (least recently used out)."""

from __future__ import annotations

import random
import struct
import sys
import types

import pytest
from runtime_fakes import FakeTorchTensor as T
from runtime_fakes import catalog_records, gemm_wgmma, params, rmsnorm, softplus, ssm_step, symbol, two_outputs

from mamba_forge.core import expr
from mamba_forge.runtime import contract as rcontract
from mamba_forge.runtime import streams
from mamba_forge.runtime.contract import MEMO_ENTRIES, Contract
from mamba_forge.runtime.errors import LaunchRefused

pytestmark = pytest.mark.usefixtures("fake_tensor_streams")  # tests/conftest.py


def _same(got: tuple, want) -> None:
    """args()'s (values, grid, block, smem, owner) is the full check's Bound, value for value and type for type."""
    values, grid, block, smem, owner = got
    assert (grid, block, smem, owner) == (want.grid, want.block, want.shared_mem, want.owner)
    plain = [v for _, v in want.values]
    assert [type(v) for v in values] == [type(v) for v in plain]
    for (t, w), v in zip(want.values, values, strict=True):
        if isinstance(v, float):  # bit for bit: -0.0 is not 0.0 to the kernel
            assert struct.pack("<d", v) == struct.pack("<d", w), t
        else:
            assert v == w, t


def _outcome(fn, *args):
    try:
        return fn(*args)
    except LaunchRefused as exc:
        return exc


def _random_call(rec, qdims: dict, rng: random.Random):
    """Keyword arguments for a catalog contract at random dims (each 1..2x its qualification value, sometimes 0 or
    tiny), each dim-carrying scalar given or left to be derived, fresh fake tensors of the shapes' element counts."""
    dims = {d: rng.choice([max(1, q // 4), q, q, rng.randint(1, 2 * q), rng.randint(1, 2 * q), rng.randint(0, 3)])
            for d, q in qdims.items()}
    env = {**dims, **rec.constants}
    kw = {}
    for p in rec.params:
        if p.kind == "pointer":
            n = 1
            for s in p.shape:
                n *= max(0, expr.evaluate(s, env))
            kw[p.name] = T(n + rng.choice([0, 0, 0, 3]), p.dtype)  # at least the count: more is allowed
        elif p.kind == "blob":
            kw[p.name] = bytes(rng.randrange(256) for _ in range(p.size))
        elif p.value in dims:
            if rng.random() < 0.85:
                kw[p.name] = dims[p.value]
        elif p.value and expr.names(p.value):
            if rng.random() < 0.2:
                kw[p.name] = expr.evaluate(p.value, env)
        elif p.type in ("f32", "f64"):
            kw[p.name] = rng.choice([rng.uniform(-2, 2), -0.0, 0.0, 1e-5])
        else:
            kw[p.name] = rng.randint(0, 100)
    c = rcontract.contract(rec)
    kw.update({d: dims[d] for d in c.accepted if d not in c.names})
    return kw


def _fresh(kw: dict) -> dict:
    """The same call with new tensors (other addresses) of the same element counts and dtypes."""
    return {k: T(v.numel(), v.token) if isinstance(v, T) else v for k, v in kw.items()}


def test_the_memo_gives_what_the_full_check_gives_for_every_catalog_contract_at_random_shapes():
    rng = random.Random(25)
    hits = refusals = 0
    for rec, qdims in catalog_records():
        c = Contract(rec)
        for _ in range(6):
            kw = _random_call(rec, qdims, rng)
            for call in (kw, _fresh(kw), _fresh(kw)):  # a miss, then hits (when the full check passed)
                want = _outcome(c._bind, call, 0, None, "")
                before = len(c._memo)
                got = _outcome(c.args, call)
                if isinstance(want, LaunchRefused):
                    assert isinstance(got, LaunchRefused) and str(got) == str(want), rec.name
                    assert len(c._memo) == before  # a refused key is never remembered
                    refusals += 1
                else:
                    _same(got, want)
                    hits += before == len(c._memo)
                    b = c.bind(call)  # bind is args with the types
                    assert b.values == want.values and b.aligns == want.aligns and b.ordinal == want.ordinal
    assert hits > 2000 and refusals > 1000  # 2466 and 2154 with this seed


def test_a_changed_shape_or_scalar_never_reuses_an_entry():
    c = Contract(softplus())
    n0 = c.args({"y": T(1000), "x": T(1000)})
    assert n0[0][2] == 1000 and n0[1] == (1, 1, 1)
    big = c.args({"y": T(1 << 24), "x": T(1 << 24)})  # n from x's element count: another key
    assert big[0][2] == 1 << 24 and big[1] == (4096, 1, 1)
    assert c.args({"y": T(1 << 24), "x": T(1 << 24), "n": 5})[0][2] == 5  # n given: another key
    assert c.args({"y": T(1 << 24), "x": T(1 << 24), "n": 7})[0][2] == 7
    with pytest.raises(LaunchRefused, match="has 1000 elements; it needs at least 1001"):
        c.args({"y": T(1000), "x": T(1000), "n": 1001})
    with pytest.raises(LaunchRefused, match="has 999 elements"):  # y smaller than the remembered x: refused
        c.args({"y": T(999), "x": T(1000)})
    with pytest.raises(LaunchRefused, match="is a bool"):
        c.args({"y": T(1000), "x": T(1000), "n": True})  # True == 1: never a key
    # derived scalars: given or not, right or wrong
    s = Contract(ssm_step("bf16"))

    def step(batch, **extra):
        return {"out": T(batch * 256, "bf16"), "state": T(batch * 256 * 16), "u": T(batch * 256, "bf16"),
                "dt": T(batch * 256, "bf16"), "dt_bias": T(256), "A_log": T(256 * 16),
                "x_dbl": T(batch * 48, "bf16"), "Dp": T(256), "z": T(batch * 256, "bf16"), "batch": batch,
                "d_state": 16, "dt_rank": 16, **extra}

    for _ in range(2):
        assert s.args(step(3))[0][9:] == [3, 256, 16, 16, 48]
        assert s.args(step(3, x_dbl_stride=48))[0][-1] == 48
        with pytest.raises(LaunchRefused, match="x_dbl_stride of .* = 47 disagrees"):
            s.args(step(3, x_dbl_stride=47))
        assert s.args(step(5))[0][9] == 5
        with pytest.raises(LaunchRefused, match="d_state = 65"):
            s.args({**step(3), "d_state": 65, "A_log": T(256 * 65), "state": T(3 * 256 * 65),
                    "x_dbl": T(3 * 146, "bf16")})


def test_caller_scalars_are_read_every_call_and_floats_keep_their_bits():
    c = Contract(rmsnorm("bf16"))
    kw = {"y": T(4096, "bf16"), "rstd": T(4), "x": T(4096, "bf16"), "w": T(1024)}
    for eps in (1e-5, 1e-6, -0.0, 0.0, 3.4e38):
        assert struct.pack("<d", c.args({**kw, "eps": eps})[0][-1]) == struct.pack("<d", eps)
    with pytest.raises(LaunchRefused, match="overflows the f32 parameter"):
        c.args({**kw, "eps": 1e39})
    assert c.args({**kw, "eps": 1})[0][-1] == 1.0 and type(c.args({**kw, "eps": 1})[0][-1]) is float
    with pytest.raises(LaunchRefused, match="missing argument eps"):
        c.args(kw)
    with pytest.raises(LaunchRefused, match="takes no argument bogus"):
        c.args({**kw, "eps": 1e-5, "bogus": 1})
    for _ in range(2):
        assert c.args({**kw, "eps": 1e-5, "rows": 4})[0][4] == 4
    with pytest.raises(LaunchRefused, match="takes no argument bogus"):  # as many arguments as a remembered call
        c.args({**kw, "eps": 1e-5, "bogus": 4})


@pytest.mark.parametrize("bad,match", [
    ({"dtype": "f64"}, "is f64; the parameter is f32"),
    ({"device": ("cuda", 1)}, "is on device 1"),
    ({"device": ("cpu", None)}, "lives in cpu memory"),
    ({"contiguous": False}, "not contiguous"),
])
def test_a_changed_dtype_device_or_density_is_refused_after_a_hit(bad, match):
    c = Contract(softplus())
    for _ in range(2):
        c.args({"y": T(1000), "x": T(1000)})
    kw = {"dtype": "f32", **bad}
    with pytest.raises(LaunchRefused, match=match):
        c.args({"y": T(1000), "x": T(1000, kw.pop("dtype"), **kw)})


def test_blobs_are_read_every_call_and_checked():
    c = Contract(gemm_wgmma("bf16"))
    M, N, K = 64, 128, 256

    def kw(ta):
        return {"tmA": ta, "tmB": bytes(128), "C": T(M * N, "bf16"), "A": T(M * K, "bf16"), "B": T(K * N, "bf16"),
                "M": M, "N": N, "K": K}

    for fill in range(3):
        ta = bytes([fill]) * 128
        assert c.args(kw(ta))[0][0] is ta
    with pytest.raises(LaunchRefused, match="is 127 bytes"):
        c.args(kw(bytes(127)))
    assert c.args(kw(bytearray(128)))[0][0] == bytes(128)  # not bytes: the full check, every call


# ---- the per-call pointer checks on a memo hit ------------------------------------------------------------------


BASE = 0x7E00_0000_0000


def test_null_and_overlap_are_refused_on_a_memo_hit():
    c = Contract(softplus())
    for _ in range(2):
        c.args({"y": T(1024), "x": T(1024)})
    key_count = len(c._memo)
    for which in ("y", "x"):
        kw = {"y": T(1024, ptr=BASE), "x": T(1024, ptr=BASE + (1 << 20))}
        kw[which] = T(1024, ptr=0)
        with pytest.raises(LaunchRefused, match=f"{which} of softplus_forward_f32: its data pointer is 0"):
            c.args(kw)
    for y_at, x_at in ((BASE, BASE + 4), (BASE + 4092, BASE), (BASE + 1, BASE)):
        with pytest.raises(LaunchRefused, match="partially overlaps"):
            c.args({"y": T(1024, ptr=y_at), "x": T(1024, ptr=x_at)})
    assert c.args({"y": T(1024, ptr=BASE), "x": T(1024, ptr=BASE)})[0][:2] == [BASE, BASE]  # in place (declared)
    assert c.args({"y": T(1024, ptr=BASE), "x": T(1024, ptr=BASE + 4096)})  # adjacent
    assert len(c._memo) == key_count  # every call above was a hit
    two = Contract(two_outputs())
    far = BASE + (1 << 30)
    assert two.args({"a": T(1024, ptr=BASE), "b": T(1024, ptr=BASE + 4096), "x": T(1024, ptr=far)})
    for b_at in (BASE, BASE + 4, BASE + 4092):
        with pytest.raises(LaunchRefused, match="outputs alias each other"):
            two.args({"a": T(1024, ptr=BASE), "b": T(1024, ptr=b_at), "x": T(1024, ptr=far)})
    assert len(two._memo) == 1
    undeclared = Contract(softplus(in_place=False))  # softplus whose y does not declare x: no exact alias on a hit
    for _ in range(2):
        undeclared.args({"y": T(1024), "x": T(1024)})
    with pytest.raises(LaunchRefused, match="y is exactly x, which its kernel is not declared to run in place of"):
        undeclared.args({"y": T(1024, ptr=BASE), "x": T(1024, ptr=BASE)})
    assert len(undeclared._memo) == 1


@pytest.mark.parametrize("in_place", [True, False])
def test_the_pointer_checks_on_a_hit_decide_as_the_full_check_for_random_layouts(in_place):
    """Addresses packed close together (so outputs and inputs meet, coincide or touch), empty tensors, the odd null
    pointer, with and without a parameter that may be None: on a memo hit (the quick check, then the full sweep where
    it doubts) every call is refused or passed as the full check refuses or passes it, with the same message. With
    and without the output a declaring the input x (in_place_of): a exactly x binds only where declared, a exactly y
    never."""
    rec = symbol("mix_f32", "mix", "f32", params(
        {"name": "a", "type": "ptr", "dtype": "f32", "role": "out", "shape": ["n"],
         **({"in_place_of": "x"} if in_place else {})},
        {"name": "b", "type": "ptr", "dtype": "f32", "role": "inout", "shape": ["m"]},
        {"name": "x", "type": "ptr", "dtype": "f32", "shape": ["n"]},
        {"name": "y", "type": "ptr", "dtype": "f32", "shape": ["m"]},
        {"name": "n", "type": "i64", "value": "n"},
        {"name": "m", "type": "i64", "value": "m"},
    ), ["1"], ["n", "m"])
    c = Contract(rec)
    rng = random.Random(7)
    outcomes = set()
    for _ in range(4000):
        n, m = rng.choice([0, 1, 2, 5]), rng.choice([0, 1, 3])
        kw = {name: T(size, ptr=0 if rng.random() < 0.02 else BASE + 4 * rng.randrange(12))
              for name, size in (("a", n), ("b", m), ("x", n), ("y", m))}
        null = rng.choice(["", "y"])  # y may be None (address 0), as a GEMM's bias
        if null and rng.random() < 0.5:
            kw["y"] = None
        want = _outcome(c._bind, {**kw, "n": n, "m": m}, 0, None, null)
        got = _outcome(c.args, {**kw, "n": n, "m": m}, 0, None, null)
        if isinstance(want, LaunchRefused):
            assert isinstance(got, LaunchRefused) and str(got) == str(want)
            outcomes.add(str(want).split(" (")[0].split(": ")[-1])
        else:
            _same(got, want)
            outcomes.add("bound" if not (n and kw["a"].data_ptr() == kw["x"].data_ptr()) else "bound in place")
    exact = {"bound in place", "a is exactly y; its kernel runs in place of x only"} if in_place else {
        "a is exactly x, which its kernel is not declared to run in place of",
        "a is exactly y, which its kernel is not declared to run in place of"}
    assert len(c._memo) == 36 and outcomes == {
        "bound", "its data pointer is 0", "outputs alias each other", "an output partially overlaps an input",
        "an argument updated in place is also an input"} | exact


def test_the_null_pointer_parameter_on_a_memo_hit():
    rec = symbol("g_f32", "g", "f32", params(
        {"name": "C", "type": "ptr", "dtype": "f32", "role": "out", "shape": ["n"]},
        {"name": "bias", "type": "ptr", "dtype": "f32", "shape": ["n"]},
        {"name": "n", "type": "i64", "value": "n"},
    ), ["ceil_div(n, 256)"], ["n"])
    c = Contract(rec)
    for _ in range(2):
        assert c.args({"C": T(64), "bias": None, "n": 64}, null="bias")[0][1] == 0
    with pytest.raises(LaunchRefused, match="bias"):  # None where no null pointer is allowed
        c.args({"C": T(64), "bias": None, "n": 64})
    with pytest.raises(LaunchRefused, match="C of g_f32: its data pointer is 0"):
        c.args({"C": T(64, ptr=0), "bias": None, "n": 64}, null="bias")
    bias = T(64)
    assert c.args({"C": T(64), "bias": bias, "n": 64}, null="bias")[0][1] == bias.data_ptr()


# ---- bounded ------------------------------------------------------------------------------------------------------


def test_the_memo_is_bounded_and_keeps_what_is_used():
    c = Contract(softplus())
    hot = {"y": T(7), "x": T(7)}
    c.args(hot)
    hot_key = next(iter(c._memo))
    for n in range(8, 8 + 5 * MEMO_ENTRIES):  # hostile shape churn
        c.args({"y": T(n), "x": T(n)})
        assert len(c._memo) <= MEMO_ENTRIES
        if n % 16 == 0:
            c.args(hot)  # used now and then: never the least recently used
    assert len(c._memo) == MEMO_ENTRIES and hot_key in c._memo
    assert (0, "", 2, 8, 8, rcontract._MISSING) not in c._memo  # the first churned keys went first


# ---- torch's current stream: its reader decided once, the stream read every call ------------------------------


def _torch_module(handles: dict, *, initialized: bool = True):
    """A stand-in for a CUDA build of torch: torch.cuda.current_stream (torch's own, by module and name) and
    torch._C._cuda_getCurrentRawStream, both reading `handles` (device -> the current stream's raw handle)."""
    asked = []

    def current_stream(device=None):
        asked.append(("current_stream", device))
        return types.SimpleNamespace(cuda_stream=handles[device])

    current_stream.__module__ = "torch.cuda"

    def raw(device):
        asked.append(("raw", device))
        return handles[device]

    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(current_stream=current_stream,
                                                             is_initialized=lambda: initialized),
                                  _C=types.SimpleNamespace(_cuda_getCurrentRawStream=raw))
    return torch, asked


def test_torch_current_stream_is_read_every_call(monkeypatch):
    handles = {0: 0x1000, 1: 0x2000}
    torch, asked = _torch_module(handles)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(streams, "_torch_reader", (None, None, None))
    assert streams.default_stream("torch", 0) == 0x1000
    handles[0] = 0x1234  # torch.cuda.stream(s): the current stream changed between launches
    assert streams.default_stream("torch", 0) == 0x1234 and streams.default_stream("torch", 1) == 0x2000
    handles[0] = 0  # the legacy default stream, when torch's current one is it
    assert streams.resolve_stream(None, "torch", 0) == 0
    assert asked == [("raw", 0), ("raw", 0), ("raw", 1), ("raw", 0)]  # no Stream objects made
    assert streams.default_stream("cupy", 0) == streams.default_stream("", 0) == streams.CU_STREAM_PER_THREAD
    # a current_stream replaced by someone (a test, a profiler) is asked, not the raw reader
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=0x77))
    assert streams.default_stream("torch", 0) == 0x77
    # another torch module (reloaded): its own reader
    other, other_asked = _torch_module({0: 0x99})
    monkeypatch.setitem(sys.modules, "torch", other)
    assert streams.default_stream("torch", 0) == 0x99 and other_asked == [("raw", 0)]
    handles[0] = -1
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(torch.cuda, "current_stream", _torch_module(handles)[0].cuda.current_stream)
    with pytest.raises(LaunchRefused, match="not a 64-bit CUstream handle"):
        streams.default_stream("torch", 0)


def test_torch_without_cuda_initialised_or_without_the_raw_reader_asks_current_stream(monkeypatch):
    monkeypatch.setattr(streams, "_torch_reader", (None, None, None))
    torch, asked = _torch_module({0: 0x10}, initialized=False)
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert streams.default_stream("torch", 0) == 0x10 and asked == [("current_stream", 0)]
    del torch._C._cuda_getCurrentRawStream
    torch.cuda.is_initialized = lambda: True
    assert streams.default_stream("torch", 0) == 0x10 and asked[-1] == ("current_stream", 0)


# ---- the driver launch: what reaches cuLaunchKernel, and its failure named --------------------------------------


def test_launcher_passes_the_dims_and_names_a_failure(monkeypatch):
    from mamba_forge.gpu import core, launcher
    from mamba_forge.gpu import driver as cu

    real = core.bindings()
    calls, result = [], [(real.CUresult.CUDA_SUCCESS,)]
    drv = types.ModuleType("cuda.bindings.driver")  # the real module's names, a recording cuLaunchKernel
    drv.__dict__.update(real.__dict__)
    drv.cuLaunchKernel = lambda *args: calls.append(args) or result[0]
    monkeypatch.setattr(launcher, "bindings", lambda: drv)
    monkeypatch.setattr(core, "bindings", lambda: drv)
    fn = types.SimpleNamespace(name="k_f32", handle="H")
    params = cu.PackedParams([("i32", 1)])
    stream = cu.Stream.wrap(0x77)
    launcher.launch(fn, (3, 2, 1), (128, 1, 1), params, smem=64, stream=stream)
    launcher.launch(fn, [5], (32, 4), params)  # lists and fewer dims: padded with 1
    assert calls[0] == ("H", 3, 2, 1, 128, 1, 1, 64, stream.handle, params.address, 0)
    assert calls[1][1:8] == (5, 1, 1, 32, 4, 1, 0) and int(calls[1][8]) == 0  # no stream: the legacy stream
    with pytest.raises(ValueError, match="grid must have 1 to 3 dimensions"):
        launcher.launch(fn, (1, 1, 1, 1), (1,), params)
    result[0] = (real.CUresult.CUDA_ERROR_INVALID_VALUE,)
    with pytest.raises(cu.CudaError, match=r"cuLaunchKernel\(k_f32\) failed with CUDA_ERROR_INVALID_VALUE"):
        launcher.launch(fn, (1, 1, 1), (1, 1, 1), params)
    result[0] = real.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES  # not a tuple: check() reads it as the result
    with pytest.raises(cu.CudaError, match="CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"):
        launcher.launch(fn, (1, 1, 1), (1, 1, 1), params)


# ---- kernels.gemm's memo of calls (runtime/gemm.py) ---------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from runtime_support import GEMM_TOML, signed_tiny
    from test_runtime_gemm import _routes

    return signed_tiny(tmp_path_factory.mktemp("host-gemm"), GEMM_TOML, _routes())


@pytest.fixture
def gemm_env(tiny, tmp_path, monkeypatch):
    """A loader on a fake GPU, cuTensorMapEncodeTiled's stand-in (tests/test_runtime_gemm.py's) and torch's current
    stream from a stand-in CUDA build; returns (load() -> (Kernels, FakeBackend), the stream handles)."""
    from runtime_support import FakeBackend

    from mamba_forge.gpu import tma
    from mamba_forge.runtime import gemm as rgemm
    from mamba_forge.runtime import load

    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))

    def encode(ptr, rows, cols, element_bytes, dtype, box, swizzle, l2, name, row_stride=None):
        return struct.pack("<QQQQQQ", ptr, rows, cols, box[0], box[1], row_stride or 0).ljust(tma.TMA_DESC_BYTES,
                                                                                                b"\0")

    monkeypatch.setattr(tma, "_encode_tiled", encode)
    monkeypatch.setattr(rgemm, "_MAPS", {})
    handles = {0: 0x5150}
    monkeypatch.setitem(sys.modules, "torch", _torch_module(handles)[0])
    monkeypatch.setattr(streams, "_torch_reader", (None, None, None))

    def loaded():
        fake = FakeBackend()
        return load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake), fake

    return loaded, handles


def _gemm_call(rng: random.Random):
    """(A, B, kwargs) of a random routed call: nn bf16 (TMA rungs, M picks m64n32 or m64n64), nn or tn f32 with or
    without a bias, nt bf16 with a bias rung; out given or allocated."""
    layout, dt = rng.choice([("nn", "bf16"), ("nn", "bf16"), ("nn", "f32"), ("tn", "f32"), ("nt", "bf16")])
    M, N, K = rng.choice([1, 2, 16, 17, 64, 300]), 8 * rng.randint(1, 64), 8 * rng.randint(1, 64)
    a = (M, K) if layout != "tn" else (K, M)
    b = (K, N) if layout != "nt" else (N, K)
    kw = {"layout": layout}
    if rng.random() < 0.7:
        kw["out"] = T.matrix(M, N, dtype=dt)
    if layout != "nn" or dt == "f32":
        if rng.random() < 0.5:
            kw["bias"] = T.matrix(N, dtype=dt)
    return T.matrix(*a, dtype=dt), T.matrix(*b, dtype=dt), kw


def _fresh_gemm(A, B, kw):
    """The same call with new tensors (other addresses) of the same shapes and dtypes."""
    def new(t):
        return T.matrix(*t.shape, dtype=t.token) if isinstance(t, T) else t
    return new(A), new(B), {k: new(v) for k, v in kw.items()}


def _launched(k, rec: dict, out) -> dict:
    """A FakeBackend launch record with C's address checked against `out` and left out (out=None: each call
    allocates its own)."""
    names = [p.name for p in k.symbol(rec["fn"]).params]
    values = dict(zip(names, rec["values"], strict=True))
    assert values.pop("C") == ("ptr", out.data_ptr())
    return {**{n: v for n, v in rec.items() if n not in ("raw", "values", "aligns")}, "values": values}


def test_the_gemm_memo_launches_what_every_step_launches_at_random_shapes(gemm_env, monkeypatch):
    from mamba_forge.runtime import gemm as rgemm

    loaded, _ = gemm_env
    k, fake = loaded()
    plain, plain_fake = loaded()
    plain._gemm_calls = None  # no memo: every step, every call
    routed = []
    real_rung = rgemm._rung
    monkeypatch.setattr(rgemm, "_rung", lambda kernels, key: routed.append(key) or real_rung(kernels, key))
    rng = random.Random(4)
    hits = 0
    for _ in range(150):
        call = _gemm_call(rng)
        for A, B, kw in (call, _fresh_gemm(*call), _fresh_gemm(*call)):
            before = (len(k._gemm_calls), len(routed))
            outs = [k.gemm(A, B, **kw), plain.gemm(A, B, **kw)]
            hits += (len(k._gemm_calls), len(routed)) == (before[0], before[1] + 1)  # plain routed, the memo not
            assert _launched(k, fake.launches[-1], outs[0]) == _launched(plain, plain_fake.launches[-1], outs[1])
            if "out" in kw:
                assert outs[0] is outs[1] is kw["out"]
            else:
                assert outs[0].shape == outs[1].shape and outs[0].token == outs[1].token
    assert hits >= 250 and len(fake.launches) == 450


def test_a_changed_gemm_never_reuses_an_entry(gemm_env):
    loaded, handles = gemm_env
    k, fake = loaded()

    def fn():
        return fake.launches[-1]["fn"]

    A, B, C = T.matrix(16, 64, dtype="bf16"), T.matrix(64, 128, dtype="bf16"), T.matrix(16, 128, dtype="bf16")
    for _ in range(2):
        k.gemm(A, B, C)
        assert fn() == "gemm_bi_nn_sm90a_wgmma_skinny_m64n32_bf16"
    k.gemm(T.matrix(17, 64, dtype="bf16"), B, T.matrix(17, 128, dtype="bf16"))  # M > 16: the other rung
    assert fn() == "gemm_bi_nn_sm90a_wgmma_skinny_m64n64_bf16"
    k.gemm(T.matrix(16, 64), T.matrix(64, 128), T.matrix(16, 128))  # f32: another route
    assert fn() == "tiny_gemm_f32"
    with pytest.raises(LaunchRefused, match="this product is 16 x 128"):
        k.gemm(A, B, T.matrix(16, 127, dtype="bf16"))
    with pytest.raises(LaunchRefused, match="A is bf16 and B is f32"):
        k.gemm(A, T.matrix(64, 128), C)
    bias = T.matrix(128, dtype="bf16")
    k.gemm(A, B, C, bias=bias)  # bias: another class (here the exact-f32 rung on torch's f32 copies)
    assert fn() == "tiny_gemm_f32" and A.ops == [("float",)] and C.ops[-1][0] == "copy_"
    k.gemm(A, B, C, bias=bias)  # casts are never remembered: every step again
    assert A.ops == [("float",)] * 2 and fn() == "tiny_gemm_f32"
    with pytest.raises(LaunchRefused, match="is on device 1"):
        k.gemm(A, B, T.matrix(16, 128, dtype="bf16", device=("cuda", 1)))
    with pytest.raises(LaunchRefused, match="not contiguous"):
        k.gemm(T.matrix(16, 64, dtype="bf16", contiguous=False), B, C)
    with pytest.raises(LaunchRefused, match="not a GEMM layout"):
        k.gemm(A, B, C, layout="NN")
    # streams: torch's current one read every call, an explicit one taken as given
    k.gemm(A, B, C)
    handles[0] = 0x6000
    k.gemm(A, B, C)
    k.gemm(A, B, C, stream=0x7000)
    assert [r["stream"] for r in fake.launches[-3:]] == [0x5150, 0x6000, 0x7000]
    v = [r["values"] for r in fake.launches[-3:]]
    assert v[0] == v[1] == v[2]


def test_gemm_overlap_and_null_are_refused_on_a_memo_hit(gemm_env):
    loaded, _ = gemm_env
    k, fake = loaded()
    A, B, C = T.matrix(4, 64), T.matrix(64, 128), T.matrix(4, 128)
    bias = T.matrix(128)
    for _ in range(2):
        k.gemm(A, B, C, bias=bias)
    entries, launched = len(k._gemm_calls), len(fake.launches)
    for what, src in (("A", A), ("B", B), ("bias", bias)):
        for off in (0, -4, src.numel() * 4 - 4):
            out = T.matrix(4, 128, ptr=src.data_ptr() + off)
            with pytest.raises(LaunchRefused, match=f"out overlaps {what}"):
                k.gemm(A, B, out, bias=bias)
    k.gemm(A, B, T.matrix(4, 128, ptr=A.data_ptr() + A.numel() * 4), bias=bias)  # adjacent: fine
    with pytest.raises(LaunchRefused, match="C of tiny_gemm_f32: its data pointer is 0"):
        k.gemm(A, B, T.matrix(4, 128, ptr=0), bias=bias)
    with pytest.raises(LaunchRefused, match="A of tiny_gemm_f32: its data pointer is 0"):
        k.gemm(T.matrix(4, 64, ptr=0), B, C, bias=bias)
    assert len(k._gemm_calls) == entries and len(fake.launches) == launched + 1


def test_the_gemm_memo_is_bounded(gemm_env, monkeypatch):
    from mamba_forge.runtime import gemm as rgemm

    monkeypatch.setattr(rgemm, "CALL_ENTRIES", 16)
    loaded, _ = gemm_env
    k, _ = loaded()
    hot = (T.matrix(1, 8), T.matrix(8, 8), T.matrix(1, 8))
    k.gemm(*hot)
    for n in range(2, 200):  # shape churn
        k.gemm(T.matrix(n, 8), T.matrix(8, 8), T.matrix(n, 8))
        assert len(k._gemm_calls) <= 16
        k.gemm(*hot)
    assert len(k._gemm_calls) == 16 and next(reversed(k._gemm_calls))[4] == (1, 8)  # the hot call stays


# ---- the torch ops' eager shape rules (runtime/torch.py _shapes) -------------------------------------------------


def test_the_ops_shape_rules_are_remembered_bounded_and_never_a_refusal(monkeypatch):
    torch = pytest.importorskip("torch")
    import mamba_forge.runtime.torch as mft
    from mamba_forge.runtime.torch_ops import conv_tokens_shapes, gemm_shape

    monkeypatch.setattr(mft, "_shape_memo", type(mft._shape_memo)())
    calls = []

    def rule(*shapes):
        calls.append(shapes)
        return conv_tokens_shapes(*shapes)

    ok = (torch.Size([2, 5, 16]), torch.Size([8, 4]), torch.Size([8]), torch.Size([2, 8, 3]))
    for _ in range(3):
        assert mft._shapes(rule, *ok) == (2, 8, 5, 4)
    assert len(calls) == 1
    bad = (torch.Size([2, 5, 16]), torch.Size([8, 4]), torch.Size([7]), torch.Size([2, 8, 3]))
    for _ in range(2):
        with pytest.raises(LaunchRefused, match="conv_tokens"):
            mft._shapes(rule, *bad)
    assert len(calls) == 3 and len(mft._shape_memo) == 1  # a refusal is asked again, never remembered
    assert mft._shapes(gemm_shape, "nt", torch.Size([3, 40]), torch.Size([24, 40])) == (3, 24)
    assert mft._shapes(gemm_shape, "nn", torch.Size([3, 40]), torch.Size([40, 24])) == (3, 24)  # the layout keys
    with pytest.raises(LaunchRefused, match="K differs"):
        mft._shapes(gemm_shape, "nt", torch.Size([3, 40]), torch.Size([40, 24]))
    assert mft._shapes(rule, [2, 5, 16], [8, 4], [8], [2, 8, 3]) == (2, 8, 5, 4)  # unhashable: asked every time
    assert mft._shapes(rule, [2, 5, 16], [8, 4], [8], [2, 8, 3]) == (2, 8, 5, 4) and len(calls) == 5
    for m in range(1, 3 * mft.SHAPE_ENTRIES):  # shape churn
        assert mft._shapes(gemm_shape, "nn", torch.Size([m, 40]), torch.Size([40, 24])) == (m, 24)
        assert len(mft._shape_memo) <= mft.SHAPE_ENTRIES
        mft._shapes(rule, *ok)  # used every call: never the least recently used
    assert (rule, *ok) in mft._shape_memo and len(calls) == 5
