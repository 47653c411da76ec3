"""Building fixture catalogs with NVRTC (no GPU needed): resources, static admission and its negative controls,
byte reproducibility across processes, the build manifest, and the CLI's exit codes and messages."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.targets import SMEM_RESERVED_BYTES, get_target
from mamba_forge.cli import main
from mamba_forge.core.schema import BuildManifest
from mamba_forge.manifest import toml_io as manifest_io

FIXTURES = Path(__file__).parent / "fixtures"
BASIC = FIXTURES / "build_basic" / "catalog.toml"
NEGATIVE = FIXTURES / "build_negative" / "catalog.toml"


def run_build(catalog: Path, out: Path, targets=("sm_80", "sm_90a"), cache=None) -> BuildManifest:
    req = BuildRequest(load_catalog(catalog), [get_target(t) for t in targets], out, jobs=1, cache_location=cache)
    return build(req)


@pytest.fixture(scope="module")
def negative(tmp_path_factory) -> BuildManifest:
    return run_build(NEGATIVE, tmp_path_factory.mktemp("neg"))


def verdicts(m: BuildManifest, target: str) -> dict[str, tuple[str, str, str]]:
    return {
        s.name: (s.verdict.status, s.verdict.check, s.verdict.reason)
        for mod in m.modules
        if mod.target == target
        for s in mod.symbols
    }


@pytest.mark.parametrize(
    ("symbol", "check", "figure"),
    [
        ("register_hog", "registers", r"\d+ registers per thread > cap 32"),
        ("spiller", "spills", r"\d+ bytes spill stores \+ \d+ loads > allowed 0"),
        ("stack_user", "stack", r"\d+ bytes stack frame > allowed 0"),
        ("float_atomic", "float-atomics", r"floating-point atomics \(atom\.global\.add\.f32\)"),
        ("int_ticket", "static-tokens", r"forbids atom\.\*, red\.\*, local memory and call in its PTX; "
                                        r"found atom\.global\.add\.u32$"),
        ("printf_call", "static-tokens", r"found .*call\.uni"),
        ("local_scratch", "static-tokens", r"found .*local"),
        ("missing_kernel", "exports", r"declared in the catalog but not exported"),
        ("stowaway", "exports", r"exported by module Controls but not declared"),
    ],
)
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_negative_controls_rejected_with_reason(negative, symbol, check, figure, target):
    status, got_check, reason = verdicts(negative, target)[symbol]
    assert status == "rejected"
    assert got_check == check
    assert reason.startswith(f"{symbol} on {target}: ")
    assert re.search(figure, reason), reason


def test_shared_memory_limit_depends_on_target(negative):
    status, check, reason = verdicts(negative, "sm_80")["smem_hog"]
    assert (status, check) == ("rejected", "smem")
    assert "204800 bytes shared memory > 166912 opt-in limit" in reason
    assert verdicts(negative, "sm_90a")["smem_hog"][0] == "admitted"  # 227 KB there


def test_siblings_of_rejected_symbols_stay_admitted(negative):
    for target in ("sm_80", "sm_90a"):
        v = verdicts(negative, target)
        assert v["good"][0] == "admitted"
        assert v["float_atomic_nondet"][0] == "admitted"  # does not claim determinism
        assert v["int_ticket_allowed"][0] == "admitted"  # the token policy lifted for its family
        assert v["pdl_waits"][0] == "admitted"  # declares programmatic dependent launch and waits


def test_a_pdl_launch_without_a_wait_is_rejected_where_pdl_exists(negative):
    """pdl_max_blocks promises the runtime that the kernel waits (griddepcontrol.wait) before its first global
    access; the build holds a symbol to it on targets with PDL (sm_90+) and nowhere else."""
    status, check, reason = verdicts(negative, "sm_90a")["pdl_no_wait"]
    assert (status, check) == ("rejected", "pdl-wait")
    assert reason.startswith("pdl_no_wait on sm_90a: its catalog launch declares pdl_max_blocks = 1024 but its PTX "
                             "never waits (griddepcontrol.wait)")
    assert verdicts(negative, "sm_80")["pdl_no_wait"][0] == "admitted"  # no PDL before sm_90: never launched so


def test_block_limit_is_checked(tmp_path):
    """Admission refuses a block over the target's limit (the catalog refuses one at load since the launch limits:
    tests/adversarial/test_launch_shapes.py; this is the build's own check behind it)."""
    from mamba_forge.build.admit import admit_symbol
    from mamba_forge.core.schema import Resources

    cat = load_catalog(NEGATIVE)
    sym = cat.symbols["good"].model_copy(update={"name": "too_wide", "block": (2048, 1, 1)})
    res = Resources(registers=8, static_smem=0, stack_frame=0, spill_stores=0, spill_loads=0, max_threads=0,
                    barriers=0, param_bytes=8)
    v = admit_symbol(sym, res, get_target("sm_90a"))
    assert (v.status, v.check) == ("rejected", "block")
    assert "2048 threads > 1024" in v.reason


