"""Every benchmarks/bench_*.py and tune_*.py (found by glob, as tests/test_benchmark_cli.py finds them) run with
--smoke in a fresh process on the GPU: it exits 0 and leaves benchmarks/results/ as it found it (a smoke run
records nothing).

A benchmark with a --bundle option gets MF_RUNTIME_BUNDLE and MF_RUNTIME_KEY; one that cannot run without a
bundle (the option required, or SMOKE_NEEDS_BUNDLE in the module) is skipped when they are not set.

    MF_RUNTIME_BUNDLE=dist/h200.tar.gz MF_RUNTIME_KEY=manifests/keys python -m pytest -q tests/gpu/test_benchmarks_smoke.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/test_benchmark_cli.py
from test_benchmark_cli import BENCH_FILES, load_bench  # noqa: E402

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
TIMEOUT_S = 900  # a smoke run's own work takes seconds; the rest is building its modules (NVRTC) on a cold cache


def results_state() -> dict[str, tuple[int, int]]:
    """(size, mtime_ns) of every file under benchmarks/results/: a smoke run must change none."""
    return {str(p.relative_to(RESULTS)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(RESULTS.rglob("*")) if p.is_file()}


def smoke_command(path: Path) -> list[str]:
    mod = load_bench(path)
    opts = mod.parser()._option_string_actions
    cmd = [sys.executable, str(path), "--smoke"]
    if "--bundle" in opts:
        bundle, key = os.environ.get("MF_RUNTIME_BUNDLE"), os.environ.get("MF_RUNTIME_KEY")
        if bundle and key:
            cmd += ["--bundle", bundle, "--key", key]
        elif opts["--bundle"].required or getattr(mod, "SMOKE_NEEDS_BUNDLE", False):
            pytest.skip(f"{path.name} --smoke needs a bundle: set MF_RUNTIME_BUNDLE and MF_RUNTIME_KEY")
    return cmd


@pytest.mark.parametrize("path", BENCH_FILES, ids=lambda p: p.stem)
def test_benchmark_smoke_runs(path):
    cmd = smoke_command(path)
    before = results_state()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, f"{' '.join(cmd)} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-4000:]}"
    assert results_state() == before, f"{path.name} --smoke wrote under benchmarks/results/"
