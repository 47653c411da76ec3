"""Placement, on CPU: the static warning for reads of placement- or time-dependent special registers (real NVRTC
compiles of tiny kernels; the fixture's QualifyPlacement module), the catalog's `acknowledge` table, and the
placement check's logic against the emulated driver of test_qualify_emulated.py (green partitions and the blocker
emulated by FakePlacer; tests/gpu/test_qualify_gpu.py runs the real ones)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_qualify_emulated import FakeFunction, FakeModule, FakePlacer, _run, emulated  # noqa: F401 - fixture by name

from mamba_forge.build import cubin, nvrtc
from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog import entries
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.core.schema import BuildManifest
from mamba_forge.gpu import driver as cu
from mamba_forge.manifest import toml_io
from mamba_forge.qualify import placement as P
from mamba_forge.qualify import plan
from mamba_forge.qualify import worker as W

FIXTURE = Path(__file__).parent / "fixtures" / "qualify_negative"


def _ptx(source: str) -> str:
    res = nvrtc.compile_program(source, "placement_probe.cu", ["-std=c++17", "-arch=sm_90"], {})
    assert res.ok, res.log
    return res.ptx.decode()


@pytest.fixture(scope="module")
def placement_build(tmp_path_factory) -> tuple[BuildManifest, Path]:
    out = tmp_path_factory.mktemp("placement-build")
    req = BuildRequest(load_catalog(FIXTURE / "catalog.toml"), [get_target("sm_90a")], out, jobs=1,
                       cache_location=None, modules=("QualifyPlacement",))
    return build(req), out


def _symbols(bm: BuildManifest) -> dict:
    return {s.name: s for m in bm.modules for s in m.symbols}


def test_the_catalog_and_the_scanner_know_the_same_registers():
    assert entries.ACKNOWLEDGEABLE == cubin.PLACEMENT_REGISTERS


@pytest.mark.parametrize(("name", "registers"), [
    ("smid_ordered_row_sum", ["%smid"]),
    ("clock_ordered_row_sum", ["%clock64"]),
])
def test_a_deterministic_kernel_reading_a_placement_register_is_warned_not_rejected(placement_build, name, registers):
    s = _symbols(placement_build[0])[name]
    assert s.verdict.status == "admitted", s.verdict.reason
    assert s.warnings is not None and len(s.warnings) == 1
    w = s.warnings[0]
    assert w.startswith(f"warning: {name} on sm_90a: reads ") and "placement check" in w
    for r in registers:
        assert r in w


def test_an_acknowledged_read_is_a_note_with_the_catalogs_reason(placement_build):
    s = _symbols(placement_build[0])["smid_rotated_tree_row_sum"]
    assert s.verdict.status == "admitted"
    assert s.warnings == ["acknowledged: smid_rotated_tree_row_sum on sm_90a: reads %smid: rotation of a commutative "
                          "pairwise tree: each pair is added once, a + b == b + a"]


def test_a_kernel_without_special_registers_has_no_warning(placement_build):
    assert _symbols(placement_build[0])["control_tree_row_sum"].warnings is None


def test_warnings_round_trip_through_the_build_manifest(placement_build, tmp_path):
    bm, _ = placement_build
    toml_io.write(tmp_path / "manifest.toml", bm)
    again = toml_io.read(tmp_path / "manifest.toml", BuildManifest)
    assert _symbols(again)["smid_ordered_row_sum"].warnings == _symbols(bm)["smid_ordered_row_sum"].warnings
    assert "warnings" not in (tmp_path / "manifest.toml").read_text().split("control_tree_row_sum", 1)[1].split(
        "[[modules.symbols]]", 1)[0]


PROBE = r"""
__device__ __noinline__ unsigned where_am_i() { unsigned v; asm volatile("mov.u32 %0, %%smid;" : "=r"(v)); return v; }
__device__ __noinline__ unsigned via() { return where_am_i() + 1; }
__device__ __noinline__ unsigned long long when() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
extern "C" __global__ void calls_smid(unsigned* o) { o[threadIdx.x] = via(); }
extern "C" __global__ void reads_timer(unsigned long long* o) { o[threadIdx.x] = when(); }
extern "C" __global__ void reads_warpid_and_nsmid(unsigned* o) {
  unsigned w, n; asm volatile("mov.u32 %0, %%warpid;" : "=r"(w)); asm volatile("mov.u32 %0, %%nsmid;" : "=r"(n));
  o[threadIdx.x] = w + n; }
