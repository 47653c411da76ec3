"""What a newcomer trips over (issue #26), one test each: the default targets in `build -h` from the one list in
catalog/targets.py, `verify` hints and its refusal of files that are not manifests, `report --diff A` alone,
`--kernels` hints before anything is built, plurals and articles, check names told apart in `report --symbols`,
and output for a log (off a terminal): one line per item, names never broken, no trailing spaces; `report --diff
--module/--target`."""

from __future__ import annotations

import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w
from runtime_support import signed_tiny

from mamba_forge.catalog.targets import DEFAULT_TARGETS
from mamba_forge.cli import main
from mamba_forge.cli.common import article, plural
from mamba_forge.runtime import signing

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT / "manifests" / "h200.toml"


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    """The tiny catalog built for sm_90a (build/manifest.toml written as the CLI does), qualified, signed."""
    return signed_tiny(tmp_path_factory.mktemp("newcomer"), build_manifest=True)


@pytest.fixture(autouse=True)
def _log_console(cli_consoles, tmp_path, monkeypatch):
    """stdout as a log or a pipe sees it: not a terminal, 80 columns."""
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    cli_consoles(80)


def run(capsys, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def _error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _log_lines(out: str) -> list[str]:
    lines = out.splitlines()
    assert not [ln for ln in lines if ln != ln.rstrip()], "trailing spaces"
    return lines


def test_build_help_names_every_default_target(capsys):
    rc, out, _ = run(capsys, "build", "-h")
    assert rc == 0 and len(DEFAULT_TARGETS) >= 8
    assert ",".join(DEFAULT_TARGETS) + "." in "".join(out.split())


def test_verify_hints_build_when_artifacts_are_elsewhere(fx, tmp_path, capsys):
    away = tmp_path / "away"
    away.mkdir()
    for f in (fx.manifest, fx.manifest.with_suffix(".runtime.json")):
        shutil.copy(f, away / f.name)
    rc, _, err = run(capsys, "verify", away / fx.manifest.name, "--key", fx.pub)
    assert rc == 1 and "is missing from" in err and "--build DIR" in err
    rc, out, err = run(capsys, "verify", away / fx.manifest.name, "--key", fx.pub, "--build", fx.build)
    assert rc == 0 and out.startswith("ok:"), err


def _not_manifests(fx, tmp_path) -> dict[str, Path]:
    (tmp_path / "empty.toml").write_text("")
    (tmp_path / "other.toml").write_text('kind = "catalog"\n')
    body = tomllib.loads(fx.manifest.read_text().split("\n[signature]\n")[0])
    return {"readme": ROOT / "README.md", "pyproject": ROOT / "pyproject.toml", "empty": tmp_path / "empty.toml",
            "json": fx.manifest.with_suffix(".runtime.json"), "other-kind": tmp_path / "other.toml",
            "build-manifest": fx.build / "manifest.toml", "binary": fx.build / next(
                a["path"] for a in body["artifacts"])}


@pytest.mark.parametrize("what", ["readme", "pyproject", "empty", "json", "other-kind", "build-manifest", "binary"])
def test_verify_refuses_what_is_not_a_manifest_as_bad_input(what, fx, tmp_path, capsys):
    path = _not_manifests(fx, tmp_path)[what]
    assert path.is_file()
    rc, out, err = run(capsys, "verify", path, "--key", fx.pub)
    line = _error_line(err)
    assert rc == 2 and out == "" and ("is not a manifest" in line or "is a build manifest" in line), line


def test_verify_of_a_manifest_that_fails_a_check_is_still_exit_1(fx, tmp_path, capsys):
    doc = fx.manifest.read_bytes()
    unsigned = tmp_path / "unsigned.toml"  # a qualified body without its signature: a check failed
    unsigned.write_bytes(doc.split(signing.MARKER)[0] + b"\n")
    tampered = tmp_path / "tampered.toml"
    tampered.write_bytes(doc.replace(b"created = ", b"created  = ", 1))
    for p in (unsigned, tampered):
        rc, _, err = run(capsys, "verify", p, "--key", fx.pub, "--build", fx.build)
        assert rc == 1 and "not a manifest" not in err, err


def test_report_diff_with_one_manifest_says_a_second_is_needed(fx, capsys):
    rc, out, err = run(capsys, "report", "--diff", fx.manifest)
    line = _error_line(err)
    assert rc == 2 and out == "" and "needs a second manifest" in line
    rc, out, _ = run(capsys, "report", "--diff", fx.manifest, fx.manifest)
    assert rc == 0 and "no differences" in out


def test_kernels_hint_before_and_after_a_build(fx, tmp_path, capsys):
    cat = fx.cat
    out_dir = tmp_path / "fresh"
    rc, _, err = run(capsys, "build", "--catalog", cat, "--kernels", "nosuch*", "--out", out_dir, "--dry-run")
    line = _error_line(err)
    assert rc == 2 and "matches no symbol" in line and "manifest.toml" not in line and "start with" in line
    names = [s["name"] for m in tomllib.loads((fx.build / "manifest.toml").read_text())["modules"]
             for s in m["symbols"]]
    typo = names[0][:-1] + "Q"
    rc, _, err = run(capsys, "build", "--catalog", cat, "--kernels", typo, "--out", out_dir, "--dry-run")
    assert rc == 2 and f"close: {names[0]}" in err
    rc, _, err = run(capsys, "build", "--catalog", cat, "--kernels", "nosuch*", "--out", fx.build, "--dry-run")
    assert rc == 2 and f"`mamba-forge report {fx.build / 'manifest.toml'}`" in err
    rc, _, err = run(capsys, "build", "--catalog", cat, "--kernels", names[0], "--out", out_dir, "--dry-run")
    assert rc == 0, err


def test_plural_and_article():
    assert [plural(n, "program") for n in (0, 1, 2)] == ["0 programs", "1 program", "2 programs"]
    assert article("Ampere") == "an Ampere" and article("Hopper") == "a Hopper" and article("Ada") == "an Ada"


def test_build_says_1_program_and_lists_one_line_per_unit(fx, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(fx.root / "cache"))  # the fixture's compile, cached
    out_dir = tmp_path / "b"
    rc, out, err = run(capsys, "build", "--catalog", fx.cat, "--arch", "sm_90a",
                       "--out", out_dir)
    assert rc == 0, err
    lines = _log_lines(out)
    assert re.search(r"^built 1 program, \d+ symbols? ", lines[-1]), lines[-1]
    m = tomllib.loads((out_dir / "manifest.toml").read_text())
    for mod in m["modules"]:  # each unit whole on one line
        assert sum(mod["kind"] in ln and mod["target"] in ln for ln in lines) == 1, out
    for mod in m["modules"]:
        for s in mod["symbols"]:
            if s["verdict"]["status"] == "rejected":
                assert sum(s["name"] in ln for ln in lines) == 1


def test_qualify_dry_run_names_an_ampere_gpu(fx, tmp_path, capsys, monkeypatch):
    from mamba_forge.gpu import driver as cu

    def no_gpu():
        raise cu.CudaError("cuInit", "CUDA_ERROR_NO_DEVICE")

    monkeypatch.setattr(cu, "device_count", no_gpu)
    build = tmp_path / "b80"
    build.mkdir()
    data = tomllib.loads((fx.build / "manifest.toml").read_text())
    data["targets"] = ["sm_80"]
    (build / "manifest.toml").write_text(tomli_w.dumps(data))
    rc, out, err = run(capsys, "qualify", "--build", build, "--catalog", fx.cat,
                       "--dry-run", "--json")
    assert rc == 0, err
    assert "an Ampere GPU" in json.dumps(json.loads(out)["result"])


def test_report_symbols_tells_repeated_checks_apart(capsys):
    rc, out, _ = run(capsys, "report", H200, "--symbols", "softplus_forward_bf16")
    (checks,) = [ln for ln in _log_lines(out) if ln.strip().startswith("checks:")]
    words = checks.split()[1:]
    assert len(words) == len(set(words)) and "correctness(uniform)" in words, checks
    rc, out, _ = run(capsys, "report", H200, "--symbols", "softplus_forward_bf16", "--digests")
    labels = [ln.split()[0] for ln in out.splitlines() if ln.startswith("    ") and " passed" in ln]
    assert len(labels) == len(set(labels)) > 3


def _diff_pair(tmp_path) -> tuple[Path, Path, list[str]]:
    """manifests/h200.toml and a copy where every symbol of two module kinds changed a resource."""
    body, _ = signing.split(H200.read_bytes())
    data = tomllib.loads(body.decode())
    a = tmp_path / "a.toml"
    a.write_text(tomli_w.dumps(data))
    changed = []
    for s in data["symbols"]:
        if s["module"] in ("TriadSm80", "TriadSm90a") and s.get("resources"):
            s["resources"]["registers"] += 1
            changed.append(f"{s['module']}/{s['target']}/{s['name']}")
    b = tmp_path / "b.toml"
    b.write_text(tomli_w.dumps(data))
    return a, b, changed


def test_report_diff_off_a_terminal_is_one_line_per_change(tmp_path, capsys):
    a, b, changed = _diff_pair(tmp_path)
    rc, out, _ = run(capsys, "report", "--diff", a, b)
    lines = _log_lines(out)
    assert rc == 1 and len(changed) > 20
    for key in changed:  # every changed symbol whole on its one line
        assert sum(ln.strip().startswith(f"{key}: registers ") for ln in lines) == 1, key
    assert len(lines) == len(changed) + 2  # "changes from", "resource changes (N)", one line per change
    assert max(len(ln) for ln in lines) > 80  # not wrapped at the console width


def test_report_diff_module_and_target_filters(tmp_path, capsys):
    a, b, changed = _diff_pair(tmp_path)
    rc, out, _ = run(capsys, "report", "--diff", a, b, "--module", "TriadSm80")
    only = [k for k in changed if k.startswith("TriadSm80/")]
    assert rc == 1 and f"resource changes ({len(only)})" in out and "TriadSm90a/" not in out
    rc, out, _ = run(capsys, "report", "--diff", a, b, "--module", "Fixed")
    assert rc == 0 and "no differences" in out
    rc, out, _ = run(capsys, "report", "--diff", a, b, "--target", "sm_90a", "--json")
    assert rc == 1 and len(json.loads(out)["result"]["resource_changes"]) == len(changed)
    for argv in (("--module", "Nope"), ("--target", "sm_999"), ("--module",)):
        rc, out, err = run(capsys, "report", "--diff", a, b, *argv)
        assert rc == 2 and out == "", argv
        _error_line(err)
    rc, out, err = run(capsys, "report", a, "--module", "Fixed")  # narrows a diff only
    assert rc == 2 and "--diff" in _error_line(err)
