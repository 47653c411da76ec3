"""What a newcomer review found, one group each: TORCH_CUDA_ARCH_LIST's architectures that mamba-forge does not
build are skipped with a note (ours stay strict); the build's time estimate follows its largest program and what
a running program has already run; load()'s refusals of a missing bundle or artifact say what to do, and a wrong
artifact in a build folder says how a --kernels build comes to leave one; the runtime exports every refusal class;
load() tells a build manifest and a README from an unsigned manifest, as `verify` does; `python -m mamba_forge`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_support import FakeBackend, signed_tiny

from mamba_forge.catalog.targets import parse_arch_list, select_targets
from mamba_forge.cli import main
from mamba_forge.core.errors import ForgeError
from mamba_forge.runtime import signing

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = list
TORCH_DEFAULT = "5.2 6.0 6.1 7.0 7.2 7.5 8.0 8.6 8.7 9.0+PTX"  # a torch build's own list, as a newcomer has it


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


# ---- 1. TORCH_CUDA_ARCH_LIST ---------------------------------------------------------------------------------


def test_torch_list_skips_what_mamba_forge_does_not_build_with_a_note():
    sel = select_targets(None, {"TORCH_CUDA_ARCH_LIST": TORCH_DEFAULT}, NO_GPU)
    assert (sel.names, sel.source) == (("sm_80", "sm_86", "sm_90"), "TORCH_CUDA_ARCH_LIST")
    skipped = [n for n in sel.notes if "skipped" in n]
    assert len(skipped) == 1 and "\n" not in skipped[0], sel.notes
    assert skipped[0].startswith("TORCH_CUDA_ARCH_LIST: skipped 5.2 (sm_52), 6.0 (sm_60), 6.1 (sm_61), 7.0 (sm_70), "
                                 "7.2 (sm_72), 7.5 (sm_75), 8.7 (sm_87), which mamba-forge does not build; "
                                 "set MAMBA_FORGE_ARCH or pass --arch"), skipped[0]
    sel = select_targets(None, {"TORCH_CUDA_ARCH_LIST": "8.0;8.6;8.7;8.9;9.0"}, NO_GPU)
    assert sel.names == ("sm_80", "sm_86", "sm_89", "sm_90")
    assert any("skipped 8.7 (sm_87)" in n for n in sel.notes)
    sel = select_targets(None, {"TORCH_CUDA_ARCH_LIST": "8.0;9.0a"}, NO_GPU)  # nothing to skip: no such note
    assert sel.names == ("sm_80", "sm_90a") and not any("skipped" in n for n in sel.notes)


@pytest.mark.parametrize(("value", "message"), [
    ("7.0", "TORCH_CUDA_ARCH_LIST: '7.0' is sm_70, which mamba-forge does not build; set MAMBA_FORGE_ARCH or pass "
            "--arch"),
    ("5.2;7.0+PTX", "TORCH_CUDA_ARCH_LIST names only architectures mamba-forge does not build: 5.2 (sm_52), "
                    "7.0+PTX (sm_70); set MAMBA_FORGE_ARCH or pass --arch"),
])
def test_torch_list_with_nothing_left_is_refused_saying_how_to_choose(value, message):
    with pytest.raises(ForgeError) as exc:
        select_targets(None, {"TORCH_CUDA_ARCH_LIST": value}, NO_GPU)
    assert str(exc.value).startswith(message) and exc.value.exit_code == 2, str(exc.value)


@pytest.mark.parametrize(("cli", "env", "source"), [
    (None, {"MAMBA_FORGE_ARCH": "8.0 8.7", "TORCH_CUDA_ARCH_LIST": "8.0"}, "MAMBA_FORGE_ARCH"),
    (["8.0,8.7"], {"TORCH_CUDA_ARCH_LIST": "8.0"}, "--arch"),
])
def test_our_own_choices_stay_strict(cli, env, source):
    with pytest.raises(ForgeError, match=rf"^{source}: '8.7' is sm_87, which mamba-forge does not build"):
        select_targets(cli, env, NO_GPU)
    with pytest.raises(ForgeError, match="'8.7' is sm_87"):
        parse_arch_list("8.0 8.7", "TORCH_CUDA_ARCH_LIST", NO_GPU)  # skipping is asked for, never the default


def test_build_dry_run_with_torchs_default_list_builds_what_it_can(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("MAMBA_FORGE_ARCH", raising=False)
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", TORCH_DEFAULT)
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / "cache"))
    rc, out, err = run(capsys, "build", "--dry-run", "--kernels", "softplus*", "--out", tmp_path / "b")
    assert rc == 0, err
    assert "note: TORCH_CUDA_ARCH_LIST: skipped 5.2 (sm_52)" in err and "sm_90" in out
    assert not (tmp_path / "b").exists()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "6.1;7.5")
    rc, _, err = run(capsys, "build", "--dry-run", "--out", tmp_path / "b")
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: TORCH_CUDA_ARCH_LIST names only "), err
    assert "set MAMBA_FORGE_ARCH or pass --arch" in lines[0]


# ---- 2. the build's time estimate -------------------------------------------------------------------------


def test_first_guess_is_never_below_the_largest_program():
    from mamba_forge.cli.cmd_build import PRIOR_SECONDS_PER_SYMBOL as RATE
    from mamba_forge.cli.cmd_build import first_guess_s

    # one 242-symbol program and 58 symbols of small ones on 2 workers: the big one alone is the critical path
    assert first_guess_s(300, 10, 2, 242) == pytest.approx(RATE * 242)
    # many programs of a size: spread over the workers as before
    assert first_guess_s(300, 30, 2, 10) == pytest.approx(RATE * 150)
    assert first_guess_s(300, 1, 4, 300) == pytest.approx(RATE * 300)  # one program: one worker
    # the largest program may be cached: never more than the symbols left to compile
    assert first_guess_s(20, 2, 2, 242) == pytest.approx(RATE * 20)


def test_header_says_the_largest_programs_time():
    from types import SimpleNamespace

    from mamba_forge.cli.cmd_build import _header

    plan = SimpleNamespace(programs=10, symbols=300, targets=["sm_90a"], cached=0, symbols_to_compile=300,
                           workers=2)
    assert _header(plan, 242).endswith("with 2 workers (about 55 s, a first guess)")  # 0.23 s x 242, not x 150


def test_estimate_left_takes_what_running_units_have_run():
    from mamba_forge.progress import RUNNING_FLOOR_S, estimate_left_s

    assert estimate_left_s(1.0, [(300, 60.0)], [], 2) == 240.0  # one unit running: its estimate less its time
    assert estimate_left_s(1.0, [(300, 400.0)], [], 2) == RUNNING_FLOOR_S  # past its estimate: the floor
    assert estimate_left_s(1.0, [(300, 60.0), (10, 5.0)], [10, 10], 2) == 240.0  # the long one is the path
    assert estimate_left_s(1.0, [(10, 0.0), (10, 0.0)], [10, 10], 2) == 20.0  # equal ones: shared by the workers
    assert estimate_left_s(1.0, [], [], 2) == 0.0


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class _Lines:
    is_terminal = False

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **kw) -> None:
        self.lines.append(text)


def test_progress_does_not_rise_while_the_large_program_runs():
    """The reported case: one large program and nine small ones on two workers. Counting the weight left over the
    units left, the estimate rose as the small ones finished (only the large one ran: one worker, not two); now it
    falls by what the large one has run."""
    from mamba_forge.progress import Progress

    clock, con = _Clock(), _Lines()
    queue = [("Fixed sm_90a", 242)] + [(f"Small{i} sm_90a", 10) for i in range(9)]
    estimates = []
    with Progress("build", 10, con, mode="lines", clock=clock) as p:
        p.begin("header", timed=10, workers=2, prior_s=0.23, weight=332, queue=queue)
        for i in range(9):  # the small ones, 3 s each, one after another on the second worker
            clock.t += 3.0
            p.finished(f"Small{i} sm_90a", seconds=3.0, weight=10)
            estimates.append(p.remaining_s())
        assert estimates == sorted(estimates, reverse=True), estimates
        assert estimates[-1] == pytest.approx(0.3 * 242 - 27.0)  # the large one's share less its 27 s so far
        clock.t = 600.0  # far past its estimate: a small floor, never a negative figure or none
        assert p.remaining_s() == pytest.approx(1.0)
        p.finished("Fixed sm_90a", seconds=600.0, weight=242)
        assert p.remaining_s() is None
    assert con.lines[9] == "[9/10] Small8 sm_90a 3.0 s (about 45 s left)", con.lines


def test_progress_cache_hits_give_their_place_in_the_queue():
    from mamba_forge.progress import Progress

    clock = _Clock()
    with Progress("build", 3, None, clock=clock) as p:
        p.begin("h", timed=2, workers=1, prior_s=1.0, weight=20,
                queue=[("A sm_90a", 100), ("B sm_90a", 10), ("C sm_90a", 10)])
        p.finished("A sm_90a", tag="cached")  # reported before any compile: B runs from the start
        clock.t = 4.0
        assert p.remaining_s() == pytest.approx(6.0 + 10.0)  # B: 10 less its 4 s; C: 10, after it on one worker


# ---- 3, 5: load()'s refusals ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    """The tiny catalog built for sm_90a (its build manifest written, as the CLI does), qualified and signed."""
    return signed_tiny(tmp_path_factory.mktemp("newcomer_fixes"), build_manifest=True)


def _load(fx, path, **kw):
    from mamba_forge.runtime import load

    return load(path, trusted_keys=[fx.pub], default_keys=False, backend=FakeBackend(), **kw)


def test_a_missing_bundle_says_how_to_make_one(fx, tmp_path):
    from mamba_forge.runtime import ArtifactRefused

    with pytest.raises(ArtifactRefused) as exc:
        _load(fx, tmp_path / "h200.tar.gz")
    assert str(exc.value) == (f"{tmp_path / 'h200.tar.gz'} does not exist; make one with `mamba-forge bundle "
                              f"MANIFEST --build BUILD -o {tmp_path / 'h200.tar.gz'}`")
    with pytest.raises(ArtifactRefused, match="does not exist; pass a signed qualified manifest, a bundle"):
        _load(fx, tmp_path / "h200.toml")


def _away(fx, tmp_path) -> Path:
    """The signed manifest (and its runtime table) copied away from its build folder, as manifests/ holds it."""
    away = tmp_path / "manifests"
    away.mkdir()
    for f in (fx.manifest, fx.manifest.with_suffix(".runtime.json")):
        shutil.copy(f, away / f.name)
    return away / fx.manifest.name


def test_a_bare_manifest_without_its_artifacts_says_pass_build(fx, tmp_path, capsys):
    from mamba_forge.runtime import ArtifactRefused

    bare = _away(fx, tmp_path)
    with pytest.raises(ArtifactRefused) as exc:
        _load(fx, bare)
    msg = str(exc.value)
    assert msg.startswith("artifact sm_90a/") and f"is missing from folder {bare.parent}; pass build= (the --out " \
        "folder of `mamba-forge build`) or load a bundle" in msg and "\n" not in msg, msg
    assert _load(fx, bare, build=fx.build).manifest.device.name == "NVIDIA H200"
    # the CLI keeps its own words (--build DIR), not load()'s
    rc, _, err = run(capsys, "verify", bare, "--key", fx.pub)
    assert rc == 1 and "--build DIR" in err and "build=" not in err, err


def _shrunk_build(fx, tmp_path) -> Path:
    """A copy of the build folder whose program is smaller than the manifest records, as a --kernels build
    leaves it."""
    build = tmp_path / "build"
    shutil.copytree(fx.build, build)
    cubin = next(build.glob("sm_90a/*.cubin"))
    cubin.write_bytes(cubin.read_bytes()[: cubin.stat().st_size // 2])
    return build


REBUILT = "(a build with --kernels or --module writes a smaller program under the same name: rebuild without them)"


def test_a_smaller_artifact_in_a_build_folder_says_how_that_comes_about(fx, tmp_path, capsys):
    from mamba_forge.runtime import ArtifactRefused

    build = _shrunk_build(fx, tmp_path)
    bare = _away(fx, tmp_path)
    rc, _, err = run(capsys, "verify", bare, "--key", fx.pub, "--build", build)
    lines = err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and "bytes, the manifest says" in lines[0] and lines[0].endswith(REBUILT), err
    with pytest.raises(ArtifactRefused) as exc:
        _load(fx, bare, build=build)
    assert str(exc.value).endswith(REBUILT), str(exc.value)


def test_the_rebuild_explanation_only_where_it_can_apply():
    from mamba_forge.runtime.sources import Source

    folder = Source("folder build", Path("build"), bare=True)
    assert str(folder.refused("a.cubin", "is 9 bytes, the manifest says 10", True)).endswith(REBUILT)
    assert "writes another program" in str(folder.refused("a.cubin", "does not match its sha256 in the manifest"))
    assert "--kernels" not in str(folder.refused("a.cubin"))  # missing: the caller's hint, not this one
    for src in (Source("bundle b.tar.gz", members={}, exact=True), Source("index folder x", Path("x"))):
        assert "--kernels" not in str(src.refused("a.cubin", "is 9 bytes, the manifest says 10", True))


def test_load_tells_a_build_manifest_and_a_readme_from_an_unsigned_manifest(fx, tmp_path):
    from mamba_forge.runtime import SignatureRefused

    cases = {
        fx.build / "manifest.toml": "is a build manifest, which is never signed",
        ROOT / "README.md": "is not a manifest: not TOML (",
        ROOT / "pyproject.toml": "is not a manifest: it has no kind key",
    }
    for path, reason in cases.items():
        with pytest.raises(SignatureRefused) as exc:
            _load(fx, path)
        msg = str(exc.value)
        assert msg.startswith(f"{path} {reason}") and "not signed (no [signature]" not in msg, msg
        assert msg.endswith("; pass a signed qualified manifest, a bundle (.tar.gz or folder) or a release index")
        assert "\n" not in msg
    unsigned = tmp_path / "unsigned.toml"  # a qualified manifest that lost its signature: that, as before
    unsigned.write_bytes(fx.manifest.read_bytes().split(signing.MARKER)[0] + b"\n")
    with pytest.raises(SignatureRefused, match="does not verify: the manifest is not signed"):
        _load(fx, unsigned)


def test_load_and_verify_draw_the_same_line(fx, tmp_path):
    """The runtime's not_a_manifest and the CLI's make the same distinctions, in the same words but for the build
    manifest's tail (the runtime's names what makes a signed one)."""
    from mamba_forge.cli.cmd_verify import _not_a_manifest
    from mamba_forge.runtime.verify import not_a_manifest

    (tmp_path / "other.toml").write_text('kind = "catalog"\n')
    (tmp_path / "binary.toml").write_bytes(b"\xff\xfe\x00")
    paths = [ROOT / "README.md", ROOT / "pyproject.toml", tmp_path / "other.toml", tmp_path / "binary.toml",
             fx.build / "manifest.toml", fx.manifest, fx.manifest.with_suffix(".runtime.json")]
    for p in paths:
        cli, ours = _not_a_manifest(p), not_a_manifest(p.read_bytes())
        assert (cli is None) == (ours is None), p
        if cli is not None and not cli.startswith("is a build manifest"):
            assert cli == ours, p
    assert not_a_manifest(fx.manifest.read_bytes()) is None


# ---- 4. the runtime's refusal classes -------------------------------------------------------------------------


def test_every_refusal_class_is_exported_without_importing_anything_heavy():
    code = (
        "import sys\n"
        "from mamba_forge.runtime import IncompleteOnDevice, FamilyUnavailable, TileRequired, LoadError\n"
        "import mamba_forge.runtime as r, mamba_forge.runtime.errors as e\n"
        "classes = [n for n, v in vars(e).items() if isinstance(v, type) and issubclass(v, LoadError)]\n"
        "print(sorted(set(classes) - set(r.__all__)))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'typer', 'rich', 'pydantic', "
        "'numpy', 'cryptography', 'cuda') or m.startswith('mamba_forge.runtime.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["[]", "['mamba_forge.runtime.errors']"], out
    import mamba_forge.runtime as r

    assert all(hasattr(r, name) for name in r.__all__)
    assert issubclass(r.TrustRefused, r.SignatureRefused)  # resolved on use, with the trusted keys


# ---- 6. python -m mamba_forge ---------------------------------------------------------------------------------


def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "mamba_forge", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "Usage: python -m mamba_forge" in done.stdout and "build" in done.stdout, done
    done = subprocess.run([sys.executable, "-m", "mamba_forge", "build", "--arch", "sm_91", "--dry-run"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("error: unknown architecture 'sm_91'"), done.stderr
