"""What the fast paths of issue 26 import, checked in fresh processes: `mamba-forge -h` (under 0.3 s) loads typer
and our command modules, none of pydantic, rich, numpy, ml_dtypes, cryptography, pyelftools, cuda-bindings or the
catalog; a no-change rebuild (`build -q` with everything in the cache) loads no pyelftools, cryptography, rich,
process pool or NVRTC binding, loads the catalog from its memo, opens no artifact of build/ (the stat record says
they hold what the manifest says) and writes nothing. The checker itself is shown to report a planted import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_support import write_tiny_catalog

ROOT = Path(__file__).resolve().parents[1]
HEAVY_FOR_HELP = ("pydantic", "rich", "numpy", "ml_dtypes", "cryptography", "elftools", "cuda", "torch",
                  "tomli_w", "mamba_forge.catalog.model", "mamba_forge.catalog.entries", "mamba_forge.build.builder",
                  "mamba_forge.runtime", "mamba_forge.report")
NOT_FOR_A_NO_CHANGE_BUILD = ("elftools", "cryptography", "rich", "concurrent.futures.process", "cuda.bindings.nvrtc",
                             "numpy", "ml_dtypes", "mamba_forge.report", "mamba_forge.runtime")


def _modules_after(argv: list[str], env: dict | None = None, before: str = "") -> tuple[int, list[str]]:
    """(exit code, modules loaded) of `mamba-forge ARGV` run by main() in a fresh interpreter (stdout dropped)."""
    return _run(argv, env, before)[:2]  # type: ignore[return-value]


# the artifacts of build/ a process opens, as the interpreter's audit hook sees each open (any way of opening)
WATCH_OPENS = ("opened = []\n"
               "sys.addaudithook(lambda ev, a: ev == 'open' and str(a[0]).endswith(('.cubin', '.ptx'))"
               " and opened.append(str(a[0])))")


def _run(argv: list[str], env: dict | None = None, before: str = "") -> tuple[int, list[str], list[str]]:
    """_modules_after, and the paths `before` put in a list `opened` (empty where it made none)."""
    code = (
        "import contextlib, io, json, sys\n"
        f"{before}\n"
        "from mamba_forge.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    rc = main({argv!r})\n"
        "sys.__stdout__.write(json.dumps([rc, sorted(sys.modules), globals().get('opened', [])]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert r.returncode == 0, r.stderr
    rc, modules, opened = json.loads(r.stdout.strip().splitlines()[-1])
    return rc, modules, opened


def _loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules for n in names if m == n or m.startswith(n + "."))


@pytest.mark.parametrize("argv", [["-h"], ["--help"], []])
def test_help_imports_no_heavy_module(argv):
    rc, modules = _modules_after(argv)
    assert rc == 0 and "typer" in modules and "mamba_forge.cli.cmd_build" in modules
    assert _loaded(modules, HEAVY_FOR_HELP) == []


@pytest.mark.parametrize("planted", ["rich.console", "pydantic", "mamba_forge.catalog.model"])
def test_the_help_check_reports_a_planted_import(planted):
    _, modules = _modules_after(["-h"], before=f"import {planted}")
    assert planted in _loaded(modules, HEAVY_FOR_HELP)


def test_a_no_change_rebuild_loads_no_compile_or_render_machinery(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    cat = write_tiny_catalog(tmp_path / "cat")
    out = tmp_path / "b"
    env = {"MAMBA_FORGE_CACHE": str(cache), "MAMBA_FORGE_TRUST": str(tmp_path / "no-trust")}
    argv = ["build", "--catalog", str(cat), "--arch", "sm_90a", "--out", str(out), "-q"]
    rc, first, read_back = _run(argv, env, before=WATCH_OPENS)  # compiles (the control: the machinery is loaded)
    assert rc == 0 and "elftools" in first and (out / "manifest.toml").is_file()
    # the control for the opens: the build reads back what it wrote, to record it
    assert sorted(read_back) == sorted(str(p) for p in out.rglob("*") if p.suffix in (".cubin", ".ptx"))
    manifest = (out / "manifest.toml").read_bytes()
    mtime = (out / "manifest.toml").stat().st_mtime_ns
    count = ("import mamba_forge.catalog.model as M, mamba_forge.manifest.toml_io as T\n"
             "calls = []\n"
             "real_load, real_dumps = M._load, T.dumps\n"
             "M._load = lambda *a: calls.append('catalog') or real_load(*a)\n"
             "T.dumps = lambda *a: calls.append('dumps') or real_dumps(*a)\n"
             "import atexit; atexit.register(lambda: sys.__stderr__.write('CALLS' + json.dumps(calls)))")
    for _ in range(2):  # the first rebuild may still write a memo this state lacked; the second must not need to
        rc, modules, opened = _run(argv, env, before=count + "\n" + WATCH_OPENS)
        assert rc == 0 and opened == [], opened  # the stat record says they hold what the manifest says
    assert _loaded(modules, NOT_FOR_A_NO_CHANGE_BUILD) == []
    assert (out / "manifest.toml").read_bytes() == manifest and (out / "manifest.toml").stat().st_mtime_ns == mtime
    r = subprocess.run([sys.executable, "-c", "import contextlib, io, json, sys\n" + count + "\n"
                        "from mamba_forge.cli import main\n"
                        f"sys.exit(main({argv!r}))\n"], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert r.returncode == 0 and "CALLS[]" in r.stderr, r.stderr  # no full catalog load, no TOML written
