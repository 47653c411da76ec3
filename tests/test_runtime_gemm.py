"""Kernels.gemm (mamba_forge/runtime/gemm.py) on the CPU: real signatures and cubins from the tiny catalog's GEMM
rungs, a fake GPU backend, fake torch tensors, and cuTensorMapEncodeTiled replaced by a recorder. Proves the
route's rung is the one launched, with M, N, K from the shapes, a null bias when there is none, the tensor maps
its family qualified with, casts for an exact-f32 fallback; that every bad argument (generated below) is refused
with nothing launched; and that the map-rule table is the catalog's own (every routed TMA family)."""

from __future__ import annotations

import itertools
import struct
import sys
from types import SimpleNamespace

import pytest
from runtime_fakes import FakeCAI
from runtime_fakes import FakeTorchTensor as T
from runtime_support import GEMM_TOML, FakeBackend, signed_tiny

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.core import codec
from mamba_forge.core.schema import QSymbol, SchemaError
from mamba_forge.gpu import tma
from mamba_forge.qualify.contract import tensor_map_hook
from mamba_forge.runtime import LaunchRefused, load
from mamba_forge.runtime import gemm as rgemm

pytestmark = pytest.mark.usefixtures("fake_tensor_streams", "isolated_trust")  # tests/conftest.py

SKINNY = "gemm_bi_nn_sm90a_wgmma_skinny"


@pytest.fixture(autouse=True)
def _fake_torch_stream(request, monkeypatch):
    """The fake tensors say they are torch's, so a launch asks sys.modules["torch"] for the current stream: a stand-in
    answers (a CPU build of torch, imported by another test, has no CUDA streams). The op test keeps the real one."""
    if "torch_op_registers" not in request.node.name:
        fake = SimpleNamespace(cuda=SimpleNamespace(current_stream=lambda dev: SimpleNamespace(cuda_stream=0)))
        monkeypatch.setitem(sys.modules, "torch", fake)


@pytest.fixture(autouse=True)
def fake_encode(monkeypatch):
    """cuTensorMapEncodeTiled's stand-in: the 128 bytes spell (address, rows, cols, box columns, box rows, row
    stride: 0 for a dense matrix)."""
    calls = []

    def encode(ptr, rows, cols, element_bytes, dtype, box, swizzle, l2, name, row_stride=None):
        calls.append((name, ptr, rows, cols, box, row_stride))
        return struct.pack("<QQQQQQ", ptr, rows, cols, box[0], box[1], row_stride or 0).ljust(tma.TMA_DESC_BYTES,
                                                                                                b"\0")

    monkeypatch.setattr(tma, "_encode_tiled", encode)
    monkeypatch.setattr(rgemm, "_MAPS", {})
    return calls


