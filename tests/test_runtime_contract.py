"""The checked keyword launch (runtime/contract.py), tensor descriptions, stream resolution and the typed
positional path (CPU, fake tensors). Every refusal has a case proving the bind raises and returns nothing."""

from __future__ import annotations

import ctypes
import dataclasses
import random
import struct
import sys
import types

import numpy as np
import pytest
from runtime_fakes import (
    SIZES,
    FakeCAI,
    FakeDLPack,
    FakeTorchTensor,
    catalog_record,
    catalog_records,
    conv1d,
    gemm_wgmma,
    reduce_bc,
    reduce_bc_tmajor,
    rmsnorm,
    softplus,
    ssm_step,
    symbol,
    typed_scalars,
)
from runtime_fakes import params as make_params

from mamba_forge.core import expr
from mamba_forge.gpu.driver import PACK_FORMATS, PackedParams
from mamba_forge.runtime import streams
from mamba_forge.runtime.args import typed_params
from mamba_forge.runtime.contract import GRID_LIMITS, Contract, contract
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.tensors import describe

pytestmark = pytest.mark.usefixtures("fake_tensor_streams")  # tests/conftest.py

T = FakeTorchTensor


def refuse(c: Contract, kwargs: dict, match: str, **bind) -> None:
    """The bind raises LaunchRefused matching `match`, and so returns nothing that could be launched."""
    launched = []
    with pytest.raises(LaunchRefused, match=match):
        launched.append(c.bind(kwargs, **bind))
    assert launched == []


def sp(n=1000, dtype="f32", **kw):
    return {"y": T(n, dtype), "x": T(n, dtype), **kw}


# ---- positive: exact packed values and grids -------------------------------------------------------------------


def test_softplus_binds_with_n_derived_from_x():
    c = contract(softplus())
    y, x = T(1_000_000), T(1_000_000)
    b = c.bind({"y": y, "x": x})
    assert b.values == [("ptr", y.data_ptr()), ("ptr", x.data_ptr()), ("i64", 1_000_000)]
    assert b.grid == (489, 1, 1) and b.block == (256, 1, 1) and b.shared_mem == 0 and b.aligns == (0, 0, 0)
    assert (b.owner, b.ordinal) == ("torch", 0)
    assert c.bind({"y": y, "x": x, "n": 5}).values[2] == ("i64", 5)  # more elements than needed: allowed
    assert c.bind({"y": y, "x": x, "n": np.int64(7)}).values[2] == ("i64", 7)
    assert c.bind({"y": T(1 << 30), "x": T(1 << 30)}).grid == (4096, 1, 1)  # min(..., 4096)
    PackedParams(b.values, b.aligns)  # the driver's packer takes them as they are


def test_contract_is_compiled_once_per_record():
    s = softplus()
    assert contract(s) is contract(s) and contract(softplus()) is not contract(s)
    assert "_f_min(_f_ceil_div(_d0, 2048), 4096)" in contract(s).source