def test_failed_module_is_recorded_and_others_go_on(negative):
    broken = [m for m in negative.modules if m.kind == "Broken"]
    assert broken and all(m.status == "failed" for m in broken)
    assert all("undefined_symbol_here" in m.log_head for m in broken)
    assert all(s.verdict.check == "compile" for m in broken for s in m.symbols)
    assert all(m.status == "compiled" for m in negative.modules if m.kind == "Controls")
    assert negative.failed_mandatory() == []  # Broken is optional


def test_resources_read_from_cubin_and_log(tmp_path):
    m = run_build(BASIC, tmp_path, targets=("sm_90a",))
    syms = {s.name: s for _, s in m.symbols()}
    scale = syms["scale_bf16"].resources
    assert scale.max_threads == 128  # __launch_bounds__(128)
    assert 4 <= scale.registers <= 64
    assert scale.param_layout == [[0, 8], [8, 8], [16, 4], [20, 4]]
    assert scale.param_bytes == 24
    tile = syms["tile_sum_t256"].resources
    assert tile.static_smem == 256 * 4 and tile.barriers == 1
    assert syms["tile_sum_t64"].resources.static_smem == 64 * 4
    assert all(s.verdict.status == "admitted" for s in syms.values())


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia

        for base in nvidia.__path__:
            cand = Path(base) / "cu13" / "bin" / "cuobjdump"
            if cand.is_file():
                return str(cand)
    except ImportError:
        pass
    return None


