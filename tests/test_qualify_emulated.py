"""The worker's checks end to end on CPU, against an emulated driver: device memory is host bytearrays and the
negative-control kernels are NumPy stand-ins with the same misbehaviour (nondeterministic order, batch-variant
split, address dependence, wrong answer, unwritten tail, fault, hang, ABI and smem refusals, writes past the end,
before the start and into an input, reads of the output before writing it). The guard-check kernel is emulated
from its contract (first, last, count of differing bytes per region of its table). This proves the harness logic
(guards, poisoning, corpora, reference comparison, repeat, batch slicing, streams, address, graph replay) without
a GPU; tests/gpu/test_qualify_gpu.py runs the real kernels."""

from __future__ import annotations

import ctypes
import itertools
import struct
from pathlib import Path

import numpy as np
import pytest

from mamba_forge.catalog.model import load_catalog
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import checks as C
from mamba_forge.qualify import guards as G
from mamba_forge.qualify import spec as S
from mamba_forge.qualify import worker as W

FIXTURE = Path(__file__).parent / "fixtures" / "qualify_negative"
OPTIN = 232448
DETERMINISM = ("repeat", "placement", "batch", "stream", "neighbour", "address", "graph")


class FakeMemory:
    def __init__(self):
        self.blocks: dict[int, bytearray] = {}
        self.next = 0x7F0000000000

    def alloc(self, n: int) -> int:
        base = self.next
        self.blocks[base] = bytearray(max(1, n))
        self.next += -(-max(1, n) // 512) * 512 + 512
        return base

    def at(self, ptr: int) -> tuple[bytearray, int]:
        for base, buf in self.blocks.items():
            if base <= ptr < base + len(buf):
                return buf, ptr - base
        raise cu.CudaError("emulated access", "CUDA_ERROR_ILLEGAL_ADDRESS", hex(ptr))

    def view(self, ptr: int, dtype, count: int) -> np.ndarray:
        buf, off = self.at(ptr)
        return np.frombuffer(buf, dtype=dtype, count=count, offset=off)


class FakeStream:
    def __init__(self, sms: int = 132):
        self.hung = False
        self.sms, self.held = sms, 0  # emulated placement: block r runs on SM held + r % (sms - held)

    def sm_of(self, blocks: np.ndarray) -> np.ndarray:
        return self.held + blocks % (self.sms - self.held)

    def query_done(self) -> bool:
        return not self.hung

    def synchronize(self):
        pass

    def destroy(self):
        pass


SIGNATURES = {  # emulated kernels: parameter types as the kernel declares them
    "control_row_sum": ["ptr", "ptr", "i32", "i32"], "batch_variant_row_sum": ["ptr", "ptr", "i32", "i32"],
    "racy_row_sum": ["ptr", "ptr", "i32", "i32"], "control_smem_reverse": ["ptr", "ptr", "i32", "i32"],
    "nondet_sum": ["ptr", "ptr", "i64"], "oob_write": ["ptr", "ptr", "i64"], "spin_forever": ["ptr", "ptr", "i64"],
    "wrong_scale": ["ptr", "ptr", "i64"], "misses_tail": ["ptr", "ptr", "i64"], "address_variant": ["ptr", "ptr", "i64"],
    "control_scale_in_place": ["ptr", "ptr", "i64"], "neighbour_sum_not_in_place": ["ptr", "ptr", "i64"],
    "smem_over": ["ptr", "ptr", "i64"], "abi_mismatch": ["ptr", "i32", "ptr"],
    **{k: ["ptr", "ptr", "i64"] for k in ("writes_past_end", "writes_before_start", "writes_input",
                                          "accumulates_into_output")},
    "mf_guard_check": ["ptr", "ptr", "i32"],
    **{k: ["ptr", "ptr", "i32", "i32"] for k in ("smid_ordered_row_sum", "clock_ordered_row_sum",
                                                "smid_rotated_tree_row_sum", "control_tree_row_sum")},
    **{k: ["ptr", "ptr", "ptr", "i32", "i32", "i32"] for k in ("control_gemm_chain", "control_gemm_chain_2d",
                                                              "pairwise_gemm")},
    # the real catalog's multi-tensor AdamW: descs, num_tensors, lr, beta1, beta2, eps, step
    **{f"adamw_step_multi_{dt}": ["ptr", "i32", "f32", "f32", "f32", "f32", "i32"] for dt in ("f32", "bf16", "f16")},
}
_FMT = {"ptr": "<Q", "i32": "<i", "i64": "<q", "f32": "<f"}


def _layout(types):
    out, off = [], 0
    for t in types:
        size = 4 if t in ("i32", "f32") else 8
        off = -(-off // size) * size
        out.append((off, size))
        off += size
    return out


class FakeFunction:
    def __init__(self, name):
        self.name = name

    def attributes(self):
        return cu.FunctionAttributes(16, 4096 if self.name == "racy_row_sum" else 0, 0, 1024, 0, 90, 90)

    def set_max_dynamic_smem(self, n):
        if n > OPTIN:
            raise cu.CudaError("cuFuncSetAttribute", "CUDA_ERROR_INVALID_VALUE")

    def occupancy(self, threads, smem):
        return 4

    def param_layout(self):
        return _layout(SIGNATURES[self.name])


class FakeModule:
    def __init__(self, *a, **k):
        pass

    def function(self, name):
        if name not in SIGNATURES:
            raise cu.CudaError("cuModuleGetFunction", "CUDA_ERROR_NOT_FOUND")
        return FakeFunction(name)


class FakeGraph:
    def __init__(self, body):
        self.body = body

    @classmethod
    def capture(cls, stream, body):
        return cls(body)  # replay re-issues the captured work

    def launch(self, stream):
        self.body()

    def destroy(self):
        pass


@pytest.fixture()
def emulated(monkeypatch):
    mem = FakeMemory()
    rng = np.random.default_rng(123)
    launches: list[str] = []

    def launch(fn, grid, block, params, *, smem=0, stream=None):
        arr = (ctypes.c_void_p * len(SIGNATURES[fn.name])).from_address(params.address)
        vals = [struct.unpack(_FMT[t], ctypes.string_at(arr[i], struct.calcsize(_FMT[t])))[0]
                for i, t in enumerate(SIGNATURES[fn.name])]
        launches.append(fn.name)
        run_kernel(fn.name, vals, mem, rng, stream)

    monkeypatch.setattr(cu, "mem_alloc", mem.alloc)
    monkeypatch.setattr(cu, "mem_free", lambda p: mem.blocks.pop(p))
    monkeypatch.setattr(cu, "memcpy_htod", lambda dst, src, n=None: _put(mem, dst, bytes(src)))
    monkeypatch.setattr(cu, "memcpy_dtoh", lambda src, n: bytes(_get(mem, src, n)))
    monkeypatch.setattr(cu, "memcpy_dtod", lambda dst, src, n, stream=None: _put(mem, dst, bytes(_get(mem, src, n))))
    monkeypatch.setattr(cu, "memset_d8", lambda dst, v, n, stream=None: _put(mem, dst, bytes([v]) * n))
    monkeypatch.setattr(cu, "launch", launch)
    monkeypatch.setattr(cu, "context_synchronize", lambda: None)
    monkeypatch.setattr(cu, "Graph", FakeGraph)
    monkeypatch.setattr(C.Context, "launch_neighbour", lambda self, stream: launches.append("neighbour"))
    monkeypatch.setattr(G, "guard_function", lambda ctx: FakeFunction("mf_guard_check"))
    monkeypatch.syspath_prepend(str(FIXTURE))
    info = cu.DeviceInfo(0, "Emulated H200", (9, 0), 132, 13000, OPTIN, 233472, 1 << 37, "")
    ctx = C.Context(device=None, info=info, timeout_s=0.2)  # type: ignore[arg-type]
    ctx.stream, ctx.other = FakeStream(), FakeStream()
    ctx.placer = FakePlacer(ctx)
    return ctx, launches


def _put(mem, dst, data):
    buf, off = mem.at(dst)
    if off + len(data) > len(buf):
        raise cu.CudaError("emulated copy", "CUDA_ERROR_INVALID_VALUE")
    buf[off : off + len(data)] = data


def _get(mem, src, n):
    buf, off = mem.at(src)
    return buf[off : off + n]


def guard_check(v, mem):
    """mf_guard_check from its contract: per region (ptr, expect, nbytes, canary), the first and last byte that
    differs from the pristine copy (or the canary) and how many differ, into found[3][nregions]."""
    table_p, found_p, n = v
    table = bytes(_get(mem, table_p, G.REGION.size * n))
    found = np.frombuffer(mem.at(found_p)[0], "<u8", 3 * n, mem.at(found_p)[1]).reshape(3, n)
    for i in range(n):
        ptr, expect, nbytes, canary, _ = G.REGION.unpack_from(table, G.REGION.size * i)
        got = np.frombuffer(bytes(_get(mem, ptr, nbytes)), np.uint8)
        want = np.frombuffer(bytes(_get(mem, expect, nbytes)), np.uint8) if expect else np.uint8(canary)
        bad = np.flatnonzero(got != want)
        if bad.size:
            found[0, i], found[1, i], found[2, i] = min(int(found[0, i]), bad[0]), max(int(found[1, i]), bad[-1]), bad.size


def run_kernel(name, v, mem, rng, stream):
    f32 = np.float32
    if name == "mf_guard_check":
        guard_check(v, mem)
    elif name.startswith("adamw_step_multi_"):
        multi_adamw(name.rsplit("_", 1)[1], v, mem)
    elif name in ("control_row_sum", "batch_variant_row_sum", "racy_row_sum"):
        out_p, x_p, rows, cols = v
        x = mem.view(x_p, f32, rows * cols).reshape(rows, cols)
        out = np.frombuffer(mem.at(out_p)[0], f32, rows, mem.at(out_p)[1])
        if name == "batch_variant_row_sum" and rows >= 64:
            parts = [x[:, k::4].astype(f32).sum(axis=1, dtype=f32) for k in range(4)]
            out[:] = (parts[0] + parts[1]) + (parts[2] + parts[3])
        else:
            out[:] = np.cumsum(x, axis=1, dtype=f32)[:, -1]  # sequential column order
    elif name in ("smid_ordered_row_sum", "clock_ordered_row_sum", "smid_rotated_tree_row_sum", "control_tree_row_sum"):
        placed_row_sum(name, v, mem, rng, stream)
    elif name in ("control_gemm_chain", "control_gemm_chain_2d", "pairwise_gemm"):
        c_p, a_p, b_p, m, n, k = v
        a = mem.view(a_p, f32, m * k).reshape(m, k)
        b = mem.view(b_p, f32, k * n).reshape(k, n)
        c = np.frombuffer(mem.at(c_p)[0], f32, m * n, mem.at(c_p)[1]).reshape(m, n)
        chains = [np.zeros((m, n), f32), np.zeros((m, n), f32)]
        for kk in range(k):  # one f32 chain per output (two interleaved ones for the pairwise rung)
            j = kk % 2 if name == "pairwise_gemm" else 0
            chains[j] = (chains[j] + a[:, kk, None] * b[None, kk, :]).astype(f32)
        c[:] = chains[0] + chains[1] if name == "pairwise_gemm" else chains[0]
    elif name == "control_smem_reverse":
        y_p, x_p, rows, cols = v
        x = mem.view(x_p, f32, rows * cols).reshape(rows, cols)
        y = np.frombuffer(mem.at(y_p)[0], f32, rows * cols, mem.at(y_p)[1]).reshape(rows, cols)
        y[:] = x[:, ::-1]
    elif name == "nondet_sum":
        out_p, x_p, n = v
        x = mem.view(x_p, f32, n)
        out = np.frombuffer(mem.at(out_p)[0], f32, 1, mem.at(out_p)[1])
        out[0] = out[0] + np.cumsum(x[rng.permutation(n)], dtype=f32)[-1]  # arrival order varies per launch
    elif name == "oob_write":
        _put(mem, v[0] + (v[2] << 42), b"\0\0\0\0")
    elif name == "spin_forever":
        stream.hung = True
    else:  # elementwise y = f(x)
        y_p, x_p, n = (v[0], v[2], v[1]) if name == "abi_mismatch" else v
        x = mem.view(x_p, f32, n)
        y = np.frombuffer(mem.at(y_p)[0], f32, n, mem.at(y_p)[1])
        if name == "wrong_scale":
            y[:] = 3 * x
        elif name == "writes_past_end":
            y[:] = x
            _put(mem, y_p + 4 * n, np.ones(4096, f32).tobytes())
        elif name == "writes_before_start":
            y[:] = x
            _put(mem, y_p - 4096, np.ones(1024, f32).tobytes())
        elif name == "writes_input":
            y[:] = 2 * x
            _put(mem, x_p + 20, np.float32(-7).tobytes())
        elif name == "accumulates_into_output":
            y[:] = y + 2 * x
        elif name == "misses_tail":
            y[: n - 1] = 2 * x[: n - 1]
        elif name == "address_variant":
            y[:] = 2 * x * (f32(1) + f32((x_p >> 8) & 63) * f32(2.0**-22))
        elif name == "control_scale_in_place":
            y[:] = 2 * x
        elif name == "neighbour_sum_not_in_place":  # one thread per chunk, front to back (src/negative.cu)
            x2, y2 = x.reshape(-1, 256), y.reshape(-1, 256)
            y2[:, 0] = x2[:, 0]
            for j in range(1, 256):
                y2[:, j] = x2[:, j] + x2[:, j - 1]
        else:
            y[:] = x


def placed_row_sum(name, v, mem, rng, stream):
    """The placement controls (src/placement.cu): 256 strided partials per row (one block per row), folded in
    sequence from slot smid % 256 (or a random slot for the clock one), or by a pairwise tree."""
    f32 = np.float32
    out_p, x_p, rows, cols = v
    x = mem.view(x_p, f32, rows * cols).reshape(rows, cols // 256, 256)
    out = np.frombuffer(mem.at(out_p)[0], f32, rows, mem.at(out_p)[1])
    s = np.cumsum(x, axis=1, dtype=f32)[:, -1, :]  # s[r, t] = sum of x[r, t::256], in column order
    if name in ("smid_ordered_row_sum", "clock_ordered_row_sum"):
        blocks = np.arange(rows)
        start = stream.sm_of(blocks) % 256 if name.startswith("smid") else rng.integers(0, 256, rows)
        order = (start[:, None] + np.arange(256)[None, :]) % 256
        out[:] = np.cumsum(np.take_along_axis(s, order, axis=1), axis=1, dtype=f32)[:, -1]
    else:  # a pairwise tree: which thread adds a pair (the %smid rotation) changes no bit
        h = 128
        while h:
            s = (s[:, :h] + s[:, h : 2 * h]).astype(f32)
            h //= 2
        out[:] = s[:, 0]


class FakePlacer:
    """placement.DevicePlacer emulated: green partitions are streams on fewer SMs, the blocker moves every block of
    a launch on ctx.stream past the SMs it holds."""

    def __init__(self, ctx, green: bool = True):
        self.ctx, self.green, self.holds = ctx, green, []

    def partitions(self):
        from mamba_forge.qualify.placement import Partition

        if not self.green:
            return [], "no green context of 16 SMs (driver 12020 < 12040 (green contexts need CUDA 12.4))"
        return [Partition(f"in a green context of {n} of 132 SMs", FakeStream(n)) for n in (16, 64)], ""

    def hold(self, blocks):
        ctx = self.ctx

        class Held:
            released = False

            def release(self):
                ctx.stream.held = 0

        ctx.stream.held = blocks
        self.holds.append(blocks)
        return Held()


def _run(ctx, name, level="quick"):
    cat = load_catalog(FIXTURE / "catalog.toml")
    if name == "smem_over":  # over the opt-in limit: no catalog may declare it (catalog/limits.py), so raised here
        cat.symbols[name] = cat.symbols[name].model_copy(update={"dynamic_smem": 240000})
    job = {"seed": 5, "level": level}
    group = {"module": "QualifyNegative", "target": "sm_90a"}
    return W.SymbolRun(ctx, cat, FakeModule(), job, {"name": name, "build_layout": []}, group).run()


def test_controls_pass_every_check(emulated):
    ctx, launches = emulated
    for name in ("control_row_sum", "control_smem_reverse"):
        r = _run(ctx, name)
        assert r.status == "admitted", r.reason
        names = [c.name for c in r.checks]
        assert names == ["admission", "correctness", "correctness", "correctness", "uninitialized", "repeat", "placement",
                         "batch", "stream", "neighbour", "address", "graph", "bounds", "input-written", "timeout"]
        digests = {c.digest for c in r.checks if c.name in DETERMINISM}
        assert len(digests) == 1
        assert all(c.passed for c in r.checks)
    assert "neighbour" in launches


def test_an_output_declared_in_place_of_its_input_is_run_so(emulated):
    """The catalog's in_place_of pairs are run as declared: the control's output over its input gives the bits of
    the launch on separate buffers (its in-place launch passes y exactly x through the runtime contract)."""
    ctx, launches = emulated
    r = _run(ctx, "control_scale_in_place")
    assert r.status == "admitted", r.reason
    (check,) = [c for c in r.checks if c.name == "in-place"]
    assert check.passed and check.detail == "y in place of x: bitwise equal to the launch on separate buffers"
    assert [c.name for c in r.checks].index("in-place") == [c.name for c in r.checks].index("uninitialized") + 1
    assert check.digest == next(c.digest for c in r.checks if c.name == "repeat")
    assert "in-place" not in [c.name for c in _run(ctx, "wrong_scale").checks]  # declares none: not run


@pytest.mark.parametrize(("name", "check", "text"), [
    ("neighbour_sum_not_in_place", "in-place", "y in place of x: the outputs differ from those on separate buffers"),
    ("nondet_sum", "repeat", "not bitwise equal to run 1"),
    ("batch_variant_row_sum", "batch", "leading rows at rows=1 differ"),
    ("wrong_scale", "correctness", "outside rtol"),
    ("misses_tail", "correctness", "1 of 4097 elements not written"),
    ("address_variant", "address", "256 bytes further"),
    ("abi_mismatch", "abi", "parameter 1 (x) is at offset 8 with 4 bytes"),
    ("smem_over", "smem", "opt-in limit 232448"),
    ("writes_past_end", "bounds", "wrote 16384 bytes past the end of y at +0..+16383"),
    ("writes_before_start", "bounds", "wrote 4096 bytes before the start of y at -4096..-1"),
    ("writes_input", "input-written", "the input x was written: 4 bytes differ from the uploaded contents, "
                                      "first in element 5 (byte 20)"),
    ("accumulates_into_output", "uninitialized", "y: 4096 of 4096 elements depend on the poison"),
])
def test_negative_controls_rejected_by_their_check(emulated, name, check, text):
    ctx, launches = emulated
    r = _run(ctx, name)
    assert (r.status, r.check) == ("rejected", check), r.reason
    assert text in r.reason
    if check in ("abi", "smem"):
        assert name not in launches  # refused before any launch


def _instance(ctx, name, offset=0):
    cat = load_catalog(FIXTURE / "catalog.toml")
    sym = cat.symbols[name]
    spec = S.evaluate(sym, cat.modules[0].family(name))
    inputs = C.make_inputs(spec, "uniform", np.random.default_rng(1), False)
    return C.Instance(ctx, spec, FakeFunction(name), inputs, offset=offset)


@pytest.mark.parametrize("offset", [0, 256])
def test_guard_check_cannot_pass_with_a_changed_canary_or_input(emulated, offset):
    """Every guard and input region, changed in one byte (first, last, unaligned middle), fails the check with
    its buffer and offset; restored, it passes. The guards touch the buffers: nothing between is unchecked."""
    ctx, _ = emulated
    inst = _instance(ctx, "control_row_sum", offset)
    try:
        inst.run()  # a correct kernel: every region intact
        regions = inst.guards.regions
        assert [(r.buffer, r.kind) for r in regions] == [("out", "before"), ("out", "after"), ("x", "before"),
                                                        ("x", "after"), ("x", "input")]
        for name, ptr in inst.ptrs.items():
            assert ptr % 256 == 0
            b = next(b for b in inst.spec.all_buffers if b.name == name)
            before, after = (r for r in regions if r.buffer == name and r.kind != "input")
            assert before.ptr + before.nbytes == ptr and after.ptr == ptr + b.nbytes
            assert before.nbytes == G.GUARD_BYTES + offset and after.nbytes == G.GUARD_BYTES
        for r in regions:
            for at in (0, r.nbytes - 1, 4099 % r.nbytes):
                old = cu.memcpy_dtoh(r.ptr + at, 1)
                cu.memcpy_htod(r.ptr + at, bytes([old[0] ^ 0x5A]))
                with pytest.raises(G.GuardViolation) as err:
                    inst.verify()
                if r.kind == "after":
                    assert (err.value.check, err.value.reason) == (
                        "bounds", f"wrote 1 bytes past the end of {r.buffer} at +{at}..+{at}")
                elif r.kind == "before":
                    back = r.nbytes - at
                    assert (err.value.check, err.value.reason) == (
                        "bounds", f"wrote 1 bytes before the start of {r.buffer} at -{back}..-{back}")
                else:
                    assert err.value.check == "input-written"
                    assert err.value.reason.endswith(f"first in element {at // 4} (byte {at})")
                cu.memcpy_htod(r.ptr + at, old)
                inst.verify()
    finally:
        inst.free()


def test_guards_are_off_under_the_sanitizer(emulated):
    """compute-sanitizer checks each access against the exact allocation: no guards, no second poison, no
    guard records in a sanitizer pass."""
    ctx, launches = emulated
    cat = load_catalog(FIXTURE / "catalog.toml")
    job = {"seed": 5, "level": "quick", "sanitize": True}
    group = {"module": "QualifyNegative", "target": "sm_90a"}
    r = W.SymbolRun(ctx, cat, FakeModule(), job, {"name": "control_row_sum", "build_layout": []}, group).run()
    assert r.status == "admitted" and [c.name for c in r.checks] == ["admission", "correctness"]
    assert "mf_guard_check" not in launches and launches.count("control_row_sum") == 1
    assert _run(ctx, "control_row_sum").status == "admitted" and "mf_guard_check" in launches


def test_fault_and_hang_surface_to_the_worker(emulated, monkeypatch):
    ctx, _ = emulated
    with pytest.raises(cu.CudaError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        _run(ctx, "oob_write")
    clock = itertools.count(0.0, 1.0)  # every poll advances a second: the family's 5 s limit passes at once
    monkeypatch.setattr(C.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(C.time, "sleep", lambda s: None)
    with pytest.raises(C.Hang, match="timed out after 5 s"):
        _run(ctx, "spin_forever")


def test_full_level_repeats_fifty_times(emulated):
    ctx, launches = emulated
    r = _run(ctx, "control_row_sum", level="full")
    assert r.status == "admitted"
    assert next(c for c in r.checks if c.name == "repeat").detail == "50 more runs bitwise equal"


def test_worker_main_streams_events(emulated, monkeypatch, tmp_path, capsys):
    """The worker's entry point end to end: hello, module, start/check/result per symbol, done."""
    import json

    ctx, _ = emulated

    class FakeDevice:
        def __init__(self, ordinal):
            self.ordinal = ordinal

        def info(self):
            return ctx.info

        def make_current(self):
            pass

    monkeypatch.setattr(cu, "Device", FakeDevice)
    monkeypatch.setattr(cu, "Stream", FakeStream)
    monkeypatch.setattr(cu, "Module", FakeModule)
    monkeypatch.setattr(W.P, "DevicePlacer", FakePlacer)
    (tmp_path / "sm_90a").mkdir()
    (tmp_path / "sm_90a" / "QualifyNegative.cubin").write_bytes(b"\x7fELF")
    job = {"device": 0, "level": "quick", "seed": 1, "timeout_s": 1.0, "sanitize": False,
           "catalog": str(FIXTURE / "catalog.toml"), "build_dir": str(tmp_path),
           "groups": [{"module": "QualifyNegative", "target": "sm_90a", "role": "qualify",
                       "cubin": "sm_90a/QualifyNegative.cubin", "ptx": None,
                       "symbols": [{"name": "control_row_sum", "build_layout": []},
                                   {"name": "wrong_scale", "build_layout": []}]}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    assert W.main(["--job", str(path)]) == 0
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "hello" and kinds[1] == "module" and kinds[-1] == "done"
    results = {e["symbol"]: e for e in events if e["event"] == "result"}
    assert results["control_row_sum"]["status"] == "admitted"
    assert results["wrong_scale"]["check"] == "correctness"
    assert results["control_row_sum"]["resources"]["blocks_per_sm"] == 4
    assert sum(1 for e in events if e["event"] == "check" and e["symbol"] == "control_row_sum") == 15


# ---- multi-tensor AdamW through aux buffers and a prepared descriptor table -----------------------------------

MULTI_SEEN: list[list[tuple]] = []  # per emulated launch: the descriptors it read
MULTI_MUTATION = {"drop_decay": False}


def multi_adamw(dt, v, mem):
    """NumPy stand-in for adamw_step_multi_<dt>: walks the descriptor table in emulated device memory."""
    from mamba_forge.qualify import spec as S
    from mamba_forge.references import optim as R

    descs_p, num, lr, b1, b2, eps, step = v
    table = bytes(_get(mem, descs_p, 48 * num))
    seen = []
    for t in range(num):
        p_p, g_p, m_p, v_p, n, wd, _ = R._MULTI_DESC.unpack_from(table, 48 * t)
        seen.append((p_p, g_p, m_p, v_p, n))
        p, g = mem.view(p_p, S.NP_DTYPES[dt], n), mem.view(g_p, S.NP_DTYPES[dt], n)
        m, vv = mem.view(m_p, np.float32, n), mem.view(v_p, np.float32, n)
        wd = 0.0 if MULTI_MUTATION["drop_decay"] else wd
        np_, nm, nv = R.adamw(p, g, m, vv, lr=lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd, step=step)
        p[:], m[:], vv[:] = np_.astype(S.NP_DTYPES[dt]), nm.astype(np.float32), nv.astype(np.float32)
    MULTI_SEEN.append(seen)


def stale_table_on_moved(real):
    """A prepare hook that does not follow moved buffers: instances are built for the three corpora, then the
    moved one (no batch dim here), which gets the first, still live, instance's table."""
    tables = []

    def stale(pointers, scalars, dims):
        tables.append(real(pointers, scalars, dims))
        return tables[0] if len(tables) == 4 else tables[-1]

    return stale


@pytest.fixture()
def multi(emulated, monkeypatch):
    """The real catalog's multi AdamW families at a small pool (fast on CPU); returns a runner."""
    import types

    from mamba_forge.catalog.model import default_catalog_path

    cat = load_catalog(default_catalog_path())
    MULTI_SEEN.clear()
    monkeypatch.setitem(MULTI_MUTATION, "drop_decay", False)
    ctx, launches = emulated

    def run(dt="bf16", total=20011, tensors=7):
        name = f"adamw_step_multi_{dt}"
        sym = cat.symbols[name]
        fam = cat.module(sym.module).family(sym.family)
        small = fam.model_copy(update={"qualify": fam.qualify.model_copy(update={"dims": {"tensors": tensors, "total": total}})})
        shim = types.SimpleNamespace(symbols=cat.symbols, routes=cat.routes, module=lambda kind: types.SimpleNamespace(family=lambda f: small))
        group = {"module": sym.module, "target": "sm_90a"}
        return W.SymbolRun(ctx, shim, FakeModule(), {"seed": 5, "level": "quick"}, {"name": name, "build_layout": []},
                           group).run()

    return run


@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_multi_adamw_passes_every_check(multi, dt):
    r = multi(dt)
    assert r.status == "admitted", r.reason
    names = [c.name for c in r.checks]
    assert names == ["admission", "correctness", "correctness", "correctness", "uninitialized", "repeat",
                     "placement", "stream", "neighbour", "address", "graph", "bounds", "input-written", "timeout"]
    corr = [c.detail for c in r.checks if c.name == "correctness"]
    assert all("param:" in d and "exp_avg:" in d and "exp_avg_sq:" in d for d in corr)  # aux outputs checked
    digests = {c.digest for c in r.checks if c.name in DETERMINISM}
    assert len(digests) == 1


def test_multi_adamw_tables_point_at_live_aux_buffers_and_moved_run_rebuilds(multi):
    from mamba_forge.references import optim as R

    assert multi("bf16").status == "admitted"
    sizes = R.multi_tensor_sizes(20011, 7)
    bases = []
    for seen in MULTI_SEEN:
        assert [d[4] for d in seen] == sizes
        p0, g0, m0, v0, _ = seen[0]
        assert len({p0, g0, m0, v0}) == 4 and all(x % 256 == 0 for x in (p0, g0, m0, v0))  # four pool starts
        start = 0
        for (p, g, m, v, n), want in zip(seen, sizes, strict=True):  # contiguous tensors inside each pool
            assert (p, g, m, v) == (p0 + 2 * start, g0 + 2 * start, m0 + 4 * start, v0 + 4 * start) and n == want
            start += n
        bases.append(p0)
    # three corpora (fresh instances, each run with both poisons), repeats/stream/neighbour/graph and the three
    # placements (two green partitions, the blocker) reuse the first, one moved instance
    moved = [b for b in bases if b % 512 == 256]  # FakeMemory allocates at 512-byte steps: +256 is the moved one
    assert len(moved) == len([b for b in bases if b == moved[0]]) == 1
    assert len(set(bases)) == 4 and len(bases) == 3 * 2 + 5 + 3 + 3 + 1


def test_multi_adamw_stale_table_fails_the_address_check(multi, monkeypatch):
    """A prepare hook that does not follow the moved buffers: the kernel updates the old pools, the moved
    instance's outputs stay at their inputs, and the address check rejects."""
    from mamba_forge.references import optim as R

    monkeypatch.setattr(R, "adamw_multi_descriptors", stale_table_on_moved(R.adamw_multi_descriptors))

    r = multi("f32")
    assert (r.status, r.check) == ("rejected", "address"), r.reason


def test_multi_adamw_wrong_result_fails_correctness(multi, monkeypatch):
    monkeypatch.setitem(MULTI_MUTATION, "drop_decay", True)
    r = multi("f32")
    assert (r.status, r.check) == ("rejected", "correctness")
    assert "param:" in r.reason and "outside rtol" in r.reason


@pytest.mark.parametrize(("table", "text"), [
    (lambda t: {}, "prepare returned nothing for the prepared pointer param 'descs'"),
    (lambda t: {"descs": t["descs"][:-48]}, "prepare returned 288 bytes for 'descs', its buffer holds 336"),
])
def test_multi_adamw_bad_prepare_is_a_spec_error(multi, monkeypatch, table, text):
    from mamba_forge.qualify import spec as S
    from mamba_forge.references import optim as R

    real = R.adamw_multi_descriptors
    monkeypatch.setattr(R, "adamw_multi_descriptors", lambda p, s, d: table(real(p, s, d)))
    with pytest.raises(S.SpecError, match=text):
        multi("f32")


# ---- the same on the H200: the real kernels through the real worker (skipped without a GPU) ----------------


@pytest.fixture(scope="module")
def live_fixed():
    """(context, loaded Fixed module for sm_90a, catalog) from the gpu_support build (cached per process)."""
    from gpu_support import kernels

    from mamba_forge.catalog.model import default_catalog_path

    k = kernels("sm_90a")
    mod = next(m for m, s in k.manifest.symbols() if s.name == "adamw_step_multi_f32" and m.target == "sm_90a")
    cubin = next(a for a in mod.artifacts if a.code == "cubin")
    dev = cu.Device(0)
    ctx = C.Context(dev, dev.info(), timeout_s=20.0)
    ctx.open()
    return ctx, cu.Module((k.out / cubin.path).read_bytes()), load_catalog(default_catalog_path())


def _live_run(live_fixed, dt):
    ctx, module, cat = live_fixed
    name = f"adamw_step_multi_{dt}"
    return W.SymbolRun(ctx, cat, module, {"seed": 7, "level": "quick"}, {"name": name, "build_layout": []},
                       {"module": "Fixed", "target": "sm_90a"}).run()


@pytest.mark.gpu
@pytest.mark.parametrize("dt", ["f32", "bf16", "f16"])
def test_gpu_multi_adamw_is_qualified(live_fixed, dt):
    r = _live_run(live_fixed, dt)
    assert r.status == "admitted", r.reason
    assert [c.name for c in r.checks][-9:] == ["repeat", "placement", "stream", "neighbour", "address", "graph",
                                             "bounds", "input-written", "timeout"]


@pytest.mark.gpu
def test_gpu_multi_adamw_negative_controls(live_fixed, monkeypatch):
    """A stale table on the moved instance fails the address check; a reference without weight decay fails
    correctness: both on the real kernel."""
    from mamba_forge.references import optim as R

    real = R.adamw_multi_descriptors
    monkeypatch.setattr(R, "adamw_multi_descriptors", stale_table_on_moved(real))
    r = _live_run(live_fixed, "f32")
    assert (r.status, r.check) == ("rejected", "address"), r.reason
    monkeypatch.setattr(R, "adamw_multi_descriptors", real)
    real_ref = R.adamw_step_multi

    def reference_without_decay(args, dims):  # the kernel's table keeps its decay; only the oracle drops it
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(R, "multi_weight_decay", lambda t: 0.0)
            return real_ref(args, dims)

    monkeypatch.setattr(R, "adamw_step_multi", reference_without_decay)
    r = _live_run(live_fixed, "f32")
    assert (r.status, r.check) == ("rejected", "correctness"), r.reason


def test_route_equivalence_rejects_a_rung_with_other_bits(emulated):
    """A class of three rungs: the 2-D twin computes the chain's bits at every check M and stays admitted; the
    pairwise rung is correct to rounding (it passes correctness) but differs in bits, so it is rejected."""
    from mamba_forge.catalog.routes import check_m_values
    from mamba_forge.qualify import equivalence as E

    ctx, launches = emulated
    cat = load_catalog(FIXTURE / "catalog.toml")
    results = {n: _run(ctx, n) for n in ("control_gemm_chain", "control_gemm_chain_2d", "pairwise_gemm")}
    assert all(r.status == "admitted" for r in results.values()), {n: r.reason for n, r in results.items()}
    ms = check_m_values(cat.routes[0].classes[0].rungs[0])
    assert ms == [1, 3, 17, 64, 256, 1000]
    for r in results.values():  # one digest per check M, recorded by the worker
        assert [c.detail.rsplit("=", 1)[1] for c in r.checks if c.name == E.CHECK] == [str(m) for m in ms]
    notes = E.apply(results, cat.routes)
    assert notes == ["nn f32xf32->f32 / fma-chain: 1 rungs equal to control_gemm_chain"]
    assert results["control_gemm_chain_2d"].status == "admitted"
    assert results["control_gemm_chain"].status == "admitted"
    bad = results["pairwise_gemm"]
    assert (bad.status, bad.check) == ("rejected", "route-equivalence")
    assert "its output at M=1, N=40, K=96 differs in some bit from the class reference control_gemm_chain" in bad.reason
    assert results["control_gemm_chain_2d"].checks[-1].detail.startswith("nn f32xf32->f32 / fma-chain: bitwise equal")


def test_route_equivalence_hands_the_reference_on_and_skips_one_rung_classes(emulated):
    """With the reference rejected by an earlier check, no unbounded rung is left to compare with: nothing more
    is rejected. A symbol outside every multi-rung class records no digests."""
    from mamba_forge.qualify import equivalence as E

    ctx, launches = emulated
    cat = load_catalog(FIXTURE / "catalog.toml")
    results = {n: _run(ctx, n) for n in ("control_gemm_chain", "control_gemm_chain_2d", "pairwise_gemm")}
    results["control_gemm_chain"].reject("repeat", "pretend")
    assert E.apply(results, cat.routes) == []
    assert results["pairwise_gemm"].status == "admitted"
    assert not [c for c in _run(ctx, "control_row_sum").checks if c.name == E.CHECK]