extern "C" __global__ void reads_clock(unsigned* o) {
  unsigned c; asm volatile("mov.u32 %0, %%clock;" : "=r"(c)); o[threadIdx.x] = c; }
extern "C" __global__ void plain(unsigned* o) { o[threadIdx.x] = threadIdx.x + blockIdx.x * blockDim.x; }
"""


def test_reads_through_noninlined_functions_are_attributed_to_the_entry_that_calls_them():
    found = cubin.special_registers_by_entry(_ptx(PROBE))
    assert found["calls_smid"] == ["smid"]  # two calls deep
    assert found["reads_timer"] == ["globaltimer"]
    assert found["reads_warpid_and_nsmid"] == ["nsmid", "warpid"]
    assert found["reads_clock"] == ["clock"]
    assert "plain" not in found


def test_the_scan_reads_hand_written_ptx_calls_and_prototypes():
    ptx = """
.func (.param .b32 func_retval0) rot();
.visible .entry a(.param .u64 p) { call.uni (retval0), rot, (); }
.visible .entry b(.param .u64 p) { mov.u32 %r2, %tid.x; mov.u32 %r3, %smid_not_a_register; }
.func (.param .b32 func_retval0) rot() { mov.u32 %r1, %smid; ret; }
.weak .func tick() { mov.u64 %rd1, %clock64; ret; }
.visible .entry c(.param .u64 p) { call.uni tick, (); call.uni a_missing_function, (); }
"""
    assert cubin.special_registers_by_entry(ptx) == {"a": ["smid"], "c": ["clock64"]}


def _catalog_with(tmp_path: Path, acknowledge: str) -> Path:
    root = (FIXTURE / "catalog.toml").read_text()
    (tmp_path / "src").mkdir()
    for f in (FIXTURE / "src").iterdir():
        (tmp_path / "src" / f.name).write_bytes(f.read_bytes())
    for name in ("negative.toml", "routes.toml", "split.toml"):
        (tmp_path / name).write_text((FIXTURE / name).read_text())
    fam = (FIXTURE / "placement.toml").read_text().replace(
        'acknowledge = { smid = "rotation of a commutative pairwise tree: each pair is added once, a + b == b + a" }',
        acknowledge)
    (tmp_path / "placement.toml").write_text(fam)
    (tmp_path / "catalog.toml").write_text(root)
    return tmp_path / "catalog.toml"


def test_acknowledging_one_register_leaves_the_others_warned(tmp_path):
    cat = load_catalog(_catalog_with(tmp_path, 'acknowledge = { clock64 = "only used to time, never to order" }'))
    fam = cat.module("QualifyPlacement").family("smid_rotated_tree_row_sum")
    assert fam.acknowledge == {"clock64": "only used to time, never to order"}
    bm = build(BuildRequest(cat, [get_target("sm_90a")], tmp_path / "out", jobs=1, cache_location=None,
                            modules=("QualifyPlacement",)))
    w = _symbols(bm)["smid_rotated_tree_row_sum"].warnings
    assert w is not None and len(w) == 1 and w[0].startswith("warning: ") and "%smid" in w[0]


# ---- the placement check, against the emulated driver of test_qualify_emulated.py ---------------------------


def test_the_build_warning_reaches_the_worker_job(placement_build):
    groups = plan.plan_groups(placement_build[0], (9, 0), None)
    warned = {s["name"]: s["placement_warned"] for g in groups for s in g.symbols}
    assert warned == {"smid_ordered_row_sum": True, "clock_ordered_row_sum": True,
                      "smid_rotated_tree_row_sum": False, "control_tree_row_sum": False}  # acknowledged: no warning


def test_an_smid_ordered_sum_is_rejected_by_placement_naming_the_placement(emulated):  # noqa: F811
    ctx, _ = emulated
    r = _run(ctx, "smid_ordered_row_sum")
    assert (r.status, r.check) == ("rejected", "placement"), r.reason
    assert "its bits differ in a green context of 16 of 132 SMs from its first run alone" in r.reason
    assert "depend on where its blocks run" in r.reason
    assert [c.name for c in r.checks if not c.passed] == ["placement"]
    assert next(c for c in r.checks if c.name == "repeat").passed  # alone it is the same run after run


def test_without_green_contexts_the_blocker_still_rejects_it(emulated):  # noqa: F811
    ctx, _ = emulated
    ctx.placer = FakePlacer(ctx, green=False)
    r = _run(ctx, "smid_ordered_row_sum")
    assert (r.status, r.check) == ("rejected", "placement")
    assert "beside a blocker holding 66 of 132 SMs" in r.reason
    assert ctx.placer.holds == [66] and ctx.stream.held == 0  # released


@pytest.mark.parametrize("green", [True, False])
def test_a_rotation_of_a_commutative_tree_by_smid_is_admitted(emulated, green):  # noqa: F811
    ctx, _ = emulated
    ctx.placer = FakePlacer(ctx, green=green)
    for name in ("smid_rotated_tree_row_sum", "control_tree_row_sum"):
        r = _run(ctx, name)
        assert r.status == "admitted", r.reason
        rec = next(c for c in r.checks if c.name == "placement")
        assert rec.passed and rec.digest == next(c for c in r.checks if c.name == "repeat").digest
        assert "beside a blocker holding 66 of 132 SMs" in rec.detail
        assert ("in a green context of 16 of 132 SMs, in a green context of 64 of 132 SMs" in rec.detail) == green
        assert ("placed beside the blocker and with more shared memory only" in rec.detail) == (not green)
        assert "shared memory cannot lower its residency" in rec.detail  # the fake occupancy is flat


def test_a_clock_ordered_sum_is_rejected(emulated):  # noqa: F811
    ctx, _ = emulated
    r = _run(ctx, "clock_ordered_row_sum")
    assert r.status == "rejected" and r.check in ("repeat", "placement"), r.reason


def test_a_warned_symbol_runs_each_placement_three_times(emulated):  # noqa: F811
    ctx, launches = emulated
    cat = load_catalog(FIXTURE / "catalog.toml")
    group = {"module": "QualifyPlacement", "target": "sm_90a"}
    counts = []
    for warned in (False, True):
        before = launches.count("smid_rotated_tree_row_sum")
        entry = {"name": "smid_rotated_tree_row_sum", "build_layout": [], "placement_warned": warned}
        r = W.SymbolRun(ctx, cat, FakeModule(), {"seed": 5, "level": "quick"}, entry, group).run()
        assert r.status == "admitted", r.reason
        counts.append(launches.count("smid_rotated_tree_row_sum") - before)
        rec = next(c for c in r.checks if c.name == "placement")
        assert ("3 runs each: the build warned" in rec.detail) == warned
    assert counts[1] - counts[0] == 2 * 3  # two more runs of each of the three placements
    assert ctx.placer.holds == [66] + [66] * 3


def test_more_shared_memory_is_a_placement_when_it_lowers_residency(emulated, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    seen = []
    real = W.C.cu.launch

    def launch(fn, grid, block, params, *, smem=0, stream=None):
        seen.append((fn.name, smem))
        real(fn, grid, block, params, smem=smem, stream=stream)

    monkeypatch.setattr(W.C.cu, "launch", launch)
    monkeypatch.setattr(FakeFunction, "occupancy", lambda self, threads, smem: max(1, min(8, 233472 // (smem + 1024))))
    r = _run(ctx, "control_tree_row_sum")
    assert r.status == "admitted", r.reason
    rec = next(c for c in r.checks if c.name == "placement")
    assert "more bytes of dynamic shared memory (4 resident blocks per SM instead of 8)" in rec.detail
    extra = int(rec.detail.split("with ")[1].split(" more bytes")[0])
    assert ("control_tree_row_sum", extra) in seen and 233472 // (extra + 1024) == 4
    assert 233472 // (extra - 256 + 1024) > 4  # the least such bytes, to 256


class _Occ:
    def __init__(self, per_sm: int, reserve: int = 1024, cap: int = 8):
        self.per_sm, self.reserve, self.cap = per_sm, reserve, cap

    def occupancy(self, threads, smem):
        return max(0, min(self.cap, self.per_sm // (smem + self.reserve)))


@pytest.mark.parametrize(("occ", "base", "static", "want"), [
    (_Occ(233472), 0, 0, (45824, 8, 4)),  # 233472 // (45824 + 1024) = 4, // (45568 + 1024) = 5
    (_Occ(233472), 100000, 0, None),  # 2 per SM -> 1: checked below
    (_Occ(233472, cap=1), 0, 0, None),  # one block per SM already
    (_Occ(233472), 0, 232000, None),  # no room left under the opt-in limit
])
def test_smem_for_lower_residency(occ, base, static, want):
    got = P.smem_for_lower_residency(occ, 256, base, static, 232448)
    if base == 100000:  # 2 resident -> 1: the least 256-multiple above 116736 - 1024 that gives 1
        assert got is not None and got[1:] == (2, 1) and occ.occupancy(256, got[0]) == 1
        assert occ.occupancy(256, got[0] - 256) == 2
        return
    assert got == want


class _RefusingPlacer(FakePlacer):
    """A green context the driver will not use: pushing it fails, or the launch on its stream is refused."""

    def __init__(self, ctx, result: str, at: str):
        super().__init__(ctx)
        self.result, self.at = result, at

    def partitions(self):
        def refuse():
            raise cu.CudaError("cuCtxPushCurrent(green)" if self.at == "enter" else "cuLaunchKernel", self.result)

        parts, note = super().partitions()
        if self.at == "enter":
            parts[0].enter = refuse
        else:
            parts[0].stream.refuse = refuse
        return parts, note


def _refusing(env, monkeypatch, result: str, at: str):
    """The `emulated` fixture's context with a placer whose green contexts fail with `result` at `at` (entering,
    or a launch on their streams: cu.launch asks the stream first)."""
    ctx, _ = env
    ctx.placer = _RefusingPlacer(ctx, result, at)
    real = cu.launch

    def launch(fn, grid, block, params, *, smem=0, stream=None):
        if getattr(stream, "refuse", None):
            stream.refuse()
        real(fn, grid, block, params, smem=smem, stream=stream)

    monkeypatch.setattr(cu, "launch", launch)
    return ctx


@pytest.mark.parametrize("at", ["enter", "launch"])
def test_a_refused_green_context_is_skipped_and_noted_not_a_rejection(emulated, monkeypatch, at):  # noqa: F811
    ctx = _refusing(emulated, monkeypatch, "CUDA_ERROR_INVALID_HANDLE", at)
    r = _run(ctx, "control_tree_row_sum")
    assert r.status == "admitted", r.reason
    rec = next(c for c in r.checks if c.name == "placement")
    assert "not run in a green context of 16 of 132 SMs:" in rec.detail and "CUDA_ERROR_INVALID_HANDLE" in rec.detail
    assert rec.detail.startswith("bitwise equal in a green context of 64 of 132 SMs, beside a blocker")


def test_a_sticky_error_in_a_green_context_is_the_symbols_fault(emulated, monkeypatch):  # noqa: F811
    ctx = _refusing(emulated, monkeypatch, "CUDA_ERROR_ILLEGAL_ADDRESS", "launch")
    with pytest.raises(cu.CudaError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        _run(ctx, "control_tree_row_sum")


def test_the_device_placer_notes_why_a_green_context_is_missing(monkeypatch):
    """DevicePlacer.partitions over a stand-in for gpu/green.py: an old driver, a binding that differs (any
    exception is a missing placement with its reason, never the symbol's verdict) and one partition that works."""
    from types import SimpleNamespace

    from mamba_forge.gpu import green

    info = cu.DeviceInfo(0, "Emulated", (9, 0), 132, 12020, 232448, 233472, 1 << 37, "")
    ctx = SimpleNamespace(info=info, device=SimpleNamespace(handle=0))
    made = []

    def partition(handle, n):
        if n == 16:
            raise green.GreenUnavailable("driver 12020 < 12040 (green contexts need CUDA 12.4)")
        if n == 66 and not made:
            made.append(n)
            raise TypeError("cuDevSmResourceSplitByCount() takes 5 arguments")
        return green.GreenPartition(72, n, object(), object(), "stream")

    monkeypatch.setattr(green, "partition", partition)
    parts, note = P.DevicePlacer(ctx).partitions()
    assert parts == [] and note == ("no green context of 16 SMs (driver 12020 < 12040 (green contexts need CUDA 12.4)); "
                                    "no green context of 66 SMs (TypeError: cuDevSmResourceSplitByCount() takes 5 "
                                    "arguments)")
    placer = P.DevicePlacer(ctx)
    parts, note = placer.partitions()
    assert [p.label for p in parts] == ["in a green context of 72 of 132 SMs"] and note.startswith("no green context of 16")
    assert placer.partitions() == (parts, note)  # made once per worker