@pytest.mark.skipif(_cuobjdump() is None, reason="cuobjdump is not installed (pip install nvidia-cuda-cuobjdump)")
def test_resources_agree_with_cuobjdump(tmp_path):
    m = run_build(NEGATIVE, tmp_path, targets=("sm_90a",))
    mod = next(x for x in m.modules if x.kind == "Controls")
    cubin = tmp_path / next(a.path for a in mod.artifacts if a.code == "cubin")
    text = subprocess.run([_cuobjdump(), "--dump-resource-usage", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    theirs = {
        name: (int(reg), int(stack), int(shared))
        for name, reg, stack, shared in re.findall(r"Function (\w+):\s+REG:(\d+) STACK:(\d+) SHARED:(\d+)", text)
    }
    ours = {s.name: s.resources for s in mod.symbols if s.resources}
    assert set(theirs) - set(ours) == {"stowaway"}  # exported, undeclared: recorded without resources
    for name, res in ours.items():
        reg, stack, shared = theirs[name]
        assert res.registers == reg, name
        assert res.stack_frame == stack, name
        assert res.static_smem + SMEM_RESERVED_BYTES == shared, name  # cuobjdump counts the system's 1 KB on sm_90


def _digests(manifest: BuildManifest) -> dict[str, str]:
    return {a.path: a.sha256 for m in manifest.modules for a in m.artifacts}


def test_two_independent_processes_build_identical_bytes(tmp_path):
    outs = []
    for i in range(2):
        out = tmp_path / f"b{i}"
        env = dict(os.environ, MAMBA_FORGE_CACHE="off")
        subprocess.run(
            [sys.executable, "-m", "mamba_forge.cli", "build", "--catalog", str(BASIC), "--out", str(out), "-q",
             "--arch", "sm_80,sm_90a,sm_120a"],
            check=True, env=env, cwd=tmp_path,
        )
        outs.append(manifest_io.read(out / "manifest.toml", BuildManifest))
    a, b = (_digests(m) for m in outs)
    assert a == b and len(a) == 6
    for path, digest in a.items():
        assert hashlib.sha256((tmp_path / "b1" / path).read_bytes()).hexdigest() == digest
    # nothing of this machine leaks into the bytes
    for path in a:
        blob = (tmp_path / "b0" / path).read_bytes()
        assert str(tmp_path).encode() not in blob and str(FIXTURES).encode() not in blob


def test_manifest_round_trips_through_toml(tmp_path, negative):
    path = tmp_path / "m.toml"
    manifest_io.write(path, negative)
    again = manifest_io.read(path, BuildManifest)
    assert again == negative


def test_build_manifest_records_toolchain_and_options(tmp_path):
    m = run_build(BASIC, tmp_path, targets=("sm_90a",))
    assert m.toolchain.nvrtc_version.startswith("13.")
    assert "include/fx/scale.cuh" in m.toolchain.header_sha256
    mod = m.modules[0]
    assert "-arch=sm_90a" in mod.options and "--ptxas-options=-v" in mod.options
    assert not any(str(tmp_path) in o or "site-packages" in o for o in mod.options)
    assert {a.code for a in mod.artifacts} == {"cubin", "ptx"}


# ---- CLI -----------------------------------------------------------------------------------------------------


def cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_cli_unknown_arch_is_one_line_exit_2(capsys, tmp_path):
    rc, out, err = cli(capsys, "build", "--catalog", str(BASIC), "--out", str(tmp_path), "--arch", "sm_99")
    assert rc == 2
    assert err.strip().count("\n") == 0
    assert "unknown architecture 'sm_99'" in err and "sm_90a" in err
    assert "Traceback" not in err


def test_cli_missing_catalog(capsys, tmp_path):
    rc, _, err = cli(capsys, "build", "--catalog", str(tmp_path / "none.toml"), "--out", str(tmp_path))
    assert rc == 2 and "catalog file not found" in err and "--catalog" in err


@pytest.mark.parametrize("cap", ["0", "300"])
def test_cli_bad_state_cap(capsys, tmp_path, cap):
    rc, _, err = cli(capsys, "build", "--catalog", str(BASIC), "--out", str(tmp_path), "--state-cap", cap)
    assert rc == 2 and "--state-cap 16..256" in err


def test_cli_bad_option_value_is_one_line(capsys, tmp_path):
    rc, _, err = cli(capsys, "build", "--jobs", "many")
    assert rc == 2 and "error:" in err and "--help" in err and err.strip().count("\n") == 0


def test_cli_mandatory_failure_exits_1(capsys, tmp_path):
    # make the broken module mandatory in a copy of the negative catalog
    dst = tmp_path / "cat"
    shutil.copytree(NEGATIVE.parent, dst)
    text = (dst / "catalog.toml").read_text().replace('kind = "Broken"\nmandatory = false', 'kind = "Broken"\nmandatory = true')
    (dst / "catalog.toml").write_text(text)
    rc, _, err = cli(capsys, "build", "--catalog", str(dst / "catalog.toml"), "--out", str(tmp_path / "o"), "-q",
                     "--arch", "sm_90a", "--no-cache")
    assert rc == 1 and "mandatory module failed to compile: Broken (sm_90a)" in err
    assert (tmp_path / "o" / "manifest.toml").is_file()  # the record is written all the same


def test_cli_json_and_report(capsys, tmp_path):
    import json

    rc, out, _ = cli(capsys, "build", "--catalog", str(NEGATIVE), "--out", str(tmp_path), "--json", "--arch", "sm_90a",
                     "--no-cache")
    assert rc == 0
    data = json.loads(out)["result"]["manifest"]
    assert data["kind"] == "build" and data["targets"] == ["sm_90a"]
    rc, out, _ = cli(capsys, "report", str(tmp_path / "manifest.toml"), "--json")
    rep = json.loads(out)["result"]
    assert rc == 0
    assert {r["symbol"] for r in rep["rejected"]} >= {"register_hog", "float_atomic", "stowaway", "broken"}
    rc, out, _ = cli(capsys, "report", str(tmp_path / "manifest.toml"))
    assert rc == 0 and "register_hog on sm_90a" in out


def test_cli_report_missing_manifest(capsys, tmp_path):
    rc, _, err = cli(capsys, "report", str(tmp_path / "nope.toml"))
    assert rc == 2 and "manifest not found" in err  # a missing input is bad input


def test_nvrtc_compute_cache_is_off_unless_the_caller_chose(monkeypatch):
    """NVRTC's shared compute cache sits outside our keyed, hashed cache: the build turns it off by default."""
    from mamba_forge.build import nvrtc

    monkeypatch.delenv("CUDA_CACHE_DISABLE", raising=False)
    nvrtc._nvrtc()
    assert os.environ["CUDA_CACHE_DISABLE"] == "1"
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "0")
    nvrtc._nvrtc()
    assert os.environ["CUDA_CACHE_DISABLE"] == "0"


def test_ptxas_log_reads_smem_after_a_stack_figure():
    """ptxas prints "N bytes cumulative stack size" between the barriers and the smem figure when a kernel has a
    stack: the static shared memory must still be read (it was 0 there, under-counting the admission's smem sum)."""
    from mamba_forge.build.cubin import parse_ptxas_log

    log = ("ptxas info    : Compiling entry function 'k_stack' for 'sm_90a'\n"
           "ptxas info    : Function properties for k_stack\n"
           "    40 bytes stack frame, 16 bytes spill stores, 24 bytes spill loads\n"
           "ptxas info    : Used 128 registers, used 1 barriers, 40 bytes cumulative stack size, 34816 bytes smem, "
           "716 bytes cmem[0]\n"
           "ptxas info    : Compiling entry function 'k_plain' for 'sm_90a'\n"
           "ptxas info    : Used 64 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]\n"
           "ptxas info    : Compiling entry function 'k_none' for 'sm_90a'\n"
           "ptxas info    : Used 32 registers, 380 bytes cmem[0]\n")
    got = parse_ptxas_log(log)
    assert (got["k_stack"].registers, got["k_stack"].barriers, got["k_stack"].smem) == (128, 1, 34816)
    assert (got["k_stack"].stack_frame, got["k_stack"].spill_stores, got["k_stack"].spill_loads) == (40, 16, 24)
    assert (got["k_plain"].smem, got["k_none"].smem, got["k_none"].barriers) == (1024, 0, 0)
