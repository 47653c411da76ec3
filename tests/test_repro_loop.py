"""The same source and options give the same PTX and cubin in every fresh process (the hardening issue's flake).

NVRTC 13.0 emitted the exact-f32 GEMM tile loads' PTX in one of several forms at random (two extra register
copies, registers renumbered; rarely a different cubin and admission verdict): on the H200 host 3 forms in 14
fresh compiles of the Fixed module with address randomisation on, 2 forms in 14 with it off; 5 forms in 16 on
the CPU machine for the five gemm_bi_f32_f32* symbols alone. Their loads are now branch-free selects
(mf/gemm_common.cuh). This loops those symbols' compile in fresh processes: with the old loads, six runs agreed
about 3% of the time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("cuda.bindings.nvrtc")


def test_exact_f32_gemm_ptx_is_the_same_in_every_fresh_process():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "repro_loop.py"), "--kernels", "gemm_bi_f32_f32*",
                        "--runs", "6", "-j", "2"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "1 distinct output(s) in 6 runs" in p.stdout
