"""Host emulation of the token-major sequence kernels (kernels/fixed/tokens.cu, mf/tokens.cuh) beside the decode
step (kernels/fixed/scan.cu, mf/decode.cuh): compiled by g++ against the scan tests' mock of the CUDA subset,
launched from the catalog's specs.

It proves on the CPU what issue 23 asks of them (the GPU tests prove it on the hardware): the float64 references
agree; the scan over L equals L successive launches at L = 1 and equals L successive ssm_step_forward_fused steps
(the production decode step) bit for bit, out and state; any split of L into chunks gives the same bits; the conv
likewise against itself at L = 1 and any chunking. A negative control (a step whose state is nudged by one ulp)
is told apart. Skips without g++ -std=c++20.
"""

from __future__ import annotations

import numpy as np
import pytest
from host_emulation import LAUNCH_CPP, ROOT, compile_emulator, entries_cpp, generated_wrappers, run_spec
from test_ref_scan import _MOCK_COMMON

from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.qualify import fills
from mamba_forge.qualify import spec as S
from mamba_forge.qualify.outputs import load_callable
from mamba_forge.references import tokens as ref

_MOCK = _MOCK_COMMON + r"""
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
struct uint2 { unsigned x, y; };  // named by mf/tokens.cuh's 16-bit load path (not instantiated here: f32 only)
#include <condition_variable>
#include <mutex>
// PTX named barriers (bar.sync / bar.arrive id, n): sync counts and waits for the n-th thread, arrive counts and
// goes on; the n-th completes the phase. Blocks run one after another here, so one set serves every block.
struct MfNamedBar { std::mutex m; std::condition_variable cv; int count = 0; unsigned long phase = 0; };
inline MfNamedBar g_named_bars[16];
inline void mf_named_bar(int id, int n, bool wait) {
  MfNamedBar& b = g_named_bars[id];
  std::unique_lock<std::mutex> lk(b.m);
  if (++b.count == n) { b.count = 0; ++b.phase; b.cv.notify_all(); return; }
  if (!wait) return;
  const unsigned long ph = b.phase;
  b.cv.wait(lk, [&] { return b.phase != ph; });
}
"""


_FIXED = load_catalog(default_catalog_path()).module("Fixed")
# the warp-specialised scan's f32 symbols (every instance the catalog declares)
_WS_NAMES = sorted(s.name for s in _FIXED.symbols if s.family == "ssm_scan_tokens_ws" and s.dtype == "f32")
_EMU_NAMES = ["ssm_step_forward_fused_f32", "ssm_scan_tokens_f32", "ssm_scan_tokens_save_f32", "conv1d_tokens_silu_f32",
              "conv1d_tokens_silu_vec_f32", *_WS_NAMES]
# scan.cu and tokens.cu, then the catalog's generated wrappers (the text NVRTC compiles), then the launcher
_EMU_INCLUDES = "#include <thread>\n#include <vector>\n#include <utility>\n#include <cstring>\n#include SCAN_CU\n#include TOKENS_CU\n"


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokens-emu")
    source = _EMU_INCLUDES + generated_wrappers(_EMU_NAMES) + LAUNCH_CPP + entries_cpp(_EMU_NAMES)
    return compile_emulator(d, {"mock/mf/common.cuh": _MOCK}, source,
                            [f"-I{d / 'mock'}", f'-DSCAN_CU="{ROOT / "kernels/fixed/scan.cu"}"',
                             f'-DTOKENS_CU="{ROOT / "kernels/fixed/tokens.cu"}"', "-DMF_STATE_CAP=64"])

def _spec(name: str, dims: dict[str, int]) -> S.LaunchSpec:
    sym = next(s for s in _FIXED.symbols if s.name == name)
    return S.evaluate(sym, _FIXED.family(sym.family), dims)


