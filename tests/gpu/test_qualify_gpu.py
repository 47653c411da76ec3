"""The live qualifier on the H200: the negative-control catalog (each control rejected by the right check, the
correct controls admitted, through the CLI with --sanitize and a signed manifest), live admission and the driver
wrappers directly, and the real catalog's Fixed module at quick level.

    python -m pytest -q -m gpu tests/gpu/test_qualify_gpu.py
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.core.codec import to_dict
from mamba_forge.gpu import driver as cu
from mamba_forge.manifest.qualified import body_bytes, read_verified
from mamba_forge.manifest.toml_io import write
from mamba_forge.qualify import checks as C
from mamba_forge.qualify import guards as G
from mamba_forge.qualify import plan, runner
from mamba_forge.qualify import spec as S
from mamba_forge.report.classes import reason_class
from mamba_forge.runtime import signing

pytestmark = pytest.mark.gpu

NEGATIVE = Path(__file__).resolve().parent.parent / "fixtures" / "qualify_negative" / "catalog.toml"
DETERMINISM = ["repeat", "placement", "batch", "stream", "neighbour", "address", "graph"]
# (symbol, acceptable deciding checks, text the reason must contain)
EXPECTED = [
    ("nondet_sum", {"repeat"}, "not bitwise equal"),
    # a race can also make the two differently poisoned runs differ while a rerun happens to agree
    ("racy_row_sum", {"sanitize", "correctness", "uninitialized", "repeat", "batch", "stream", "neighbour", "address",
                      "graph"}, ""),
    ("batch_variant_row_sum", {"batch"}, "leading rows"),
    ("oob_write", {"fault"}, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("spin_forever", {"timeout"}, "timed out after"),
    ("abi_mismatch", {"abi"}, "parameter 1"),
    ("wrong_scale", {"correctness"}, "outside rtol"),
    ("misses_tail", {"correctness"}, "not written"),
    ("address_variant", {"address"}, "256 bytes further"),
    ("writes_past_end", {"bounds"}, "wrote 16384 bytes past the end of y at +0..+16383"),
    ("writes_before_start", {"bounds"}, "wrote 4096 bytes before the start of y at -4096..-1"),
    ("writes_input", {"input-written"}, "the input x was written"),
    ("accumulates_into_output", {"uninitialized"}, "depend on the poison"),
    # correct to rounding, other bits than its route class's reference (routes.toml beside the fixture)
    ("pairwise_gemm", {"route-equivalence"}, "differs in some bit from the class reference control_gemm_chain"),
    # placement (src/placement.cu): the same bits run after run alone, others on other SMs. Alone on the GPU the
    # placement check decides; beside other work (pytest -n 4 qualifies this catalog in every worker at once) a
    # plain rerun may already land its blocks elsewhere, and the repeat check decides first (seen on the H200)
    ("smid_ordered_row_sum", {"placement", "repeat"}, ""),
    # its fold starts where the cycle counter says: another start on the next run, or under another placement
    ("clock_ordered_row_sum", {"repeat", "placement"}, ""),
    # split (src/split.cu): its first position of each call is an fma, so a chunked run differs from one call
    ("split_variant_running_sum", {"split"}, "called over chunks of L = "),
    # programmatic dependent launch (qualify/pdl.py): reads x before its griddepcontrol.wait
    ("reads_before_pdl_wait", {"pdl"}, "launched with programmatic dependent launch behind a kernel that writes"),
    # in place (the catalog's in_place_of): one thread per chunk reads the element before it after overwriting it
    ("neighbour_sum_not_in_place", {"in-place"}, "y in place of x: the outputs differ from those on separate buffers"),
]
GUARDS = ["uninitialized", "bounds", "input-written"]
CONTROLS = ["control_row_sum", "control_smem_reverse"]
TREE_CONTROLS = ["smid_rotated_tree_row_sum", "control_tree_row_sum"]  # admitted: a %smid rotation of pairs is benign


def _target() -> str:
    info = cu.Device(0).info()
    return sorted(plan.device_targets(info.cc), key=lambda t: not t.endswith("a"))[0]


@pytest.fixture(scope="module")
def negative_build(tmp_path_factory):
    out = tmp_path_factory.mktemp("qneg-build")
    bm = build(BuildRequest(load_catalog(NEGATIVE), [get_target(_target())], out, cache_location=None))
    write(out / "manifest.toml", bm)
    return out


@pytest.fixture(scope="module")
def negative_manifest(negative_build, tmp_path_factory):
    from mamba_forge.cli import main

    tmp = tmp_path_factory.mktemp("qneg-out")
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CONFIG_HOME", str(tmp / "cfg"))
    mp.delenv(signing.KEY_ENV, raising=False)
    try:
        out = tmp / "manifests" / "negative.toml"
        rc = main(["qualify", "--device", "0", "--build", str(negative_build), "--catalog", str(NEGATIVE),
                   "--sanitize", "--timeout", "10", "--out", str(out)])
    finally:
        mp.undo()
    assert rc == 0
    pubs = list(out.parent.glob("*.pub"))
    assert len(pubs) == 1
    return read_verified(out, signing.load_trusted(pubs))


@pytest.mark.parametrize(("name", "checks", "text"), EXPECTED, ids=[e[0] for e in EXPECTED])
def test_negative_control_rejected_by_the_right_check(negative_manifest, name, checks, text):
    s = negative_manifest.symbol(name)
    assert s.status == "rejected", f"{name} was admitted: {[to_dict(c) for c in s.checks]}"
    assert s.check in checks, f"{name}: rejected by {s.check}: {s.reason}"
    assert text in s.reason, s.reason


@pytest.mark.parametrize("name", CONTROLS)
def test_controls_admitted_with_every_check(negative_manifest, name):
    s = negative_manifest.symbol(name)
    assert s.status == "admitted", f"{name}: [{s.check}] {s.reason}"
    names = [c.name for c in s.checks]
    for want in ["admission", "correctness", *DETERMINISM, *GUARDS, "sanitize"]:
        assert want in names, f"{name} lacks the {want} check: {names}"
    assert all(c.passed for c in s.checks)
    assert names.count("sanitize") == 4  # memcheck, racecheck, synccheck, initcheck
    digests = {c.digest for c in s.checks if c.name in DETERMINISM}
    assert len(digests) == 1 and len(digests.pop()) == 64
    assert s.resources is not None and s.resources.blocks_per_sm >= 1 and s.seed is not None
    assert s.params_layout() == [[0, 8], [8, 8], [16, 4], [20, 4]]


def test_an_output_declared_in_place_runs_over_its_input(negative_manifest):
    s = negative_manifest.symbol("control_scale_in_place")
    assert s.status == "admitted", f"[{s.check}] {s.reason}"
    (check,) = [c for c in s.checks if c.name == "in-place"]
    assert check.passed and "bitwise equal to the launch on separate buffers" in check.detail
    assert [p.in_place_of for p in s.params if p.name == "y"] == ["x"]


@pytest.mark.parametrize(("name", "status", "classes"), [
    ("smid_ordered_row_sum", "rejected", {"placement-variant", "nondeterministic"}),  # as in EXPECTED
    ("clock_ordered_row_sum", "rejected", {"nondeterministic", "placement-variant"}),
    ("smid_rotated_tree_row_sum", "admitted", {""}),
    ("control_tree_row_sum", "admitted", {""}),
])
def test_placement_controls_verdict_and_reason_class(negative_manifest, name, status, classes):
    s = negative_manifest.symbol(name)
    assert s.status == status, f"{name}: [{s.check}] {s.reason}"
    assert (reason_class(s.check) if s.status == "rejected" else "") in classes, f"{name}: [{s.check}] {s.reason}"
    if s.check == "placement":  # the reason names where its bits changed
        assert " SMs" in s.reason or "shared memory" in s.reason, s.reason


@pytest.mark.parametrize("name", TREE_CONTROLS)
def test_placement_controls_admitted_under_every_placement(negative_manifest, name):
    s = negative_manifest.symbol(name)
    assert s.status == "admitted", f"{name}: [{s.check}] {s.reason}"
    rec = next(c for c in s.checks if c.name == "placement")
    sms = negative_manifest.device.sm_count
    assert rec.passed and f"beside a blocker holding {sms // 2} of {sms} SMs" in rec.detail, rec.detail
    # the H200's driver (13.0) has green contexts: both partitions ran (a fallback would say why in the detail)
    assert rec.detail.count("in a green context of ") == 2, rec.detail
    assert rec.digest == next(c for c in s.checks if c.name == "repeat").digest
    assert "launch budget" in next(c for c in s.checks if c.name == "timeout").detail


@pytest.mark.parametrize("name", ["control_gemm_chain", "control_gemm_chain_2d"])
def test_route_class_controls_admitted_bitwise_equal(negative_manifest, name):
    s = negative_manifest.symbol(name)
    assert s.status == "admitted", f"{name}: [{s.check}] {s.reason}"
    eq = [c for c in s.checks if c.name == "route-equivalence"]
    assert len(eq) == 7 and all(c.passed for c in eq)  # six check M values and the verdict
    assert "bitwise equal to control_gemm_chain" in eq[-1].detail or "the class reference" in eq[-1].detail
    routes = negative_manifest.routes
    assert [r.symbols for r in routes] == [["control_gemm_chain_2d", "pairwise_gemm", "control_gemm_chain"]]


def test_pdl_control_admitted_with_its_pdl_check(negative_manifest):
    s = negative_manifest.symbol("control_pdl_scale")
    assert s.status == "admitted", f"[{s.check}] {s.reason}"
    rec = next(c for c in s.checks if c.name == "pdl")
    assert rec.passed and "programmatic dependent launch" in rec.detail, rec.detail
    assert rec.digest == next(c for c in s.checks if c.name == "repeat").digest
    assert s.pdl_max_blocks == 64
    assert reason_class(negative_manifest.symbol("reads_before_pdl_wait").check) == "nondeterministic"


def test_split_control_admitted_with_its_split_check(negative_manifest):
    s = negative_manifest.symbol("control_split_running_sum")
    assert s.status == "admitted", f"[{s.check}] {s.reason}"
    rec = next(c for c in s.checks if c.name == "split")
    assert rec.passed and "bitwise equal to one call over L = 37" in rec.detail, rec.detail
    assert reason_class(negative_manifest.symbol("split_variant_running_sum").check) == "split-variant"


def test_negative_manifest_layout(negative_manifest):
    m = negative_manifest
    assert m.device.cc == "9.0" and m.device.sm_count > 0 and m.device.driver_version >= 13000
    assert m.development_key and m.qualification_seconds > 0
    assert {a.code for a in m.artifacts} == {"cubin"}  # one per module; PTX is not byte-reproducible: never signed


def test_live_admission_refuses_dynamic_smem_over_the_device_limit(negative_build):
    cat = load_catalog(NEGATIVE)
    dev = cu.Device(0)
    ctx = C.Context(dev, dev.info())
    ctx.open()
    mod = cu.Module((negative_build / f"{_target()}/QualifyNegative.cubin").read_bytes())
    fn = mod.function("control_smem_reverse")
    sym = cat.symbols["control_smem_reverse"]
    fam = cat.modules[0].family("control_smem_reverse")
    ok = C.live_admit(ctx, fn, sym, fam, None)
    assert ok.ok and ok.layout_source == "cuFuncGetParamInfo" and ok.resources.blocks_per_sm >= 1
    over = sym.model_copy(update={"dynamic_smem": ctx.info.optin_smem + 1024})
    bad = C.live_admit(ctx, fn, over, fam, None)
    assert not bad.ok and bad.check == "smem" and str(ctx.info.optin_smem) in bad.reason
    mism = C.live_admit(ctx, mod.function("abi_mismatch"), cat.symbols["abi_mismatch"],
                        cat.modules[0].family("abi_mismatch"), None)
    assert not mism.ok and mism.check == "abi"
    mod.unload()


def test_guard_kernel_finds_every_changed_byte(negative_build):
    """mf_guard_check on the device: one byte changed anywhere in a guard (unaligned head, uint4 body, tail)
    or an input is found with its offset; restored, the check passes. misses_tail's y holds 16388 bytes, so
    the guard after it starts 4 bytes past a 16-byte boundary."""
    cat = load_catalog(NEGATIVE)
    dev = cu.Device(0)
    ctx = C.Context(dev, dev.info())
    ctx.open()
    mod = cu.Module((negative_build / f"{_target()}/QualifyNegative.cubin").read_bytes())
    spec = S.evaluate(cat.symbols["misses_tail"], cat.modules[0].family("misses_tail"))
    inputs = C.make_inputs(spec, "uniform", np.random.default_rng(3), False)
    inst = C.Instance(ctx, spec, mod.function("misses_tail"), inputs, offset=256)
    try:
        inst.run()
        for r in inst.guards.regions:
            for at in sorted({0, 1, 11, 12, 13, 16, 31, r.nbytes // 2 + 5, r.nbytes - 17, r.nbytes - 1}):
                old = cu.memcpy_dtoh(r.ptr + at, 1)
                cu.memset_d8(r.ptr + at, old[0] ^ 0x5A, 1)
                cu.context_synchronize()
                with pytest.raises(G.GuardViolation) as err:
                    inst.verify()
                want = {"after": f"at +{at}..+{at}", "before": f"at -{r.nbytes - at}..-{r.nbytes - at}",
                        "input": f"(byte {at})"}[r.kind]
                assert want in err.value.reason and r.buffer in err.value.reason, (r.kind, at, err.value.reason)
                cu.memcpy_htod(r.ptr + at, old)
                cu.context_synchronize()
                inst.verify()
    finally:
        inst.free()
        mod.unload()


def test_driver_memory_graph_and_param_info():
    dev = cu.Device(0)
    dev.make_current()
    info = dev.info()
    assert info.name and info.sm_count > 0 and info.optin_smem >= 48 * 1024
    buf = cu.DeviceBuffer(1024)
    data = np.arange(256, dtype=np.float32).tobytes()
    cu.memcpy_htod(buf.ptr, data)
    assert cu.memcpy_dtoh(buf.ptr, 1024) == data
    s = cu.Stream()
    g = cu.Graph.capture(s, lambda: cu.memset_d8(buf.ptr, 0xAB, 1024, s))
    g.launch(s)
    s.synchronize()
    assert cu.memcpy_dtoh(buf.ptr, 1024) == b"\xab" * 1024
    g.destroy()
    s.destroy()
    buf.free()
    with pytest.raises(cu.CudaError, match="CUDA_ERROR"):
        cu.Module(b"not a cubin")


def test_fixed_module_qualifies_at_quick_level(tmp_path):
    cat = load_catalog(default_catalog_path())
    target = _target()
    bm = build(BuildRequest(cat, [get_target(target)], tmp_path))
    req = runner.QualifyRequest(build_dir=tmp_path, build=bm, catalog=cat, devices=[0], level="quick",
                                only_modules={"Fixed"})
    result = runner.qualify(req)
    fixed = [s for s in result.manifest.symbols if s.module == "Fixed" and s.target == target]
    assert fixed
    harness = [f"{s.name}: {s.reason}" for s in fixed if s.check == "harness"]
    assert not harness, "qualifier failures:\n" + "\n".join(harness)
    rejected = [f"{s.name} [{s.check}] {s.reason}" for s in fixed if s.status != "admitted"]
    print(f"Fixed on {target}: {len(fixed) - len(rejected)} admitted, {len(rejected)} rejected in "
          f"{result.manifest.qualification_seconds:.1f} s")
    assert not rejected, "\n".join(rejected)
    body = tomllib.loads(body_bytes(result.manifest).decode())
    assert body["kind"] == "qualified" and len(body["symbols"]) == len(result.manifest.symbols)


def _gpu_count() -> int:
    try:
        return cu.device_count()
    except cu.CudaError:
        return 0


@pytest.mark.skipif(_gpu_count() < 2, reason="needs two GPUs of one model")
def test_two_gpus_compare_digests(negative_build):
    cat = load_catalog(NEGATIVE)
    bm_path = negative_build / "manifest.toml"
    from mamba_forge.core.schema import BuildManifest
    from mamba_forge.manifest.toml_io import read

    req = runner.QualifyRequest(build_dir=negative_build, build=read(bm_path, BuildManifest), catalog=cat,
                                devices=[0, 1], seed=11, timeout_s=10)
    m = runner.qualify(req).manifest
    assert m.device.count == 2
    for name in CONTROLS:
        s = m.symbol(name)
        assert s.status == "admitted", s.reason
        assert s.checks[-1].name == "cross-device" and s.checks[-1].passed
    assert m.symbol("nondet_sum").status == "rejected"
