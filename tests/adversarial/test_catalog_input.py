"""A hostile catalog through the CLI: `mamba-forge build --catalog` exits 2 with one line naming the file, the
entry and the problem, prints no traceback, compiles nothing and writes no build folder."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "build_basic"

# (what replaces the grid expression "ceil_div(n, 128)" in the fixture's first family, expected words)
GRIDS = [
    ("9**9**9**9", "exceeds"),
    ("1 << (1 << 40)", "shift"),
    ("ceil_div(n, 0)", "zero"),
    ("n // (n - 1000)", "zero"),  # zero only at the qualification dims (n = 1000)
    ("log2(0) + n", "log2"),
    ("min()", "arguments"),
    ("+".join(["n"] * 600), "limit"),
    ("+".join(["n"] * 450), "terms"),
    ("__import__('os').system('true')", "called"),
    ("n.bit_length()", "called"),
    ("undeclared_dim * 2", "undeclared_dim"),
]
TEMPLATES = [("{name:>999999999}", "plain"), ("{name!r}", "plain"), ("{name.__class__}", "plain")]


def _catalog(tmp_path: Path, grid: str | None = None, template: str | None = None) -> Path:
    cat = tmp_path / "cat"
    shutil.copytree(FIXTURE, cat)
    fam = cat / "basic.toml"
    text = fam.read_text()
    if grid is not None:
        q = "'" if "'" not in grid else '"'  # a TOML literal or basic string, whichever the text allows
        text = text.replace('grid = ["ceil_div(n, 128)"]', f"grid = [{q}{grid}{q}]")
    if template is not None:
        text = text.replace('symbol = "{name}_t{TILE}"', f"symbol = '{template}'")
    fam.write_text(text)
    return cat / "catalog.toml"


def _build(catalog: Path, out: Path) -> subprocess.CompletedProcess:
    code = "from mamba_forge.cli import entry; entry()"
    return subprocess.run([sys.executable, "-c", code, "build", "--catalog", str(catalog), "--out", str(out),
                           "--arch", "sm_90a", "-q"], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("grid", "needle"), GRIDS, ids=[g[:24] for g, _ in GRIDS])
def test_hostile_grid_expression(tmp_path, grid, needle):
    res = _build(_catalog(tmp_path, grid=grid), tmp_path / "out")
    _assert_refused(res, needle, tmp_path / "out")


@pytest.mark.parametrize(("template", "needle"), TEMPLATES)
def test_hostile_symbol_template(tmp_path, template, needle):
    res = _build(_catalog(tmp_path, template=template), tmp_path / "out")
    _assert_refused(res, needle, tmp_path / "out")


def _assert_refused(res: subprocess.CompletedProcess, needle: str, out: Path) -> None:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip()]
    assert "Traceback" not in res.stderr and len(lines) <= 2, res.stderr  # the error line and its hint
    assert needle in res.stderr, res.stderr
    assert not out.exists()