def test_conv1d_grid_uses_the_sizeof_constant():
    for dtype, tile in (("f32", 2048), ("bf16", 4096), ("f16", 4096)):
        c = contract(conv1d(dtype))
        n = 2 * 1536 * 6144
        kw = {"out": T(n, dtype), "x": T(n, dtype), "weight": T(1536 * 4), "bias": T(1536), "batch": 2, "d": 1536,
              "L": 6144, "width": 4}
        b = c.bind(kw)
        assert b.grid == (2 * 1536 * -(-6144 // tile), 1, 1) and b.block == (128, 1, 1)
        assert b.values[4:] == [("i64", 2), ("i64", 1536), ("i64", 6144), ("i32", 4)]
        kw.pop("d")  # d comes from bias, the one pointer shaped exactly [d]
        assert c.bind(kw).values[5] == ("i64", 1536)


def _step_kwargs(b: int, di: int, ds: int, r: int) -> dict:
    """A bf16 decode step's tensors (no z) and scalars (no d_inner: the contract takes it from dt_bias)."""
    return {"out": T(b * di, "bf16"), "state": T(b * di * ds), "u": T(b * di, "bf16"), "dt": T(b * di, "bf16"),
            "dt_bias": T(di), "A_log": T(di * ds), "x_dbl": T(b * (r + 2 * ds), "bf16"), "Dp": T(di),
            "batch": b, "d_state": ds, "dt_rank": r}


def test_scan_step_derives_the_stride_and_checks_it():
    c = contract(ssm_step("bf16"))
    b, di, ds, r = 3, 256, 16, 16
    kw = {**_step_kwargs(b, di, ds, r), "z": T(b * di, "bf16")}
    bound = c.bind(kw)  # d_inner from dt_bias (the first input shaped [d_inner])
    assert bound.values[9:] == [("i32", 3), ("i32", 256), ("i32", 16), ("i32", 16), ("i32", 48)]
    assert bound.grid == (24, 1, 1)
    assert c.bind({**kw, "x_dbl_stride": 48}).values == bound.values
    refuse(c, {**kw, "x_dbl_stride": 49}, r"x_dbl_stride of .* = 49 disagrees with dt_rank \+ 2 \* d_state = 48")


def test_the_catalog_scan_step_reads_z_rows_z_pad_apart_and_refuses_what_does_not_fit():
    """The catalog's decode step (z read in place from xz rows: z_stride = d_inner + z_pad, derived): the extent
    (batch - 1) * (d_inner + z_pad) + d_inner is checked against z's elements; z_pad is given, never negative."""
    c = contract(catalog_record("ssm_step_forward_fused_bf16"))
    b, di, ds, r = 3, 256, 16, 16
    kw = _step_kwargs(b, di, ds, r)
    strided = c.bind({**kw, "z": T((b - 1) * 2 * di + di, "bf16"), "z_pad": di})  # xz's second half: 5 * di
    assert strided.values[-2:] == [("i32", 48), ("i32", 2 * di)]
    assert c.bind({**kw, "z": T(b * di, "bf16"), "z_pad": 0}).values[-1] == ("i32", di)  # a dense z
    refuse(c, {**kw, "z": T(b * di, "bf16"), "z_pad": di}, r"z of .* has 768 elements; it needs at least 1280")
    refuse(c, {**kw, "z": T(5 * di, "bf16"), "z_pad": -1}, "dim z_pad = -1 .* is negative")
    refuse(c, {**kw, "z": T(b * di, "bf16")}, "missing argument z_pad")  # no pointer gives it: it must be given


def test_gemm_blobs_pack_with_their_alignment():
    c = contract(gemm_wgmma())
    M, N, K = 523, 392, 328
    ta, tb = bytes(range(128)), bytearray(128)
    kw = {"tmA": ta, "tmB": tb, "C": T(M * N, "bf16"), "A": T(M * K, "bf16"), "B": T(K * N, "bf16"), "M": M,
          "N": N, "K": K}
    b = c.bind(kw)
    assert b.values[:2] == [("bytes", ta), ("bytes", bytes(128))] and b.aligns == (64, 64, 0, 0, 0, 0, 0, 0)
    assert b.grid == (min(-(-M // 128) * -(-N // 128), 132), 1, 1) and b.shared_mem == 5 * 256 * 128 + 80 + 1024
    PackedParams(b.values, b.aligns)


def test_dim_only_arguments_and_derived_scalars():
    c = contract(reduce_bc())
    assert c.accepted == ("out", "part", "batch", "groups", "nl", "L", "d_state")
    kw = {"out": T(3 * 16 * 601), "part": T(3 * 5 * 16 * 601), "batch": 3, "groups": 5, "d_state": 16, "L": 601}
    b = c.bind(kw)
    assert b.values[2:] == [("i32", 3), ("i32", 5), ("i64", 16 * 601)]
    assert c.bind({**kw, "nl": 16 * 601}).values == b.values
    refuse(c, {**kw, "nl": 16 * 600}, "disagrees with d_state \\* L = 9616")
    refuse(c, {k: v for k, v in kw.items() if k != "L"}, r"missing argument L \(an integer >= 0: dim L\)")
    refuse(c, {**kw, "L": -5}, "dim L = -5 .* is negative")
    refuse(c, {**kw, "L": 2.0}, "dim L of .* is a float")
    refuse(c, {**kw, "L": True}, "dim L of .* is a bool")


def test_int_for_a_float_scalar_is_fine_and_literals_are_required():
    c = contract(rmsnorm())
    kw = {"y": T(8 * 64, "bf16"), "rstd": T(8), "x": T(8 * 64, "bf16"), "w": T(64), "rows": 8}
    assert c.bind({**kw, "eps": 1}).values[-1] == ("f32", 1.0)
    assert c.bind({**kw, "eps": np.float32(1e-6)}).values[-1][1] == pytest.approx(1e-6)
    refuse(c, kw, r"missing argument eps \(a f32 scalar; qualified with 1e-05\)")


def test_three_d_grid():
    c = contract(reduce_bc_tmajor())
    kw = {"out": T(3 * 601 * 16), "part": T(3 * 5 * 16 * 601), "batch": 3, "groups": 5, "d_state": 16, "L": 601}
    assert c.bind(kw).grid == (19, 1, 3) and c.bind(kw).block == (32, 8, 1)
    refuse(c, {**kw, "batch": 70000, "out": T(70000 * 601 * 16), "part": T(70000 * 5 * 16 * 601)},
           r"grid dimension 2 = 70000 .* outside 1..65535")


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
def test_generated_softplus_and_conv_cases(dtype):
    rng = random.Random(f"contract-{dtype}")
    c, cc = contract(softplus(dtype)), contract(conv1d(dtype))
    for _ in range(200):
        n = rng.randint(1, 1 << 26)
        spare = rng.choice([0, 0, rng.randint(1, 1000)])
        y, x = T(n + spare, dtype), T(n, dtype)
        b = c.bind({"y": y, "x": x})
        assert b.values == [("ptr", y.data_ptr()), ("ptr", x.data_ptr()), ("i64", n)]
        assert b.grid == (min(-(-n // 2048), 4096), 1, 1)
        short = rng.randint(1, n)
        refuse(c, {"y": T(n - short, dtype), "x": x, "n": n}, f"y of .* has {n - short} elements; it needs at least {n}")
        other = rng.choice([d for d in ("f32", "bf16", "f16", "f64") if d != dtype])
        refuse(c, {"y": y, "x": T(n, other)}, f"x of .* is {other}; the parameter is {dtype}")
        batch, d, L, width = rng.randint(1, 8), rng.randint(1, 4096), rng.randint(1, 20000), rng.randint(1, 4)
        total = batch * d * L
        kw = {"out": T(total, dtype), "x": T(total, dtype), "weight": T(d * width), "bias": T(d), "batch": batch,
              "L": L, "width": width}
        want = batch * d * -(-L // (8192 // SIZES[dtype]))
        if want <= GRID_LIMITS[0]:
            assert cc.bind(kw).grid == (want, 1, 1)
        refuse(cc, {**kw, "weight": T(d * width - 1)}, "weight of .* needs at least")


# ---- refusals ---------------------------------------------------------------------------------------------------


def test_missing_and_unknown_arguments():
    c = contract(softplus())
    refuse(c, {"y": T(10)}, r"missing argument x \(a f32 tensor\)")
    refuse(c, {"y": T(10), "x": T(10), "m": 3}, "takes no argument m; it takes y, x, n")
    refuse(c, {"y": T(10), "xx": T(10)}, "missing argument x .*unknown argument xx")
    g = contract(gemm_wgmma())
    refuse(g, {"tmB": b"", "C": T(1), "A": T(1), "B": T(1), "M": 1, "N": 1, "K": 1},
           r"missing argument tmA \(bytes, exactly 128 long\)")
    refuse(g, {"tmA": bytes(128), "tmB": bytes(128), "C": T(1, "bf16"), "A": T(1, "bf16"), "B": T(1, "bf16"),
               "N": 1, "K": 1}, r"missing argument M \(an integer >= 0: dim M\)")


@pytest.mark.parametrize(("name", "value", "match"), [
    ("a", 1.5, r"a of .* is a float \(1.5\); the parameter is i32: pass an int"),
    ("a", 2.0, "is a float"),
    ("a", np.float64(2.0), "is a float"),
    ("a", True, "is a bool"),
    ("f", False, "is a bool"),
    ("a", "3", "is a str"),
    ("a", 1 << 31, r"does not fit i32 \(-2147483648..2147483647\)"),
    ("a", -(1 << 31) - 1, "does not fit i32"),
    ("b", -1, r"b of .* = -1 does not fit u32 \(0..4294967295\)"),
    ("b", 1 << 32, "does not fit u32"),
    ("c", 1 << 63, "does not fit i64"),
    ("d", -1, "does not fit u64"),
    ("d", 1 << 64, "does not fit u64"),
    ("lr", 1e39, "overflows the f32 parameter"),
    ("f", 10 ** 400, "overflows f64"),
    ("f", 1 + 2j, "is a complex"),
])
def test_scalar_refusals(name, value, match):
    c = contract(typed_scalars())
    kw = {"p": T(100), "a": -5, "b": 7, "c": -(1 << 40), "d": (1 << 64) - 1, "lr": 3, "f": 0.5, "step": 10}
    b = c.bind(kw)
    assert b.values[1:] == [("i32", -5), ("u32", 7), ("i64", -(1 << 40)), ("u64", (1 << 64) - 1), ("f32", 3.0),
                            ("f64", 0.5), ("i32", 10), ("i64", 100)]
    for t, v in b.values:
        struct.pack(PACK_FORMATS[t], v)
    refuse(c, {**kw, name: value}, match)


def test_dim_from_a_tensor_must_fit_its_scalar():
    s = symbol("k32", "k32", "f32", make_params(
        {"name": "y", "type": "ptr", "dtype": "f32", "role": "out", "shape": ["n"]},
        {"name": "x", "type": "ptr", "dtype": "f32", "shape": ["n"]},
        {"name": "n", "type": "i32", "value": "n"}), ["min(ceil_div(n, 2048), 4096)"], ["n"])
    big = (1 << 31) + 1
    refuse(contract(s), {"y": T(big), "x": T(big)}, r"n of k32 \(= n, argument n or the element count of x\) = "
                                                    "2147483649 does not fit i32")


def test_scalar_disagreeing_with_a_tensor():
    c = contract(softplus())
    refuse(c, {"y": T(100), "x": T(50), "n": 100}, "x of .* has 50 elements; it needs at least 100 .*n=100")
    refuse(c, {"y": T(50), "x": T(100)}, "y of .* has 50 elements; it needs at least 100")


def test_pointer_refusals():
    c = contract(softplus())
    refuse(c, sp(x=T(10, device=("cpu", None))), "x of .* lives in cpu memory")
    refuse(c, sp(x=np.zeros(1000, np.float32)), "lives in cpu memory")
    refuse(c, sp(x=FakeDLPack([1000], device_type=3)), "lives in cuda_host memory")
    refuse(c, sp(x=T(1000, device=("cuda", 1))), "x of .* is on device 1; the kernels are loaded on device 0")
    assert c.bind(sp(y=T(1000, device=("cuda", 1)), x=T(1000, device=("cuda", 1))), device=1).ordinal == 1
    refuse(c, sp(x=FakeCAI([1000], device=2)), "is on device 2")
    refuse(c, sp(x=FakeDLPack([1000], device_id=3)), "is on device 3")
    refuse(c, sp(x=FakeCAI([1000], cupy=False)), "is on an unknown device")
    assert c.bind(sp(x=FakeCAI([1000], cupy=False)), locate=lambda ptr: 0).grid == (1, 1, 1)
    refuse(c, sp(x=FakeCAI([1000], cupy=False)), "is on device 1", locate=lambda ptr: 1)
    refuse(c, sp(x=T(1000, "bf16")), "x of .* is bf16; the parameter is f32")
    refuse(c, sp(x=FakeCAI([1000], "<f2")), "is f16; the parameter is f32")
    refuse(c, sp(x=FakeCAI([1000], "<V2")), "is <V2; the parameter is f32")
    refuse(c, sp(x=FakeDLPack([1000], "bf16")), "is bf16; the parameter is f32")
    refuse(c, sp(x=T(1000, contiguous=False)), "x of .* is not contiguous")
    refuse(c, sp(x=FakeCAI([10, 100], strides=(4, 40))), "is not contiguous")
    refuse(c, sp(x=FakeDLPack([10, 100], strides=[1, 10])), "is not contiguous")
    refuse(c, {**sp(x=T(999)), "n": 1000}, "x of .* has 999 elements; it needs at least 1000")
    refuse(c, sp(x=0x7F0000000000), "x of .* is an int address, which the keyword launch cannot check.*positional")
    refuse(c, sp(x=True), "x of .* of type bool is not a tensor")
    refuse(c, sp(x="0x10"), "of type str is not a tensor")
    refuse(c, sp(y=FakeCAI([1000], readonly=True)), "y of .* is read-only but the kernel writes it")
    assert c.bind(sp(x=FakeCAI([1000], readonly=True))).owner == "torch"  # an input may be read-only
    refuse(c, sp(x=FakeDLPack([1000], consumed=True)), "already consumed")


def test_cai_and_dlpack_tensors_bind():
    c = contract(softplus("f16"))
    y, x = FakeCAI([4, 250], "<f2"), FakeDLPack([2, 500], "f16")
    b = c.bind({"y": y, "x": x})
    assert b.values == [("ptr", y.ptr), ("ptr", x.ptr), ("i64", 1000)] and b.owner == "cupy"
    assert c.bind({"y": FakeCAI([1000, 1], "<f2", strides=(2, 64)), "x": x}).grid == (1, 1, 1)  # extent-1 dims free


def test_blob_refusals():
    c = contract(gemm_wgmma())
    kw = {"tmA": bytes(128), "tmB": bytes(128), "C": T(4, "bf16"), "A": T(4, "bf16"), "B": T(4, "bf16"), "M": 2,
          "N": 2, "K": 2}
    assert c.bind(kw).grid == (1, 1, 1)
    refuse(c, {**kw, "tmA": bytes(127)}, "tmA of .* is 127 bytes; the parameter is exactly 128 bytes")
    refuse(c, {**kw, "tmB": memoryview(bytes(129))}, "is 129 bytes")
    refuse(c, {**kw, "tmA": T(32)}, "tmA of .* is a FakeTorchTensor; the parameter is a 128-byte blob")
    refuse(c, {**kw, "tmA": 0}, "is a int; the parameter is a 128-byte blob")
    refuse(c, {**kw, "tmA": True}, "is a bool; the parameter is a 128-byte blob")


def test_state_capacity():
    c = contract(ssm_step(state_capacity=64))
    b, di, r = 2, 64, 8

    def kw(ds):
        return {"out": T(b * di), "state": T(b * di * ds), "u": T(b * di), "dt": T(b * di), "dt_bias": T(di),
                "A_log": T(di * ds), "x_dbl": T(b * (r + 2 * ds)), "Dp": T(di), "z": T(b * di), "batch": b,
                "d_state": ds, "dt_rank": r}

    assert c.bind(kw(64)).values[11] == ("i32", 64)
    refuse(c, kw(65), r"d_state = 65 \(from argument d_state\) must be 1..64, the state capacity it was built")
    refuse(c, kw(0), "d_state = 0 .* must be 1..64")
    assert contract(ssm_step(state_capacity=0)).bind(kw(65)).grid == (4, 1, 1)  # no capacity recorded: no bound
    assert contract(gemm_wgmma()).state_capacity == 0


def _fold_tokens_kwargs(b: int, di: int, ds: int, L: int, r: int = 8) -> dict:
    """ssm_parallel_scan_bwd_fold_tokens' arguments at the layer's strides (z in xz rows, B and C in x_dbl rows)."""
    tok, xw = b * L, r + 2 * ds
    f32 = lambda n: T(n, "f32")  # noqa: E731
    return {"du": T(tok * di, "bf16"), "ddelta": T(tok * di, "bf16"), "dz": T(tok * 2 * di - di, "bf16"),
            "dB_part": f32(b * (di // 8 or 1) * ds * L), "dC_part": f32(b * (di // 8 or 1) * ds * L),
            "dA_part": f32(b * di * ds), "dD_part": f32(b * di), "dbias_part": f32(b * di),
            "dout": T(tok * di, "bf16"), "saved": f32(b * di * -(-L // 256) * ds), "u": T(tok * di, "bf16"),
            "delta": T(tok * di, "bf16"), "A_log": f32(di * ds), "Bm": T(tok * xw, "bf16"), "Cm": T(tok * xw, "bf16"),
            "Dp": f32(di), "z": T(tok * 2 * di - di, "bf16"), "delta_bias": f32(di), "batch": b, "d_inner": di,
            "d_state": ds, "L": L, "z_pad": di, "bc_pad": xw - ds, "delta_softplus": 1}


def test_dims_rules_refuse_what_the_kernel_would_not_write():
    """The catalog's `requires` reach the record and the checked launch: the token-major fold serves d_inner in
    multiples of 8 and d_state up to 16 (its kernel returns without writing otherwise); a record without rules (a
    manifest written before them) binds as before."""
    rec = catalog_record("ssm_parallel_scan_bwd_fold_tokens_bf16")
    assert (rec.dims_multiple_of, rec.dims_at_most) == ({"d_inner": 8}, {"d_state": 16})
    c = contract(rec)
    assert c.bind(_fold_tokens_kwargs(2, 64, 16, 300)).grid == (16, 1, 1)
    refuse(c, _fold_tokens_kwargs(2, 64, 17, 300), r"d_state = 17 \(from argument d_state\) must be at most 16")
    refuse(c, _fold_tokens_kwargs(2, 68, 16, 300),
           r"d_inner = 68 \(from argument d_inner or the element count of Dp\) must be a multiple of 8; its kernel")
    old = dataclasses.replace(rec, dims_multiple_of={}, dims_at_most={})
    assert contract(old).bind(_fold_tokens_kwargs(2, 68, 17, 300)).grid == (17, 1, 1)
    with pytest.raises(LaunchRefused, match=r"dims rules name \['width'\], which are not dims of its contract"):
        contract(dataclasses.replace(rec, dims_at_most={"width": 4}))


def test_grid_refusals():
    c = contract(softplus())
    refuse(c, sp(0), r"grid dimension 0 = 0 at n=0 is outside 1..2147483647")
    big = symbol("big", "big", "f32", make_params({"name": "n", "type": "i64", "value": "n"}), ["n"], ["n"])
    assert contract(big).bind({"n": GRID_LIMITS[0]}).grid == (GRID_LIMITS[0], 1, 1)
    refuse(contract(big), {"n": GRID_LIMITS[0] + 1}, "outside 1..2147483647")
    half = symbol("half", "half", "f32", make_params({"name": "n", "type": "i64", "value": "n"}), ["2 ** -n"], ["n"])
    refuse(contract(half), {"n": 1}, "grid dimension 0 = 0.5")
    div = symbol("div", "div", "f32", make_params({"name": "n", "type": "i64", "value": "n"},
                                                 {"name": "w", "type": "i64", "value": "w"}), ["n // w"], ["n", "w"])
    refuse(contract(div), {"n": 4, "w": 0}, r"cannot be evaluated at n=4, w=0 \(ZeroDivisionError")


@pytest.mark.parametrize(("grid", "dims", "constants", "match"), [
    (["n / 2"], ["n"], {}, "bad expression.*Div is not allowed"),
    (["__import__('os')"], ["n"], {}, "bad expression"),
    (["n.real"], ["n"], {}, "bad expression.*Attribute"),
    (["m * 2"], ["n"], {}, r"names \['m'\], neither dims"),
    (["n"], ["n"], {"n": 3}, "both dims and constants"),
    (["n", "n", "n", "n"], ["n"], {}, "4 expressions, not 1 to 3"),
    ([], ["n"], {}, "0 expressions"),
])
def test_bad_contracts_are_refused_when_compiled(grid, dims, constants, match):
    s = symbol("bad", "bad", "f32", make_params({"name": "n", "type": "i64", "value": "n"}), grid, dims,
               constants=constants)
    with pytest.raises(LaunchRefused, match=match):
        Contract(s)


# ---- the whole catalog: every contract compiles, binds at its qualification dims, and agrees with expr ----------


def test_every_catalog_contract_binds_at_its_qualification_dims():
    count = 0
    for rec, qdims in catalog_records():
        c = contract(rec)
        env = {**qdims, **rec.constants}
        kw = {}
        for p in rec.params:
            if p.kind == "pointer":
                kw[p.name] = T(expr.evaluate(p.shape[0], env), p.dtype)
            elif p.kind == "blob":
                kw[p.name] = bytes(p.size)
            elif not p.value or not expr.names(p.value):
                kw[p.name] = expr.evaluate(p.value, {}) if p.value else 1
            elif p.value in qdims:
                kw[p.name] = qdims[p.value]
        kw.update({d: qdims[d] for d in c.accepted if d not in c.names})
        b = c.bind(kw)
        want = tuple(expr.evaluate(g, env) for g in rec.grid) + (1,) * (3 - len(rec.grid))
        assert b.grid == want, rec.name
        for p, (t, v) in zip(rec.params, b.values, strict=True):
            assert t == ("ptr" if p.kind == "pointer" else "bytes" if p.kind == "blob" else p.type)
            if p.kind == "scalar" and p.value and expr.names(p.value):
                assert v == expr.evaluate(p.value, env), (rec.name, p.name)
        count += 1
    assert count > 200


def _slots(address: int, n: int) -> list[int]:
    return list((ctypes.c_void_p * n).from_address(address))


@pytest.mark.parametrize("make", [softplus, conv1d, ssm_step, gemm_wgmma, typed_scalars])
def test_packer_lays_out_what_packed_params_does(make):
    rec = make()
    c = contract(rec)
    rng = random.Random(rec.name)
    values = []
    for p in rec.params:
        if p.kind == "blob":
            values.append(("bytes", bytes(rng.randrange(256) for _ in range(p.size))))
        elif p.kind == "pointer" or p.type in ("u32", "u64", "i32", "i64"):
            t = "ptr" if p.kind == "pointer" else p.type
            values.append((t, rng.randrange(0, 1 << 31)))
        else:
            values.append((p.type, rng.uniform(-1, 1)))
    aligns = [64 if t == "bytes" else 0 for t, _ in values]
    ours, theirs = c.packer.pack(values), PackedParams(values, aligns)
    for (t, v), a, b in zip(values, _slots(ours.address, len(values)), _slots(theirs.address, len(values)),
                            strict=True):
        width = len(v) if t == "bytes" else struct.calcsize(PACK_FORMATS[t])
        assert ctypes.string_at(a, width) == ctypes.string_at(b, width)
        assert a % (64 if t == "bytes" else 16) == 0


# ---- tensors, streams, the positional path ------------------------------------------------------------------------


def test_describe():
    t = describe(T(12, "bf16", device=("cuda", 3)))
    assert (t.dtype, t.numel, t.contiguous, t.device, t.ordinal, t.owner) == ("bf16", 12, True, "cuda", 3, "torch")
    t = describe(FakeCAI([3, 4], "<i8", device=1))
    assert (t.dtype, t.numel, t.ordinal, t.owner, t.readonly) == ("i64", 12, 1, "cupy", False)
    t = describe(FakeDLPack([3, 4, 5], "u8", device_type=13, byte_offset=16))
    assert (t.dtype, t.numel, t.device, t.owner) == ("u8", 60, "cuda_managed", "jax")
    assert describe(np.zeros((2, 3), np.float64)).dtype == "f64" and describe(np.zeros(3)).device == "cpu"
    assert not describe(np.zeros((4, 4), np.float32)[:, :2]).contiguous
    assert describe(FakeDLPack([0, 3], strides=[7, 9])).contiguous  # empty: nothing to stride over
    for v in (1, 2.0, b"x", "s", None, object()):
        assert describe(v) is None


class _CudaStreamProtocol:
    def __cuda_stream__(self):
        return (0, 0x1234)


def test_streams(monkeypatch):
    handle = types.SimpleNamespace(getPtr=lambda: 0xABC)
    assert streams.stream_handle(7) == 7 and streams.stream_handle(0) == 0
    assert streams.stream_handle(_CudaStreamProtocol()) == 0x1234
    assert streams.stream_handle(types.SimpleNamespace(cuda_stream=0x55)) == 0x55  # torch
    assert streams.stream_handle(types.SimpleNamespace(ptr=0x66)) == 0x66  # CuPy
    assert streams.stream_handle(types.SimpleNamespace(handle=handle)) == 0xABC  # gpu.driver.Stream
    assert streams.stream_handle(handle) == 0xABC  # a bare CUstream
    for bad, match in ((True, "is a bool"), (-1, "not a 64-bit"), (object(), "is not a CUDA stream"),
                       (types.SimpleNamespace(__cuda_stream__=lambda: 5), "not \\(version, handle\\)"),
                       (types.SimpleNamespace(ptr="x"), "gave a str")):
        with pytest.raises(LaunchRefused, match=match):
            streams.stream_handle(bad)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # other tests on a GPU machine import both
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    assert streams.resolve_stream(None) == streams.CU_STREAM_PER_THREAD == 2
    assert streams.resolve_stream(None, "torch", 1) == 2  # torch not imported: the per-thread stream
    calls = []
    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
        current_stream=lambda dev: calls.append(dev) or types.SimpleNamespace(cuda_stream=0x77)))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert streams.resolve_stream(None, "torch", 1) == 0x77 and calls == [1]
    assert streams.resolve_stream(0x99, "torch", 1) == 0x99
    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace(cuda=types.SimpleNamespace(
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x88))))  # older CuPy: no device argument
    assert streams.resolve_stream(None, "cupy", 0) == 0x88
    assert streams.resolve_stream(None, "jax", 0) == 2


def test_typed_positional_path():
    ps = typed_scalars().params
    args = [T(100), -5, 7, 3, 4, 2, 0.5, 10, 100]
    values, aligns = typed_params(ps, args, "k", device=0)
    assert values[0][0] == "ptr" and values[1:3] == [("i32", -5), ("u32", 7)] and values[5] == ("f32", 2.0)
    assert typed_params(ps, [0x7F0000001000, *args[1:]], "k")[0][0] == ("ptr", 0x7F0000001000)  # power users
    assert typed_params(ps, [np.uint64(16), *args[1:]], "k")[0][0] == ("ptr", 16)
    assert typed_params(ps, [T(1), *args[1:]], "k")[0][0][0] == "ptr"  # element counts are not checked here
    for i, bad, match in ((1, 2.0, r"argument 1 \(a\) of k is a float"), (2, -1, "does not fit u32"),
                          (1, 1 << 31, "does not fit i32"), (3, True, "is a bool"),
                          (0, T(100, "bf16"), "is bf16; the parameter is f32"),
                          (0, T(100, device=("cuda", 1)), "is on device 1"),
                          (0, T(100, device=("cpu", None)), "cpu memory"), (0, T(100, contiguous=False), "contiguous"),
                          (0, FakeCAI([100], readonly=True), "read-only"), (0, True, "is a bool"),
                          (0, -1, "not a 64-bit device address"), (0, "p", "neither a tensor nor an int address")):
        with pytest.raises(LaunchRefused, match=match):
            typed_params(ps, [*args[:i], bad, *args[i + 1:]], "k", device=0)
    with pytest.raises(LaunchRefused, match="takes 9 arguments, 8 were given"):
        typed_params(ps, args[:-1], "k")
    g = gemm_wgmma().params
    gargs = [bytes(128), bytes(128), 1, 2, 3, 4, 4, 4]
    assert typed_params(g, gargs, "g")[1][:2] == [64, 64]
    with pytest.raises(LaunchRefused, match="is 64 bytes; the parameter is 128 bytes"):
        typed_params(g, [bytes(64), *gargs[1:]], "g")
    with pytest.raises(LaunchRefused, match="the parameter is a 128-byte blob"):
        typed_params(g, [5, *gargs[1:]], "g")
    dl = FakeDLPack([100])  # a DLPack producer is a tensor here too
    assert typed_params(ps, [dl, *args[1:]], "k", device=0)[0][0] == ("ptr", dl.ptr)