def _routes():
    bf16 = [{"symbol": f"{SKINNY}_m64n32_bf16", "eq_class": "k16", "m_min": 1, "m_max": 16, "needs": {"n": 8, "k": 8}},
            {"symbol": f"{SKINNY}_m64n64_bf16", "eq_class": "k16", "needs": {"n": 8, "k": 8}},
            {"symbol": "tiny_tma_unmapped_bf16", "eq_class": "", "mode": "force"}]
    f32 = [{"symbol": "tiny_gemm_f32", "eq_class": "chain", "bias": True}]
    bf16_f32out = [{"symbol": "tiny_gemm_bf16", "eq_class": "t", "bias": True}]
    # tuned (kernels/route_tuning.toml): at N 512, K 128 the m64n64 rung serves M <= 16 too, in m64n32's place
    tuning = [{"eq_class": "k16", "symbol": f"{SKINNY}_m64n64_bf16", "n_min": 512, "n_max": 512, "k_min": 128,
               "k_max": 128, "m_min": 1, "m_max": 16}]
    return [{"layout": "nn", "a": "bf16", "b": "bf16", "c": "bf16", "symbols": [r["symbol"] for r in bf16],
             "rungs": bf16, "tuning": tuning},
            {"layout": "nn", "a": "f32", "b": "f32", "c": "f32", "symbols": ["tiny_gemm_f32"], "rungs": f32},
            {"layout": "tn", "a": "f32", "b": "f32", "c": "f32", "symbols": ["tiny_gemm_f32"], "rungs": f32},
            {"layout": "nt", "a": "bf16", "b": "bf16", "c": "bf16", "symbols": ["tiny_gemm_bf16"],
             "rungs": bf16_f32out}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return signed_tiny(tmp_path_factory.mktemp("gemm"), GEMM_TOML, _routes())


def _load(tiny):
    fake = FakeBackend()
    return load(tiny.manifest, trusted_keys=[tiny.pub], backend=fake), fake


def _by_name(k, rec) -> dict:
    names = [p.name for p in k.symbol(rec["fn"]).params]
    return dict(zip(names, rec["values"], strict=True))


# ---- what launches ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("M,want", [(1, "m64n32"), (16, "m64n32"), (17, "m64n64"), (1000, "m64n64")])
def test_the_route_picks_the_rung_and_its_family_builds_the_maps(tiny, fake_encode, M, want):
    k, fake = _load(tiny)
    A, B, C = T.matrix(M, 128, dtype="bf16"), T.matrix(128, 256, dtype="bf16"), T.matrix(M, 256, dtype="bf16")
    assert k.gemm(A, B, C) is C
    (rec,) = fake.launches
    assert rec["fn"] == f"{SKINNY}_{want}_bf16"
    v = _by_name(k, rec)
    assert (v["M"], v["N"], v["K"]) == (("i32", M), ("i32", 256), ("i32", 128))
    assert v["C"] == ("ptr", C.data_ptr()) and v["A"] == ("ptr", A.data_ptr()) and v["B"] == ("ptr", B.data_ptr())
    # the maps are exactly what the family's qualify hook builds for these addresses and this shape
    bn = 32 if want == "m64n32" else 64
    hook = tma.prepare_gemm_nn_skinny({"A": A.data_ptr(), "B": B.data_ptr(), "C": C.data_ptr()}, {},
                                      {"M": M, "N": 256, "K": 128, "BM": 64, "BN": bn})
    assert v["tmA"] == ("bytes", hook["tmA"]) and v["tmB"] == ("bytes", hook["tmB"])
    a_map = struct.unpack("<QQQQQ", v["tmA"][1][:40])
    b_map = struct.unpack("<QQQQQ", v["tmB"][1][:40])
    assert a_map[:3] == (A.data_ptr(), M, 128) and b_map[:3] == (B.data_ptr(), 128, 256)
    assert b_map[3] == tma.skinny_b_box_cols(bn)  # the BN = 32 rung reads B through a 32-column box


@pytest.mark.parametrize("M,N,K,want", [(1, 512, 128, "m64n64"), (16, 512, 128, "m64n64"), (17, 512, 128, "m64n64"),
                                         (1, 256, 128, "m64n32"), (1, 512, 136, "m64n32")])
def test_the_signed_tuning_rule_picks_the_rung_inside_its_ranges(tiny, M, N, K, want):
    """The route table's tuning rule travels through the signed manifest and its runtime table: inside its
    (N, K, M) ranges its rung launches; outside them the class's M ranges decide."""
    k, fake = _load(tiny)
    C = T.matrix(M, N, dtype="bf16")
    k.gemm(T.matrix(M, K, dtype="bf16"), T.matrix(K, N, dtype="bf16"), C)
    assert [r["fn"] for r in fake.launches] == [f"{SKINNY}_{want}_bf16"]


def test_the_report_shows_the_tuning_rules(tiny, capsys):
    import json

    from mamba_forge.cli import main

    assert main(["report", str(tiny.manifest), "--json"]) == 0
    routes = json.loads(capsys.readouterr().out)["result"]["routes"]
    nn = next(r for r in routes if (r["layout"], r["a"]) == ("nn", "bf16"))
    assert nn["tuning"] == [{"eq_class": "k16", "symbol": f"{SKINNY}_m64n64_bf16", "n_min": 512, "n_max": 512,
                             "k_min": 128, "k_max": 128, "m_min": 1, "m_max": 16}]
    assert all("tuning" not in r for r in routes if r is not nn)  # an untuned route: no key, as before tuning


def test_maps_are_built_once_per_operand_addresses_whatever_the_output(tiny, fake_encode):
    """The skinny rung's maps describe A and B only: a new C each call (what the torch op allocates) reuses them;
    a new A does not."""
    k, fake = _load(tiny)
    A, B = T.matrix(1, 128, dtype="bf16"), T.matrix(128, 256, dtype="bf16")
    for _ in range(3):
        k.gemm(A, B, T.matrix(1, 256, dtype="bf16"))
    assert len(fake_encode) == 2 and len(fake.launches) == 3  # tmA and tmB, encoded once
    k.gemm(T.matrix(1, 128, dtype="bf16"), B, T.matrix(1, 256, dtype="bf16"))
    assert len(fake_encode) == 4


def test_bias_none_is_the_null_pointer_and_a_bias_is_passed(tiny):
    k, fake = _load(tiny)
    A, B, C, bias = T.matrix(3, 40, dtype="f32"), T.matrix(40, 24), T.matrix(3, 24), T.matrix(24)
    k.gemm(A, B, C)
    k.gemm(A, B, C, bias=bias)
    none, given = (_by_name(k, r) for r in fake.launches)
    assert none["bias"] == ("ptr", 0) and given["bias"] == ("ptr", bias.data_ptr())
    assert fake.launches[0]["grid"] == (1, 1, 1) and none["K"] == ("i32", 40)


def test_layouts_read_m_n_k_from_the_stored_shapes(tiny):
    k, fake = _load(tiny)
    k.gemm(T.matrix(40, 3), T.matrix(40, 24), T.matrix(3, 24), layout="tn")  # A is K x M
    v = _by_name(k, fake.launches[0])
    assert (v["M"], v["N"], v["K"]) == (("i32", 3), ("i32", 24), ("i32", 40))


def test_a_16_bit_gemm_without_a_16_bit_rung_runs_on_f32_copies(tiny):
    """nn f16 has no route here: the exact-f32 route serves it on torch's f32 copies, C rounded back by torch."""
    k, fake = _load(tiny)
    A, B, C = T.matrix(2, 16, dtype="f16"), T.matrix(16, 8, dtype="f16"), T.matrix(2, 8, dtype="f16")
    bias = T.matrix(8, dtype="f16")
    assert k.gemm(A, B, C, bias=bias) is C
    (rec,) = fake.launches
    assert rec["fn"] == "tiny_gemm_f32"
    assert A.ops == [("float",)] and B.ops == [("float",)] and bias.ops == [("float",)]
    (copy,) = C.ops
    assert copy[0] == "copy_" and copy[1].token == "f32" and copy[1].shape == (2, 8)
    v = _by_name(k, rec)
    assert v["C"] == ("ptr", copy[1].data_ptr()) and v["C"] != ("ptr", C.data_ptr())
    assert v["bias"] != ("ptr", bias.data_ptr()) and v["bias"] != ("ptr", 0)


def test_out_none_allocates_with_torch_and_empty_products_launch_nothing(tiny):
    k, fake = _load(tiny)
    A, B = T.matrix(5, 16, dtype="f32"), T.matrix(16, 8)
    C = k.gemm(A, B)
    assert A.ops == [("new_empty", (5, 8), "f32")] and C.shape == (5, 8) and len(fake.launches) == 1
    for m, n in ((0, 8), (5, 0)):
        out = T.matrix(m, n)
        assert k.gemm(T.matrix(m, 16), T.matrix(16, n), out) is out
    assert len(fake.launches) == 1


def test_a_force_rung_serves_by_name_only(tiny):
    k, fake = _load(tiny)
    A, B, C = T.matrix(4, 64, dtype="bf16"), T.matrix(64, 64, dtype="bf16"), T.matrix(4, 64, dtype="bf16")
    k.gemm(A, B, C)
    assert fake.launches[-1]["fn"] == f"{SKINNY}_m64n32_bf16"
    with pytest.raises(LaunchRefused, match="tiny_tma_unmapped_bf16 takes tmA, tmB but its record names no tensor-map"):
        k.gemm(A, B, C, symbol="tiny_tma_unmapped_bf16")
    assert len(fake.launches) == 1


# ---- refusals: generated bad calls, each refused before a launch --------------------------------------------


def _good():
    return {"A": T.matrix(4, 64, dtype="bf16"), "B": T.matrix(64, 128, dtype="bf16"),
            "out": T.matrix(4, 128, dtype="bf16")}


def _bad_calls():
    """(label, kwargs, message) for every class of bad argument, crossed with the operand it hits."""
    for what, (shape, dtype) in itertools.product(("A", "B", "out"), [
            ((64,), "bf16"), ((2, 2, 16), "bf16"), ((4, 64), "i32"), ((4, 64), "f64")]):
        kw = _good()
        kw[what] = T.matrix(*shape, dtype=dtype)
        yield f"{what}-{len(shape)}d-{dtype}", kw, r"2-D matrix|GEMM operands are|shape"
    for what, bad in itertools.product(("A", "B", "out"), [42, "A", None, b"\0" * 8, 3.5]):
        if what == "out" and bad is None:
            continue  # out=None allocates
        kw = _good()
        kw[what] = bad
        yield f"{what}-{type(bad).__name__}", kw, "not a tensor"
    for what, dev in itertools.product(("A", "B", "out"), [("cpu", None), ("cuda", 1)]):
        kw = _good()
        kw[what] = T.matrix(*kw[what].shape, dtype="bf16", device=dev)
        yield f"{what}-on-{dev[0]}{dev[1]}", kw, "host memory|device|cpu|on cuda"
    for what in ("A", "B", "out"):
        kw = _good()
        kw[what] = T.matrix(*kw[what].shape, dtype="bf16", contiguous=False)
        yield f"{what}-strided", kw, "dense|contiguous|row-major"
    kw = _good()
    kw["B"] = T.matrix(63, 128, dtype="bf16")
    yield "k-mismatch", kw, "K differs"
    kw = _good()
    kw["B"] = T.matrix(64, 128, dtype="f16")
    yield "dtype-mix", kw, "one dtype"
    for shape in ((4, 127), (3, 128), (128, 4)):
        kw = _good()
        kw["out"] = T.matrix(*shape, dtype="bf16")
        yield f"out-{shape}", kw, "this product is 4 x 128"
    for bias in (T.matrix(127, dtype="bf16"), T.matrix(128, dtype="f32"), T.matrix(1, 128, dtype="bf16"), 7):
        kw = _good()
        kw["bias"] = bias
        yield f"bias-{getattr(bias, 'shape', bias)}", kw, "bias is"
    yield "layout", {**_good(), "layout": "NN"}, "not a GEMM layout"
    yield "math", {**_good(), "math": "fp8"}, "math="
    yield "math-tf32-bf16", {**_good(), "math": "tf32"}, "takes f32 operands"
    yield "k-zero", {"A": T.matrix(4, 0, dtype="bf16"), "B": T.matrix(0, 128, dtype="bf16"),
                     "out": T.matrix(4, 128, dtype="bf16")}, "K = 0"
    yield "cupy-out-none", {"A": FakeCAI((4, 64)), "B": FakeCAI((64, 128))}, "out=None allocates C with torch"
    yield "misaligned-A", {**_good(), "A": T.matrix(4, 64, dtype="bf16", ptr=0x7E00_0000_0008)}, "16-byte aligned"
    yield "negative-shape", {**_good(), "A": _shaped(T.matrix(4, 64, dtype="bf16"), (-4, 64))}, "2-D matrix"
    # out sharing bytes with an input: the same buffer, the last byte of one against the first of the other
    for what, off in itertools.product(("A", "B"), (0, -2, 2)):
        kw = _good()
        src = kw[what]
        kw["out"] = T.matrix(4, 128, dtype="bf16", ptr=src.data_ptr() + off + (src.numel() * 2 - 2 if off < 0 else 0))
        yield f"out-overlaps-{what}{off:+d}", kw, f"out overlaps {what}"
    kw = _good()
    kw["bias"] = T.matrix(128, dtype="bf16", ptr=kw["out"].data_ptr() + 64)
    yield "out-overlaps-bias", kw, "out overlaps bias"
    yield from _bad_strided_a()


def _strided(M=4, K=64, lda=96, dtype="bf16", **kw):
    """A [M, K] view of a row-major [M, lda] matrix: A = W[:, :K] (stride (lda, 1))."""
    return T.matrix(M, K, dtype=dtype, strides=(lda, 1), **kw)


def _bad_strided_a():
    """A row-strided A where a rule fails: its strides, its address, its storage, the rung that would serve it."""
    for label, A, match in (
            ("A-rows-not-dense", T.matrix(4, 64, dtype="bf16", strides=(128, 2)), "rows are not dense"),
            ("A-lda-below-K", _strided(lda=32), "row stride is below K = 64"),
            ("A-lda-misaligned", _strided(lda=68), "136 bytes, not a multiple of 16"),
            ("A-strided-address-misaligned", _strided(ptr=0x7E00_0000_0008), "must be 16-byte aligned"),
            ("A-strided-storage-too-small", _strided(storage=3 * 96 + 63), r"span 352 elements .* holds 351")):
        yield label, {**_good(), "A": A}, match
    yield "A-strided-pointer-rung", {"A": _strided(lda=72, dtype="f32"), "B": T.matrix(64, 128),
                                     "out": T.matrix(4, 128)}, "tiny_gemm_f32 reads A through its pointer"
    yield "A-strided-cast-route", {"A": _strided(K=16, lda=24, dtype="f16"), "B": T.matrix(16, 8, dtype="f16"),
                                   "out": T.matrix(4, 8, dtype="f16")}, "on f32 copies of the operands"
    yield "A-strided-layout-tn", {"A": _strided(M=64, K=4, lda=8, dtype="f32"), "B": T.matrix(64, 24),
                                  "out": T.matrix(4, 24), "layout": "tn"}, "layout nn only"
    A = _strided()  # its extent: (4 - 1) * 96 + 64 = 352 elements (704 bytes); its dense count would be 512 bytes
    yield "out-overlaps-A-span", {**_good(), "A": A, "out": T.matrix(4, 128, dtype="bf16", ptr=A.data_ptr() + 608)}, \
        "out overlaps A"
    # what the contract checks of every pointer, on the dense view of A's extent it is handed in A's place
    yield "A-strided-null", {**_good(), "A": _strided(ptr=0)}, "data pointer is 0|A: base address 0x0"
    yield "A-strided-other-device", {**_good(), "A": _strided(device=("cuda", 1))}, "is on device 1"
    yield "A-strided-host-memory", {**_good(), "A": _strided(device=("cpu", None))}, "cpu memory"


COPY_FIXES = {"A-rows-not-dense", "A-lda-below-K", "A-lda-misaligned", "A-strided-address-misaligned",
              "A-strided-pointer-rung", "A-strided-cast-route", "A-strided-layout-tn"}  # a dense A would serve


def _shaped(t, shape):
    t.shape = shape
    return t


BAD = list(_bad_calls())


@pytest.mark.parametrize("label,kw,match", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_are_refused_before_a_launch(tiny, label, kw, match):
    k, fake = _load(tiny)
    kw = dict(kw)
    A, B = kw.pop("A"), kw.pop("B")
    with pytest.raises((LaunchRefused, LookupError), match=match):
        k.gemm(A, B, **kw)
    assert fake.launches == []


def test_every_strided_refusal_is_one_line_and_names_the_copy_where_a_copy_would_serve(tiny):
    seen = set()
    for label, kw, _ in _bad_strided_a():
        k, fake = _load(tiny)
        kw = dict(kw)
        A, B = kw.pop("A"), kw.pop("B")
        with pytest.raises(LaunchRefused) as info:
            k.gemm(A, B, **kw)
        msg = str(info.value)
        assert "\n" not in msg and fake.launches == [], label
        assert msg.endswith("pass A.contiguous()") == (label in COPY_FIXES), (label, msg)
        seen.add(label)
    assert COPY_FIXES <= seen


# ---- a row-strided A (a column slice of a wider row-major matrix), read in place through its tensor map ------------


def test_a_row_strided_a_is_read_in_place_through_its_tensor_map(tiny, fake_encode):
    """The rung reads A through tmA built with A's row stride; the contract checks A's whole strided extent (a dense
    1-D view of (M - 1) * lda + K elements at A's address: the ABI pointer the kernel never dereferences); B's map is
    the dense one; nothing is copied."""
    k, fake = _load(tiny)
    M, K, lda, N = 4, 128, 192, 256
    A, B, C = _strided(M, K, lda), T.matrix(K, N, dtype="bf16"), T.matrix(M, N, dtype="bf16")
    assert k.gemm_reads_a_in_place(A, B)
    assert k.gemm(A, B, C) is C
    (rec,) = fake.launches
    assert rec["fn"] == f"{SKINNY}_m64n32_bf16"
    v = _by_name(k, rec)
    assert v["A"] == ("ptr", A.data_ptr()) and (v["M"], v["N"], v["K"]) == (("i32", M), ("i32", N), ("i32", K))
    span = (M - 1) * lda + K
    assert A.ops == [("as_strided", (span,), (1,))]  # the stand-in the contract checked; no copy of A
    hook = tma.prepare_gemm_nn_skinny({"A": A.data_ptr(), "B": B.data_ptr(), "C": C.data_ptr()}, {},
                                      {"M": M, "N": N, "K": K, "BM": 64, "BN": 32, tma.A_ROW_STRIDE: lda})
    assert v["tmA"] == ("bytes", hook["tmA"]) and v["tmB"] == ("bytes", hook["tmB"])
    assert struct.unpack("<6Q", v["tmA"][1][:48]) == (A.data_ptr(), M, K, 64, 64, lda)  # A's M x K, rows lda apart
    assert struct.unpack("<6Q", v["tmB"][1][:48])[5] == 0  # B dense
    encoded = len(fake_encode)
    k.gemm(A, B, C)  # remembered: the same launch, the stand-in made again (the contract checks it every call)
    assert fake.launches[1]["values"] == rec["values"] and A.ops[-1] == ("as_strided", (span,), (1,))
    assert len(fake_encode) == encoded  # the maps come from the cache


def test_a_strided_and_a_dense_a_never_share_a_remembered_call_or_a_map(tiny, fake_encode):
    """The same address and shape, once a [4, 64] slice of rows 96 apart and once dense: separate remembered calls
    (A's strides are in the key) and separate tensor maps (A's row stride is in the map cache's key)."""
    k, fake = _load(tiny)
    B, C = T.matrix(64, 128, dtype="bf16"), T.matrix(4, 128, dtype="bf16")
    S = _strided()
    D = T.matrix(4, 64, dtype="bf16", ptr=S.data_ptr())
    for A in (S, D, S, D, D, S):
        k.gemm(A, B, C)
    strides = [struct.unpack("<6Q", _by_name(k, r)["tmA"][1][:48])[5] for r in fake.launches]
    assert strides == [96, 0, 96, 0, 0, 96]
    assert [e[5] for e in fake_encode if e[0] == "A"] == [96, None]  # each A map built once, then found by its key
    assert len(k._gemm_calls) == 2
    assert S.ops == [("as_strided", (352,), (1,))] * 3 and D.ops is None  # the dense A goes to the contract as is


def test_a_remembered_strided_call_checks_its_address_storage_and_overlap_every_call(tiny):
    k, fake = _load(tiny)
    B, C = T.matrix(64, 128, dtype="bf16"), T.matrix(4, 128, dtype="bf16")
    k.gemm(_strided(), B, C)
    for A, out, match in ((_strided(ptr=0x7E00_0000_0008), C, "must be 16-byte aligned"),
                          (_strided(storage=351), C, "holds 351"),
                          (S := _strided(), T.matrix(4, 128, dtype="bf16", ptr=S.data_ptr() + 608), "out overlaps A"),
                          (S, T.matrix(4, 128, dtype="bf16", ptr=S.data_ptr() + 2 * 352 - 2), "out overlaps A")):
        with pytest.raises(LaunchRefused, match=match):
            k.gemm(A, B, out)
    assert len(k._gemm_calls) == 1 and len(fake.launches) == 1
    k.gemm(S, B, T.matrix(4, 128, dtype="bf16", ptr=S.data_ptr() + 2 * 352))  # just past A's extent: apart
    assert len(fake.launches) == 2


def test_reads_a_in_place_says_where_a_caller_must_copy(tiny):
    """Kernels.gemm_reads_a_in_place: True for a dense A and for a row-strided A the serving rung reads through its
    tensor map; False wherever gemm() would refuse the strided A (so the caller passes A.contiguous()); it launches
    nothing and refuses nothing."""
    k, fake = _load(tiny)
    B = T.matrix(64, 128, dtype="bf16")
    yes = [T.matrix(4, 64, dtype="bf16"), _strided(), _strided(lda=64 + 8), _strided(M=1, lda=1000)]
    assert all(k.gemm_reads_a_in_place(A, B) for A in yes)
    for label, kw, _ in _bad_strided_a():
        if label in COPY_FIXES:  # (the others are refused by gemm whatever the caller does with A)
            assert not k.gemm_reads_a_in_place(kw["A"], kw["B"], layout=kw.get("layout", "nn")), label
    assert not k.gemm_reads_a_in_place(_strided(dtype="f32", lda=72), T.matrix(64, 8), layout="nt")  # no route
    assert fake.launches == []


def test_no_route_is_a_lookup_error_naming_the_key(tiny):
    k, fake = _load(tiny)
    with pytest.raises(LookupError, match="nt f32xf32->f32"):
        k.gemm(T.matrix(4, 16), T.matrix(8, 16), T.matrix(4, 8), layout="nt")
    assert fake.launches == []


# ---- the table against the real catalog ---------------------------------------------------------------------


def test_the_map_rules_are_the_catalogs_prepare_hooks():
    """Every GEMM rung family (auto and force) that takes blobs has a map rule here, and it is the hook its catalog
    entry qualified with; every rung's bias is an optional [N] vector of C's dtype (the GEMM ABI's null = none)."""
    cat = load_catalog(default_catalog_path())
    seen: dict[str, str] = {}
    for route in cat.routes:
        for rung in route.rungs():
            sym = cat.symbols[rung.symbol]
            fam = cat.module(sym.module).family(sym.family)
            if any(p.type == "bytes" for p in fam.params):
                seen[fam.name] = fam.qualify.prepare
                # the map cache keys on C's address only for hooks named _tmastore: exactly the rungs with a tmC
                assert any(p.name == "tmC" for p in fam.params) == fam.qualify.prepare.endswith("_tmastore"), fam.name
            by = {p.name: p for p in fam.params}
            if "bias" in by:
                assert rung.bias and list(by["bias"].shape) == ["N"] and by["bias"].dtype == by["C"].dtype, sym.name
    assert seen, "no TMA rungs in the catalog's routes?"
    # the record an engine loads names the hook the family qualified with (its contract, signed), and the runtime
    # resolves that name in tma's table of hooks only
    for name, prepare in seen.items():
        fam = next(cat.module(s.module).family(s.family) for s in cat.symbols.values() if s.family == name)
        hook = tensor_map_hook(fam)
        assert f"mamba_forge.gpu.tma:{hook}" == prepare, name
        assert tma.TENSOR_MAP_HOOKS[hook] is getattr(tma, hook)
    assert set(tma.TENSOR_MAP_HOOKS) == {p.partition(":")[2] for p in seen.values()}


def test_a_record_without_or_with_a_foreign_tensor_map_hook_is_refused(monkeypatch):
    """The hook comes from the signed record: none (a manifest qualified before records named one) and a name tma's
    table lacks (any other attribute of the module included) are refused before any map is built."""
    kern = SimpleNamespace(name="g", family="f", symbol=SimpleNamespace(tensor_maps="", constants={}))
    A = SimpleNamespace(data_ptr=lambda: 16)
    monkeypatch.setattr(rgemm, "TORCH_TYPES", (SimpleNamespace,))
    with pytest.raises(LaunchRefused, match="names no tensor-map hook"):
        rgemm._tensor_maps(kern, A, A, A, 1, 1, 1, ("tmA",))
    for name in ("encode_2d", "prepare_nothing"):
        kern.symbol.tensor_maps = name
        with pytest.raises(LaunchRefused, match="mamba_forge.gpu.tma does not have"):
            rgemm._tensor_maps(kern, A, A, A, 1, 2, 3, ("tmA",))


def test_the_map_cache_tells_one_rung_name_signed_with_other_tiles_apart(monkeypatch, fake_encode):
    """Two manifests loaded in one process may sign one rung name with other tile constants (a skinny rung's BN):
    the map cache keys on the hook and the constants, so each gets its own box; the same rung hits the cache."""
    monkeypatch.setattr(rgemm, "TORCH_TYPES", (SimpleNamespace,))
    A = SimpleNamespace(data_ptr=lambda: 1 << 20)
    B = SimpleNamespace(data_ptr=lambda: 2 << 20)

    def rung(bn):
        return SimpleNamespace(name="skinny", family="f", ordinal=0,
                               symbol=SimpleNamespace(tensor_maps="prepare_gemm_nn_skinny", constants={"BN": bn}))

    monkeypatch.setattr(rgemm, "on_this_thread", lambda ordinal: True)
    narrow, wide = rung(32), rung(64)
    m32 = rgemm._tensor_maps(narrow, A, B, A, 64, 128, 64, ("tmA", "tmB"))
    m64 = rgemm._tensor_maps(wide, A, B, A, 64, 128, 64, ("tmA", "tmB"))
    assert struct.unpack_from("<QQQQ", m32["tmB"])[3] == 32 and struct.unpack_from("<QQQQ", m64["tmB"])[3] == 64
    encoded = len(fake_encode)
    assert rgemm._tensor_maps(rung(32), A, B, A, 64, 128, 64, ("tmA", "tmB")) == m32  # same hook and tile: a hit
    assert len(fake_encode) == encoded


def test_the_record_schema_refuses_a_hook_that_is_not_a_hook_name():
    bad = {"name": "s", "module": "M", "target": "sm_90a", "family": "f", "status": "admitted",
           "tensor_maps": "os:system"}
    with pytest.raises(SchemaError, match="not a tensor-map hook name"):
        codec.from_dict(QSymbol, bad, where="m.toml")
    assert codec.from_dict(QSymbol, {**bad, "tensor_maps": "prepare_gemm_nn"}, where="m.toml").tensor_maps == \
        "prepare_gemm_nn"


def test_only_the_named_pointer_may_be_null_and_no_dim_comes_from_it(tiny):
    """contract.bind's `null`: the GEMM path's bias only; the plain keyword call still refuses None, and a dim the
    null pointer would have carried (N, from bias [N]) must then be given."""
    k, fake = _load(tiny)
    kern = k.function("tiny_gemm_f32")
    A, B, C = T.matrix(2, 8), T.matrix(8, 4), T.matrix(2, 4)
    with pytest.raises(LaunchRefused, match="bias of tiny_gemm_f32 of type NoneType is not a tensor"):
        kern(C=C, A=A, B=B, bias=None, M=2, N=4, K=8)
    with pytest.raises(LaunchRefused, match="A of tiny_gemm_f32 of type NoneType is not a tensor"):
        kern._launch({"C": C, "A": None, "B": B, "bias": None, "M": 2, "N": 4, "K": 8}, None, "bias")
    with pytest.raises(LaunchRefused, match="missing argument N"):
        kern._launch({"C": C, "A": A, "B": B, "bias": None, "M": 2, "K": 8}, None, "bias")
    assert fake.launches == []
    kern._launch({"C": C, "A": A, "B": B, "bias": None, "M": 2, "N": 4, "K": 8}, None, "bias")
    assert _by_name(k, fake.launches[0])["bias"] == ("ptr", 0)


# ---- mamba_forge::gemm's table (torch itself is needed only to register: tests/gpu/test_runtime_gpu.py) --------


def test_the_torch_op_shape_rule_is_kernels_gemm_s():
    from mamba_forge.runtime import torch_ops

    assert torch_ops.SCHEMAS["gemm"].startswith("gemm(Tensor A, Tensor B, Tensor? bias=None")
    assert torch_ops.gemm_shape("nn", (3, 40), (40, 24)) == (3, 24)
    assert torch_ops.gemm_shape("nt", (3, 40), (24, 40)) == (3, 24)
    assert torch_ops.gemm_shape("tn", (40, 3), (40, 24)) == (3, 24)
    for call, match in ((lambda: torch_ops.gemm_shape("nn", (3, 40), (41, 24)), "K differs"),
                        (lambda: torch_ops.gemm_shape("nt", (3, 40), (40, 24)), "K differs"),
                        (lambda: torch_ops.gemm_shape("NN", (3, 40), (40, 24)), "not one of nn, tn, nt"),
                        (lambda: torch_ops.gemm_shape("nn", (3, 40, 1), (40, 24)), "must be 2-D"),
                        (lambda: torch_ops.gemm_shape("nn", (40,), (40, 24)), "must be 2-D")):
        with pytest.raises(LaunchRefused, match=match):
            call()


def test_the_torch_op_preloads_every_serving_rung(tiny):
    """register() loads what mamba_forge::gemm may launch: every auto rung that serves here, once, in table order
    (force rungs serve only by name, which the op does not take)."""
    from mamba_forge.runtime import torch_ops

    k, _ = _load(tiny)
    assert torch_ops.serving_gemm_rungs(k) == [f"{SKINNY}_m64n32_bf16", f"{SKINNY}_m64n64_bf16", "tiny_gemm_f32",
                                               "tiny_gemm_bf16"]
    empty = SimpleNamespace(manifest=SimpleNamespace(routes=[]), _serves_name=lambda n: True)
    assert torch_ops.serving_gemm_rungs(empty) == []
    none_serve = SimpleNamespace(manifest=k.manifest, _serves_name=lambda n: False)
    assert torch_ops.serving_gemm_rungs(none_serve) == []


def test_the_torch_op_registers_and_its_fake_gives_the_shape():
    """With torch (a CPU build is enough): register() defines mamba_forge::gemm with its schema, and the fake
    implementation torch.compile traces with gives [M, N] for each layout and refuses a K that disagrees."""
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    import mamba_forge.runtime.torch as mft

    class StandIn:  # fn() for the fixed ops' families; no GEMM rungs to preload; an H200's SM count
        manifest = SimpleNamespace(routes=[])
        device = SimpleNamespace(sm_count=132)

        def fn(self, family, dtype):
            return object()

        def _serves_name(self, name):
            return True

    assert "mamba_forge::gemm" in mft.register(StandIn())
    assert str(torch.ops.mamba_forge.gemm.default._schema) == (
        'mamba_forge::gemm(Tensor A, Tensor B, Tensor? bias=None, str layout="nn") -> Tensor')
    bf = torch.bfloat16
    with FakeTensorMode():
        for layout, a, b in (("nn", (3, 40), (40, 24)), ("nt", (3, 40), (24, 40)), ("tn", (40, 3), (40, 24))):
            c = torch.ops.mamba_forge.gemm(torch.empty(a, dtype=bf), torch.empty(b, dtype=bf), None, layout)
            assert tuple(c.shape) == (3, 24) and c.dtype == bf, layout
        with pytest.raises(LaunchRefused, match="K differs"):
            torch.ops.mamba_forge.gemm(torch.empty(3, 40, dtype=bf), torch.empty(41, 24, dtype=bf))
