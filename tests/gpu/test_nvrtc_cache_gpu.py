"""NVRTC's own compute cache stays off in our builds (on a machine with a CUDA driver NVRTC 13 caches compiled
programs under CUDA_CACHE_PATH, outside our keyed, hashed cache). The negative case shows the check can fail:
with the cache asked for, the same compile leaves entries behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

COMPILE = r"""
from mamba_forge.build import nvrtc
r = nvrtc.compile_program('extern "C" __global__ void k(float* y) { y[threadIdx.x] *= 2.f; }', "probe.cu",
                          ["-arch=sm_90a", "-std=c++17"], {}, want_ptx=False)
assert r.ok and r.cubin, r.log
"""


def _compile(cache_dir, **env) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "CUDA_CACHE_DISABLE"}
    subprocess.run([sys.executable, "-c", COMPILE], check=True, env={**base, "CUDA_CACHE_PATH": str(cache_dir), **env})
    return [p.name for p in cache_dir.rglob("*") if p.is_file()] if cache_dir.exists() else []


def test_build_compiles_leave_nvrtc_cache_empty(tmp_path):
    assert _compile(tmp_path / "ours") == []
    asked = _compile(tmp_path / "asked", CUDA_CACHE_DISABLE="0")  # the caller's explicit choice is kept
    assert asked, "NVRTC wrote no compute-cache entry even when asked: the check above proves nothing here"
