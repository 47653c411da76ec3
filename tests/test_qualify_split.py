"""The qualifier's split check (mamba_forge/qualify/split.py) on the CPU.

* the pure parts: chunk bounds, [batch, L, rest] layouts, cutting and putting back rows, the first difference
  named by batch row, sequence position and element;
* `prove` with NumPy kernels: a running sum that carries its state passes; its twin whose first position of each
  call is fused (one rounding instead of two) fails, naming the chunk length, the param and the position;
* end to end through the worker (`SymbolRun`) on the emulated driver of tests/test_qualify_emulated.py, with the
  negative-control fixture's CUDA source (tests/fixtures/qualify_negative/src/split.cu) compiled by g++ as the
  kernels: the control is admitted with a passing split check, the fma twin rejected by it and only by it;
* the built-in token families (kernels/fixed/tokens.cu, host-emulated as in tests/test_tokens_emulated.py) pass
  `prove` at their qualification dims and declared chunks, and a carry nudged by one ulp is told apart.

Skips the g++ parts without g++ -std=c++20. tests/gpu/test_qualify_split_gpu.py runs the same on the GPU.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
import test_qualify_emulated as TQE
from host_emulation import LAUNCH_CPP, compile_emulator, cuda_mock, entries_cpp, run_spec
from test_qualify_emulated import emulated  # noqa: F401 - the emulated driver fixture
from test_tokens_emulated import emu  # noqa: F401 - the token kernels' host emulation (module scope)

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import checks as C
from mamba_forge.qualify import spec as S
from mamba_forge.qualify import split as SP
from mamba_forge.qualify import worker as W
from mamba_forge.report.classes import reason_class

FIXTURE = Path(__file__).parent / "fixtures" / "qualify_negative"
SPLIT_KERNELS = ("control_split_running_sum", "split_variant_running_sum")
f32 = np.float32


def _fixture(name: str):
    cat = load_catalog(FIXTURE / "catalog.toml")
    sym = cat.symbols[name]
    return cat, sym, cat.module(sym.module).family(sym.family)


# ---- the pure parts -------------------------------------------------------------------------------------------


def test_chunk_bounds_cover_the_sequence_in_order():
    assert SP.chunk_bounds(37, 5) == [(0, 5), (5, 10), (10, 15), (15, 20), (20, 25), (25, 30), (30, 35), (35, 37)]
    assert SP.chunk_bounds(37, 1) == [(i, i + 1) for i in range(37)]
    assert SP.chunk_bounds(4, 4) == [(0, 4)] and SP.chunk_bounds(3, 16) == [(0, 3)]
    with pytest.raises(ValueError, match="chunks of 0"):
        SP.chunk_bounds(5, 0)


def test_layout_of_a_sequence_buffer_and_where_an_index_lies():
    _, sym, fam = _fixture("control_split_running_sum")
    spec = S.evaluate(sym, fam)
    out = next(b for b in spec.buffers if b.name == "out")
    lay = SP.layout(out, 3, 37)
    assert lay == SP.Layout(3, 37, 130)
    assert lay.where(0) == (0, 0, 0) and lay.where(130 * 37 + 130 * 14 + 3) == (1, 14, 3)
    assert lay.where(out.count - 1) == (2, 36, 129)
    with pytest.raises(S.SpecError, match="'out' holds 14430 elements, not 3 rows x 36 positions"):
        SP.layout(out, 3, 36)


def test_take_and_put_cut_rows_and_put_them_back():
    rng = np.random.default_rng(0)
    lay = SP.Layout(3, 11, 4)
    full = rng.standard_normal(3 * 11 * 4).astype(f32)
    shaped = full.reshape(3, 11, 4)
    part = SP.take(full, lay, 2, 7)
    assert part.shape == (3 * 5 * 4,) and part.flags.c_contiguous
    assert np.array_equal(part.reshape(3, 5, 4), shaped[:, 2:7])
    for chunk in (1, 3, 4, 11):
        back = np.zeros_like(full)
        for l0, l1 in SP.chunk_bounds(11, chunk):
            SP.put(back, SP.take(full, lay, l0, l1), lay, l0, l1)
        assert np.array_equal(back, full)


def test_first_difference_names_row_position_element_values_and_bits():
    lay = SP.Layout(3, 37, 130)
    want = np.linspace(-1, 1, 3 * 37 * 130).astype(f32)
    got = want.copy()
    assert SP.first_difference("out", "f32", want.tobytes(), got.tobytes(), lay, True) == ""
    i = 2 * 130 * 37 + 130 * 14 + 3  # a positive element: one ulp up is bits + 1
    got[i] = np.nextafter(got[i], f32(2))
    got[i + 500] = 0
    msg = SP.first_difference("out", "f32", want.tobytes(), got.tobytes(), lay, True)
    bits = int(want[i : i + 1].view(np.uint32)[0])
    assert msg.startswith(f"out differs at batch row 2, position 14, element 3: {str(got[i])} (0x")
    assert f"(0x{bits + 1:08x}) chunked, " in msg and f"(0x{bits:08x}) in one call" in msg
    assert msg.endswith("(2 of 14430 elements differ)") and str(got[i]) == "0.58611137"  # f32's shortest text
    state = np.ones(3 * 130, f32)
    moved = state.copy()
    moved[2 * 130 + 7] = 2
    msg = SP.first_difference("state", "f32", state.tobytes(), moved.tobytes(), SP.Layout(3, 1, 130), False)
    assert msg == ("the final state differs at batch row 2, element 7: 2.0 (0x40000000) chunked, 1.0 (0x3f800000) "
                   "in one call (1 of 390 elements differ)")
    half = np.ones(8, np.float16)
    other = half.copy()
    other[5] = 3
    assert "element 5: 3.0 (0x4200) chunked, 1.0 (0x3c00) in one call" in SP.first_difference(
        "state", "f16", half.tobytes(), other.tobytes(), SP.Layout(1, 1, 8), False)


def test_a_split_difference_has_its_own_reason_class():
    assert reason_class(SP.CHECK) == "split-variant"


# ---- prove with NumPy kernels ---------------------------------------------------------------------------------


def numpy_running_sum(fused_first: bool, calls: list | None = None):
    """The fixture's kernels in NumPy: a sequential f32 running sum from the carried state; `fused_first`: the
    first position of a call rounds w * x + s once (as fmaf), the others the product and then the sum."""

    def launch(spec: S.LaunchSpec, ins: dict[str, np.ndarray]) -> dict[str, bytes]:
        b, L, c = spec.dims["batch"], spec.dims["L"], spec.dims["channels"]
        if calls is not None:
            calls.append((L, {k: v.copy() for k, v in ins.items()}))
        x, w = ins["x"].reshape(b, L, c), ins["w"]
        s = ins["state"].reshape(b, c).copy()
        out = np.empty((b, L, c), f32)
        for pos in range(L):
            if fused_first and pos == 0:
                s = (w.astype(np.float64) * x[:, pos] + s).astype(f32)
            else:
                s = (s + (w * x[:, pos]).astype(f32)).astype(f32)
            out[:, pos] = s
        return {"out": out.tobytes(), "state": s.tobytes()}

    return launch


def _prove(name: str, launch, chunks=None):
    _, sym, fam = _fixture(name)
    split = fam.split if chunks is None else fam.split.model_copy(update={"chunks": chunks})
    spec = S.evaluate(sym, fam)
    inputs = C.make_inputs(spec, "uniform", np.random.default_rng(7), False)
    return SP.prove(split, dict(fam.qualify.dims), lambda d: S.evaluate(sym, fam, d), inputs, launch), inputs


def test_prove_passes_a_kernel_that_carries_its_state():
    calls: list = []
    out, inputs = _prove("control_split_running_sum", numpy_running_sum(False, calls))
    assert out.passed, out.reason
    assert out.detail == ("out, state bitwise equal to one call over L = 37 when called over chunks of 1 (37 calls), "
                          "5 (8 calls), 16 (3 calls), carrying state")
    assert len(calls) == 1 + 37 + 8 + 3
    want = numpy_running_sum(False)(S.evaluate(*_fixture("control_split_running_sum")[1:]), inputs)
    assert out.digest == C.digest(want)
    # the chunk-5 calls: L = 5 (the last 2), x cut per batch row, w whole, state carried from the previous call
    five = calls[1 + 37 : 1 + 37 + 8]
    assert [L for L, _ in five] == [5] * 7 + [2]
    x = inputs["x"].reshape(3, 37, 130)
    state = inputs["state"]
    for k, (L, ins) in enumerate(five):
        assert np.array_equal(ins["x"].reshape(3, L, 130), x[:, 5 * k : 5 * k + L])
        assert np.array_equal(ins["w"], inputs["w"])
        assert np.array_equal(ins["state"], state)
        state = np.frombuffer(numpy_running_sum(False)(
            S.evaluate(*_fixture("control_split_running_sum")[1:], {"batch": 3, "channels": 130, "L": L}),
            ins)["state"], f32)


def test_prove_rejects_other_arithmetic_where_a_call_starts():
    out, _ = _prove("split_variant_running_sum", numpy_running_sum(True))
    assert not out.passed and out.chunk == 1
    assert re.match(r"called over chunks of L = 1 \(37 calls carrying state\): out differs at batch row 0, "
                    r"position 1, element \d+: \S+ \(0x[0-9a-f]{8}\) chunked, \S+ \(0x[0-9a-f]{8}\) in one call "
                    r"\(\d+ of 14430 elements differ\); its bits depend on how a sequence is split into calls$",
                    out.reason), out.reason
    assert out.detail.startswith("called over chunks of L = 1 (37 calls carrying state): out differs at batch row 0")
    only16, _ = _prove("split_variant_running_sum", numpy_running_sum(True), chunks=[16])
    assert not only16.passed and only16.chunk == 16
    assert "chunks of L = 16 (3 calls carrying state): out differs at batch row 0, position 16, element" in only16.reason


def test_prove_rejects_a_kernel_that_does_not_read_the_carried_state():
    good = numpy_running_sum(False)

    def fresh_start(spec, ins):  # starts every call from zero: the one call agrees, calls after the first do not
        return good(spec, {**ins, "state": np.zeros_like(ins["state"])})

    out, _ = _prove("control_split_running_sum", fresh_start, chunks=[16])
    assert not out.passed and "out differs at batch row 0, position 16, element 0" in out.reason, out.reason


# ---- end to end through the worker on the emulated driver, the fixture's CUDA source compiled by g++ -----------

_SPLIT_MOCK = cuda_mock("the split controls") + r"""
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
"""
_SPLIT_CPP = '#include "split.cu"\n' + LAUNCH_CPP + entries_cpp(SPLIT_KERNELS)


@pytest.fixture(scope="module")
def split_lib(tmp_path_factory):
    d = tmp_path_factory.mktemp("split-emu")
    return compile_emulator(d, {"mock.h": _SPLIT_MOCK}, _SPLIT_CPP,
                            [f"-I{FIXTURE / 'src'}", "-include", str(d / "mock.h"), "-ffp-contract=off"])


@pytest.fixture()
def split_driver(emulated, split_lib, monkeypatch):  # noqa: F811 - the imported fixture
    """The emulated driver, launching the split controls through their g++ build on the fake device memory."""
    ctx, launches = emulated
    mem = cu.mem_alloc.__self__  # the emulated fixture's FakeMemory
    types = ["ptr", "ptr", "ptr", "ptr", "i32", "i32", "i64"]
    for name in SPLIT_KERNELS:
        monkeypatch.setitem(TQE.SIGNATURES, name, types)
    other = cu.launch

    def launch(fn, grid, block, params, *, smem=0, stream=None):
        if fn.name not in SPLIT_KERNELS:
            return other(fn, grid, block, params, smem=smem, stream=stream)
        launches.append(fn.name)
        given = (ctypes.c_void_p * len(types)).from_address(params.address)
        args, keep = (ctypes.c_void_p * len(types))(), []
        for i, t in enumerate(types):
            if t == "ptr":
                buf, off = mem.at(ctypes.c_uint64.from_address(given[i]).value)
                host = ctypes.c_void_p(ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) + off)
                keep.append(host)
                args[i] = ctypes.cast(ctypes.pointer(host), ctypes.c_void_p)
            else:
                args[i] = given[i]
        g = (ctypes.c_int * 3)(*(tuple(grid) + (1,) * (3 - len(grid))))
        b = (ctypes.c_int * 3)(*(tuple(block) + (1,) * (3 - len(block))))
        assert split_lib.run(fn.name.encode(), g, b, args) == 0

    monkeypatch.setattr(cu, "launch", launch)
    return ctx, launches


def _worker_run(ctx, name, seed=5):
    cat, _, _ = _fixture(name)
    return W.SymbolRun(ctx, cat, TQE.FakeModule(), {"seed": seed, "level": "quick"}, {"name": name, "build_layout": []},
                       {"module": "QualifySplit", "target": "sm_90a"}).run()


def test_worker_admits_the_control_with_a_passing_split_check(split_driver):
    ctx, launches = split_driver
    r = _worker_run(ctx, "control_split_running_sum")
    assert r.status == "admitted", r.reason
    names = [c.name for c in r.checks]
    assert names == ["admission", "correctness", "uninitialized", "repeat", "placement", "batch", "stream", "neighbour",
                     "address", "graph", "split", "bounds", "input-written", "timeout"]
    rec = next(c for c in r.checks if c.name == "split")
    assert rec.passed and rec.detail.startswith("out, state bitwise equal to one call over L = 37 when called over "
                                                "chunks of 1 (37 calls), 5 (8 calls), 16 (3 calls)")
    assert rec.digest == next(c for c in r.checks if c.name == "repeat").digest  # the same inputs, the same bits
    assert launches.count("control_split_running_sum") >= 49 and "mf_guard_check" in launches  # guards per call


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_worker_rejects_the_fma_twin_by_the_split_check_alone(split_driver, seed):
    ctx, _ = split_driver
    r = _worker_run(ctx, "split_variant_running_sum", seed)
    assert (r.status, r.check, reason_class(r.check)) == ("rejected", "split", "split-variant"), r.reason
    assert r.reason.startswith("split_variant_running_sum: called over chunks of L = 1 (37 calls carrying state): "
                               "out differs at batch row 0, position 1, element "), r.reason
    assert [c.name for c in r.checks if not c.passed] == ["split"]
    assert {"correctness", "repeat", "placement", "batch", "graph"} <= {c.name for c in r.checks if c.passed}


def test_the_fma_twin_differs_from_the_control_where_a_call_starts(split_lib):
    """The negative control's premise, on the compiled kernels: in one call the twin rounds its first position
    once (fmaf) and the control twice, so they differ there in some bit while agreeing to rounding everywhere."""
    _, sym, fam = _fixture("control_split_running_sum")
    spec = S.evaluate(sym, fam)
    inputs = C.make_inputs(spec, "uniform", np.random.default_rng(3), False)
    good = run_spec(split_lib, spec, inputs)
    bad = run_spec(split_lib, dataclasses.replace(spec, symbol="split_variant_running_sum"), inputs)
    g, b = good["out"].reshape(3, 37, 130), bad["out"].reshape(3, 37, 130)
    assert not np.array_equal(g[:, 0], b[:, 0])
    assert np.allclose(g, b, rtol=0, atol=1e-5)
    want = numpy_running_sum(False)(spec, inputs)  # the NumPy stand-in computes the control's bits
    assert good["out"].tobytes() == want["out"] and good["state"].tobytes() == want["state"]


# ---- the built-in token families, host-emulated ---------------------------------------------------------------


def _tokens(name: str):
    fixed = load_catalog(default_catalog_path()).module("Fixed")
    sym = next(s for s in fixed.symbols if s.name == name)
    return sym, fixed.family(sym.family)


def _emulated_launch(lib, nudge_carry: bool = False):
    def launch(spec: S.LaunchSpec, ins: dict[str, np.ndarray]) -> dict[str, bytes]:
        got = run_spec(lib, spec, ins)
        outs = {}
        for b in spec.outputs:
            v = got[b.name].astype(f32)
            if nudge_carry and b.role == "inout":  # a carry that is off by one ulp
                v = np.nextafter(v, f32(np.inf))
            outs[b.name] = v.tobytes()
        return outs

    return launch


@pytest.mark.parametrize("name", ["ssm_scan_tokens_f32", "conv1d_tokens_silu_f32"])
def test_the_token_families_pass_the_split_check_host_emulated(emu, name):  # noqa: F811 - the imported fixture
    sym, fam = _tokens(name)
    spec = S.evaluate(sym, fam)
    inputs = C.make_inputs(spec, "uniform", np.random.default_rng(11), False)
    out = SP.prove(fam.split, dict(fam.qualify.dims), lambda d: S.evaluate(sym, fam, d), inputs, _emulated_launch(emu))
    assert out.passed, out.reason
    chunks = ", ".join(f"{c} ({len(SP.chunk_bounds(fam.qualify.dims['L'], c))} calls)" for c in fam.split.chunks)
    assert f"when called over chunks of {chunks}, carrying {fam.split.carried[0]}" in out.detail
    bad = SP.prove(fam.split, dict(fam.qualify.dims), lambda d: S.evaluate(sym, fam, d), inputs,
                   _emulated_launch(emu, nudge_carry=True))
    assert not bad.passed and bad.chunk == fam.split.chunks[0], bad.reason
    assert f"called over chunks of L = {fam.split.chunks[0]}" in bad.reason


# ---- the negative control as NVRTC builds it for the GPU test ------------------------------------------------


def test_the_split_controls_build_and_only_the_twin_fuses(tmp_path):
    """NVRTC builds the QualifySplit module alone (what tests/gpu/test_qualify_split_gpu.py loads); both symbols
    are admitted by the build, the control's PTX rounds product and sum apart (no fma.rn.f32: the build's default
    --fmad=true may not contract __fmul_rn/__fadd_rn), and the twin's holds one fma."""
    from mamba_forge.build.builder import BuildRequest, build
    from mamba_forge.catalog.targets import get_target

    bm = build(BuildRequest(load_catalog(FIXTURE / "catalog.toml"), [get_target("sm_90a")], tmp_path, jobs=1,
                            cache_location=None, modules=("QualifySplit",)))
    (mod,) = bm.modules
    assert mod.status == "compiled", mod.log_head
    assert {s.name: s.verdict.status for s in mod.symbols} == dict.fromkeys(SPLIT_KERNELS, "admitted")
    ptx = (tmp_path / next(a.path for a in mod.artifacts if a.code == "ptx")).read_text()
    bodies = {name: ptx.split(f".entry {name}(", 1)[1].split(".entry ", 1)[0] for name in SPLIT_KERNELS}
    assert "fma.rn.f32" not in bodies["control_split_running_sum"]
    assert "mul.rn.f32" in bodies["control_split_running_sum"] and "add.rn.f32" in bodies["control_split_running_sum"]
    assert bodies["split_variant_running_sum"].count("fma.rn.f32") >= 1
