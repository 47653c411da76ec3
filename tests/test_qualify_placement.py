"""Placement, on CPU: the static warning for reads of placement- or time-dependent special registers (real NVRTC
compiles of tiny kernels; the fixture's QualifyPlacement module) and the catalog's `acknowledge` table."""

from __future__ import annotations

from pathlib import Path

import pytest

from mamba_forge.build import cubin, nvrtc
from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog import entries
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.errors import CatalogError
from mamba_forge.manifest import toml_io
from mamba_forge.manifest.schema import BuildManifest

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
    for name in ("negative.toml", "routes.toml"):
        (tmp_path / name).write_text((FIXTURE / name).read_text())
    fam = (FIXTURE / "placement.toml").read_text().replace(
        'acknowledge = { smid = "rotation of a commutative pairwise tree: each pair is added once, a + b == b + a" }',
        acknowledge)
    (tmp_path / "placement.toml").write_text(fam)
    (tmp_path / "catalog.toml").write_text(root)
    return tmp_path / "catalog.toml"


@pytest.mark.parametrize(("acknowledge", "problem"), [
    ('acknowledge = { tid = "not special" }', "acknowledge.tid: not a placement-dependent register"),
    ('acknowledge = { "%smid" = "with the percent sign" }', "acknowledge.%smid: not a placement-dependent register"),
    ('acknowledge = { smid = "" }', "acknowledge.smid: give the reason"),
    ('acknowledge = { smid = "   " }', "acknowledge.smid: give the reason"),
    ('acknowledge = { smid = "' + "x" * 201 + '" }', "acknowledge.smid: give the reason in 1 to 200 characters"),
    ('acknowledge = { smid = 1 }', "acknowledge.smid"),
    ('acknowledge = "smid"', "acknowledge"),
])
def test_bad_acknowledgements_are_refused_with_the_entry(tmp_path, acknowledge, problem):
    with pytest.raises(CatalogError) as err:
        load_catalog(_catalog_with(tmp_path, acknowledge))
    assert problem in str(err.value) and "smid_rotated_tree_row_sum" in str(err.value)


def test_acknowledging_one_register_leaves_the_others_warned(tmp_path):
    cat = load_catalog(_catalog_with(tmp_path, 'acknowledge = { clock64 = "only used to time, never to order" }'))
    fam = cat.module("QualifyPlacement").family("smid_rotated_tree_row_sum")
    assert fam.acknowledge == {"clock64": "only used to time, never to order"}
    bm = build(BuildRequest(cat, [get_target("sm_90a")], tmp_path / "out", jobs=1, cache_location=None,
                            modules=("QualifyPlacement",)))
    w = _symbols(bm)["smid_rotated_tree_row_sum"].warnings
    assert w is not None and len(w) == 1 and w[0].startswith("warning: ") and "%smid" in w[0]