def _launch(lib, name: str, dims: dict[str, int], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `name` at `dims` on copies of `arrays` (by parameter name; outputs start as NaN): every buffer after."""
    return run_spec(lib, _spec(name, dims), arrays)


def _scan_inputs(rng, b, L, d, n, r):
    return {
        "state": rng.uniform(-1, 1, (b, d, n)), "u": rng.uniform(-1, 1, (b, L, d)), "dt": rng.uniform(-4, 0, (b, L, d)),
        "dt_bias": rng.uniform(-1, 1, d), "A_log": rng.uniform(-1, 1.5, (d, n)),
        "x_dbl": rng.uniform(-1, 1, (b, L, r + 2 * n)), "Dp": rng.uniform(-1, 1, d), "xz": rng.uniform(-3, 3, (b, L, 2 * d)),
    }


def _scan(lib, x, b, L, d, n, r, l0=0, l1=None, state=None, name="ssm_scan_tokens_f32"):
    """ssm_scan_tokens (or `name`) over timesteps l0 .. l1 of x (from `state`, default x's)."""
    l1 = L if l1 is None else l1
    part = {k: v[:, l0:l1] for k, v in x.items() if k in ("u", "dt", "x_dbl", "xz")}
    dims = {"batch": b, "d_inner": d, "d_state": n, "dt_rank": r, "L": l1 - l0}
    got = _launch(lib, name, dims, {**x, **part, "state": x["state"] if state is None else state})
    return got["out"].reshape(b, l1 - l0, d), got["state"]


# (d_inner, d_state, dt_rank) multiples of 4: the vector loads (one and two slices); the others the scalar path;
# L past one 16-step tile, partial last tiles, several 32-channel blocks
SCAN_DIMS = [(2, 37, 70, 16, 8), (1, 20, 64, 32, 16), (3, 9, 5, 35, 13), (1, 17, 130, 10, 4), (2, 40, 96, 16, 8)]


@pytest.mark.parametrize("b,L,d,n,r", SCAN_DIMS)
def test_scan_tokens_matches_the_float64_reference(emu, b, L, d, n, r):
    x = {k: v.astype(np.float32) for k, v in _scan_inputs(np.random.default_rng(1), b, L, d, n, r).items()}
    out, state = _scan(emu, x, b, L, d, n, r)
    want_out, want_state = ref.scan_tokens(x["state"], x["u"], x["dt"], x["dt_bias"], x["A_log"], x["x_dbl"], x["Dp"],
                                           x["xz"], r)
    assert np.all(np.isfinite(out)), "out not fully written"
    assert np.max(np.abs(out - want_out)) <= 2e-5 * max(1.0, np.max(np.abs(want_out)))
    assert np.max(np.abs(state - want_state.ravel())) <= 2e-5 * max(1.0, np.max(np.abs(want_state)))


@pytest.mark.parametrize("b,L,d,n,r", SCAN_DIMS)
def test_scan_tokens_equals_the_decode_step_bit_for_bit(emu, b, L, d, n, r):
    """scan(L) == L x scan(1) == L x ssm_step_forward_fused, and chunked == whole, out and state, every bit."""
    x = {k: v.astype(np.float32) for k, v in _scan_inputs(np.random.default_rng(2), b, L, d, n, r).items()}
    out, state = _scan(emu, x, b, L, d, n, r)
    st1 = stp = x["state"].ravel().copy()
    for t in range(L):
        o1, st1 = _scan(emu, x, b, L, d, n, r, t, t + 1, st1)
        # z read in place from the step's xz rows (z_pad = d_inner), as the layer's decode passes it
        step = _launch(emu, "ssm_step_forward_fused_f32",
                       {"batch": b, "d_inner": d, "d_state": n, "dt_rank": r, "z_pad": d},
                       {"state": stp, "u": x["u"][:, t], "dt": x["dt"][:, t], "dt_bias": x["dt_bias"],
                        "A_log": x["A_log"], "x_dbl": x["x_dbl"][:, t], "Dp": x["Dp"],
                        "z": np.ascontiguousarray(x["xz"][:, t]).ravel()[d:]})
        stp = step["state"]
        assert np.array_equal(o1[:, 0].view(np.uint32), out[:, t].view(np.uint32)), f"scan(1) at t={t}"
        assert np.array_equal(step["out"].reshape(b, d).view(np.uint32), out[:, t].view(np.uint32)), f"step at t={t}"
    assert np.array_equal(st1.view(np.uint32), state.view(np.uint32))
    assert np.array_equal(stp.view(np.uint32), state.view(np.uint32))
    _assert_chunks_agree(emu, x, (b, L, d, n, r), [0, 1, L // 3 + 1, L], out, state)


def _assert_chunks_agree(lib, x, dims, cut, out, state, name="ssm_scan_tokens_f32"):
    """`name` over the chunks between the `cut` points, each from the last one's state: out and state as one call."""
    b, L, d, n, r = dims
    st, parts = x["state"].ravel().copy(), []
    for l0, l1 in zip(cut, cut[1:], strict=False):
        if l1 > l0:
            o, st = _scan(lib, x, b, L, d, n, r, l0, l1, st, name=name)
            parts.append(o)
    assert np.array_equal(np.concatenate(parts, axis=1).view(np.uint32), out.view(np.uint32))
    assert np.array_equal(st.view(np.uint32), state.view(np.uint32))


# d_state <= 16 (the warp-specialised scan's range): several batch rows, partial last tiles, edge channel blocks,
# scalar loads (d_inner or dt_rank not a multiple of 4), L of one step and of several tiles
WS_DIMS = [(2, 37, 70, 16, 8), (3, 9, 5, 13, 13), (1, 17, 130, 10, 4), (2, 40, 96, 16, 8), (4, 1, 20, 16, 4)]


@pytest.mark.parametrize("name", _WS_NAMES)
@pytest.mark.parametrize("b,L,d,n,r", WS_DIMS)
def test_warp_specialised_scan_equals_the_four_lane_scan_bit_for_bit(emu, name, b, L, d, n, r):
    """ssm_scan_tokens_ws (producer warps staging a ring, scan warps of eight lanes) gives ssm_scan_tokens' bits, out
    and final state, whole and chunked: so the runtime may pick either by shape."""
    x = {k: v.astype(np.float32) for k, v in _scan_inputs(np.random.default_rng(6), b, L, d, n, r).items()}
    out, state = _scan(emu, x, b, L, d, n, r)
    got, got_state = _scan(emu, x, b, L, d, n, r, name=name)
    assert np.array_equal(got.view(np.uint32), out.view(np.uint32))
    assert np.array_equal(got_state.view(np.uint32), state.view(np.uint32))
    _assert_chunks_agree(emu, x, (b, L, d, n, r), [0, 1, L // 2 + 1, L], out, state, name=name)


# L past one, two and three 256-step chunks (partial and whole last chunks), d_state of one and two slices
SAVE_DIMS = [(2, 530, 20, 16, 8), (1, 256, 9, 16, 4), (1, 257, 8, 32, 16), (2, 40, 12, 16, 4)]


@pytest.mark.parametrize("b,L,d,n,r", SAVE_DIMS)
def test_saving_scan_gives_the_scan_bits_and_the_states_before_each_chunk(emu, b, L, d, n, r):
    """ssm_scan_tokens_save: out and final state are ssm_scan_tokens' bits; saved[:, :, c] is, bit for bit, the state
    a 256-step chunked scan holds before chunk c (the training forward's saves), and agrees with the float64
    reference's states."""
    x = {k: v.astype(np.float32) for k, v in _scan_inputs(np.random.default_rng(8), b, L, d, n, r).items()}
    out, state = _scan(emu, x, b, L, d, n, r)
    dims = {"batch": b, "d_inner": d, "d_state": n, "dt_rank": r, "L": L}
    got = _launch(emu, "ssm_scan_tokens_save_f32", dims, x)
    assert np.array_equal(got["out"].reshape(b, L, d).view(np.uint32), out.view(np.uint32))
    assert np.array_equal(got["state"].view(np.uint32), state.view(np.uint32))
    nc = -(-L // 256)
    saved = got["saved"].reshape(b, d, nc, n)
    st = x["state"].ravel().copy()
    for c in range(nc):
        assert np.array_equal(saved[:, :, c].ravel().view(np.uint32), st.view(np.uint32)), f"chunk {c}"
        _, st = _scan(emu, x, b, L, d, n, r, 256 * c, min(L, 256 * (c + 1)), st)
    want = ref.ssm_scan_tokens_save({k: v.ravel() for k, v in x.items()}, dims)["saved"].reshape(b, d, nc, n)
    assert np.max(np.abs(saved - want)) <= 2e-5 * max(1.0, np.max(np.abs(want)))


def test_saved_state_comparison_tells_a_one_ulp_input_apart(emu):
    """Negative control for the test above: one input of the step before chunk 1 nudged by one ulp saves other bits."""
    b, L, d, n, r = 1, 300, 8, 16, 4
    x = {k: v.astype(np.float32) for k, v in _scan_inputs(np.random.default_rng(9), b, L, d, n, r).items()}
    dims = {"batch": b, "d_inner": d, "d_state": n, "dt_rank": r, "L": L}
    a = _launch(emu, "ssm_scan_tokens_save_f32", dims, x)["saved"]
    y = {**x, "u": x["u"].copy()}
    y["u"][0, 255, 5] = np.nextafter(y["u"][0, 255, 5], np.float32(np.inf))
    bsv = _launch(emu, "ssm_scan_tokens_save_f32", dims, y)["saved"]
    assert not np.array_equal(a.reshape(b, d, 2, n)[:, :, 1].view(np.uint32), bsv.reshape(b, d, 2, n)[:, :, 1].view(np.uint32))


def test_bitwise_comparison_tells_a_one_ulp_input_apart(emu):
    """Negative control: the same comparison with one input nudged by one ulp differs, in out and in state."""
    b, L, d, n, r = 1, 5, 8, 16, 4
    x = {k: v.astype(np.float32) for k, v in _scan_inputs(np.random.default_rng(3), b, L, d, n, r).items()}
    out, state = _scan(emu, x, b, L, d, n, r)
    y = {**x, "u": x["u"].copy()}
    y["u"][0, 2, 3] = np.nextafter(y["u"][0, 2, 3], np.float32(np.inf))
    out2, state2 = _scan(emu, y, b, L, d, n, r)
    assert not np.array_equal(out.view(np.uint32), out2.view(np.uint32))
    assert not np.array_equal(state.view(np.uint32), state2.view(np.uint32))


def _conv(lib, xz, state, weight, bias, b, L, d, w, l0=0, l1=None, name="conv1d_tokens_silu_f32"):
    l1 = L if l1 is None else l1
    dims = {"batch": b, "d": d, "L": l1 - l0, "width": w}
    got = _launch(lib, name, dims, {"xz": xz[:, l0:l1], "conv_state": state, "weight": weight, "bias": bias})
    return got["out"].reshape(b, l1 - l0, d), got["conv_state"]


def _conv_inputs(rng, b, L, d, w):
    xz = rng.uniform(-2, 2, (b, L, 2 * d)).astype(np.float32)
    st0 = rng.uniform(-2, 2, (b, d, max(w - 1, 1))).astype(np.float32)[:, :, :w - 1].copy()
    return xz, st0, rng.uniform(-1, 1, (d, w)).astype(np.float32), rng.uniform(-1, 1, d).astype(np.float32)


@pytest.mark.parametrize("b,L,d,w", [(2, 77, 130, 4), (1, 33, 5, 3), (3, 2, 129, 4), (1, 40, 64, 2), (2, 9, 7, 2)])
def test_conv_tokens_matches_the_reference_and_itself_chunked(emu, b, L, d, w):
    xz, st0, weight, bias = _conv_inputs(np.random.default_rng(4), b, L, d, w)
    out, st = _conv(emu, xz, st0, weight, bias, b, L, d, w)
    want, want_st = ref.conv_tokens(st0, xz, weight, bias, w)
    assert np.all(np.isfinite(out))
    assert np.max(np.abs(out - want)) <= 1e-6 * max(1.0, np.max(np.abs(want)))
    assert np.array_equal(st, want_st.astype(np.float32).ravel())  # the state is a copy of inputs: exact
    for cut in ([0, 1, L], [0, L // 2, L], list(range(L + 1))):
        s, parts = st0.ravel().copy(), []
        for l0, l1 in zip(cut, cut[1:], strict=False):
            if l1 > l0:
                o, s = _conv(emu, xz, s, weight, bias, b, L, d, w, l0, l1)
                parts.append(o)
        assert np.array_equal(np.concatenate(parts, axis=1).view(np.uint32), out.view(np.uint32)), cut
        assert np.array_equal(s.view(np.uint32), st.view(np.uint32)), cut


# d % 4 == 0: the vector path (d 1032: three channel blocks); otherwise element by element, with a last thread
# of fewer than 4 channels
@pytest.mark.parametrize("b,L,d,w", [(2, 1, 16, 4), (3, 3, 1032, 4), (1, 4, 24, 3), (2, 2, 8, 2), (4, 1, 2048, 4),
                                     (2, 1, 13, 4), (1, 3, 5, 3), (3, 2, 1030, 4)])
def test_vectorised_conv_equals_the_tiled_conv_bit_for_bit(emu, b, L, d, w):
    """conv1d_tokens_silu_vec (4 channels a thread, walking L) gives conv1d_tokens_silu's bits, out and state, at
    L = 1 (a decode step) and over a few timesteps, whole and step by step: so the op may serve decode from it."""
    xz, st0, weight, bias = _conv_inputs(np.random.default_rng(8), b, L, d, w)
    out, st = _conv(emu, xz, st0, weight, bias, b, L, d, w)
    got, got_st = _conv(emu, xz, st0, weight, bias, b, L, d, w, name="conv1d_tokens_silu_vec_f32")
    assert np.all(np.isfinite(got))
    assert np.array_equal(got.view(np.uint32), out.view(np.uint32))
    assert np.array_equal(got_st.view(np.uint32), st.view(np.uint32))
    s, parts = st0.ravel().copy(), []
    for l0 in range(L):  # one decode step at a time, the state carried
        o, s = _conv(emu, xz, s, weight, bias, b, L, d, w, l0, l0 + 1, name="conv1d_tokens_silu_vec_f32")
        parts.append(o)
    assert np.array_equal(np.concatenate(parts, axis=1).view(np.uint32), out.view(np.uint32))
    assert np.array_equal(s.view(np.uint32), st.view(np.uint32))


def test_vectorised_conv_comparison_tells_a_one_ulp_weight_apart(emu):
    """Negative control for the test above: a tap nudged by one ulp changes the vectorised conv's output."""
    b, L, d, w = 2, 1, 16, 4
    xz, st0, weight, bias = _conv_inputs(np.random.default_rng(9), b, L, d, w)
    out, _ = _conv(emu, xz, st0, weight, bias, b, L, d, w)
    nudged = weight.copy()
    nudged[3, 1] = np.nextafter(nudged[3, 1], np.float32(np.inf))
    got, _ = _conv(emu, xz, st0, nudged, bias, b, L, d, w, name="conv1d_tokens_silu_vec_f32")
    differs = got.view(np.uint32) != out.view(np.uint32)
    assert differs.any() and not differs[:, :, [c for c in range(d) if c != 3]].any()


def test_catalog_references_write_every_output():
    for name in ("ssm_scan_tokens_f32", "conv1d_tokens_silu_f32", "conv1d_tokens_silu_vec_f32"):
        sym = next(s for s in _FIXED.symbols if s.name == name)
        sp = S.evaluate(sym, _FIXED.family(sym.family))
        rng = np.random.default_rng(5)
        args = {b.name: fills.make_input(b, "uniform", rng).astype(np.float64) for b in sp.buffers if b.needs_fill}
        reference = load_callable(_FIXED.family(sym.family).qualify.reference)  # the one the qualifier calls
        want = reference(args | {s.name: s.value for s in sp.scalars}, sp.dims)
        assert {b.name for b in sp.outputs} == set(want), name
        for b in sp.outputs:
            assert want[b.name].size == b.count and np.all(np.isfinite(want[b.name])), (name, b.name)
