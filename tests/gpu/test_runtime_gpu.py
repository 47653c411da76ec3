"""The runtime loader on a real GPU: a bundle built and qualified here (or given by MF_RUNTIME_BUNDLE and
MF_RUNTIME_KEY, e.g. the committed H200 bundle), loaded with load(), kernels launched through launch() on torch
tensors and compared with the float64 reference.

    python -m pytest -q tests/gpu/test_runtime_gpu.py            # builds + qualifies the Fixed module first
    MF_RUNTIME_BUNDLE=dist/h200.tar.gz MF_RUNTIME_KEY=manifests/keys python -m pytest -q tests/gpu/test_runtime_gpu.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

N = 1_000_003  # not a multiple of any vector width: the scalar tail runs too


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tuple[Path, Path]:
    """(bundle, public key): from the environment, else build and qualify the Fixed module on this GPU now."""
    if os.environ.get("MF_RUNTIME_BUNDLE"):
        return Path(os.environ["MF_RUNTIME_BUNDLE"]), Path(os.environ["MF_RUNTIME_KEY"])
    from mamba_forge.manifest import signing
    from mamba_forge.manifest.bundle import write_bundle
    from mamba_forge.runtime.trust import trusted_keys

    root = tmp_path_factory.mktemp("runtime-gpu")
    build = root / "build"
    subprocess.run([sys.executable, "-m", "mamba_forge.cli", "build", "--arch", "sm_90a", "--out", str(build), "-q"],
                   check=True, timeout=900)
    priv, pub, _ = signing.write_keypair(root / "keys", "gpu-test")
    res = subprocess.run(
        [sys.executable, "-m", "mamba_forge.cli", "qualify", "--build", str(build), "--module", "Fixed", "--level", "quick",
         "--sign-key", str(priv), "--out", str(root / "h200.toml"), "-q"],
        capture_output=True, text=True, timeout=1800,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    out = write_bundle(root / "h200.toml", root / "h200.tar.gz", keys=trusted_keys([pub], defaults=False), build=build)
    return out, pub


@pytest.fixture(scope="module")
def kernels(bundle):
    from mamba_forge.runtime import load

    path, key = bundle
    return load(path, trusted_keys=[key])


def _grid(family: str, n: int) -> tuple[int, ...]:
    from mamba_forge.catalog import expr
    from mamba_forge.catalog.model import default_catalog_path, load_catalog

    cat = load_catalog(default_catalog_path())
    fam = next(m.family(family) for m in cat.modules if any(f.name == family for f in m.families))
    return tuple(int(expr.evaluate(g, {"n": n})) for g in fam.launch.grid)


@pytest.mark.parametrize(("dtype", "rtol", "atol"), [("f32", 2e-6, 1e-30), ("bf16", 8e-3, 1e-30), ("f16", 1e-3, 1e-7)])
def test_softplus_through_launch_matches_the_reference(kernels, dtype, rtol, atol):
    torch = pytest.importorskip("torch")
    from mamba_forge.references.activation import softplus_forward
    from mamba_forge.runtime import launch

    tdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(7)
    x = (torch.rand(N, dtype=torch.float64, device="cuda", generator=g) * 60 - 30).to(tdt)
    y = torch.full((N,), float("nan"), dtype=tdt, device="cuda")
    f = kernels.typed("softplus_forward").get(dtype)
    assert f.name == f"softplus_forward_{dtype}", kernels.fallbacks
    stream = torch.cuda.Stream()
    # y as a raw device pointer, x as a tensor (bf16 goes through DLPack: torch has no CAI for it)
    launch(f, _grid("softplus_forward", N), f.block, (y.data_ptr(), x, N), stream=stream)
    stream.synchronize()
    ref = softplus_forward({"x": x.double().cpu().numpy()}, {"n": N})["y"]
    got = y.double().cpu().numpy()
    assert np.isfinite(got).all(), "unwritten (NaN) elements remain"
    np.testing.assert_allclose(got, ref, rtol=rtol, atol=atol)
    # deterministic: a second launch writes the same bytes
    y2 = torch.full_like(y, float("nan"))
    f(_grid("softplus_forward", N), (y2, x, N))
    torch.cuda.synchronize()
    bits = torch.int32 if dtype == "f32" else torch.int16
    assert torch.equal(y.view(bits), y2.view(bits))


def test_loaded_device_matches_torch(kernels):
    torch = pytest.importorskip("torch")
    assert kernels.device.name == torch.cuda.get_device_name(0)
    major, minor = torch.cuda.get_device_capability(0)
    assert kernels.device.cc == (major, minor)


def test_every_admitted_symbol_loads_quickly(bundle):
    from mamba_forge.runtime import load

    path, key = bundle
    t0 = time.perf_counter()
    k = load(path, trusted_keys=[key])
    modules = k.load_all()
    seconds = time.perf_counter() - t0
    assert modules >= 1 and len(k.admitted()) >= 3
    assert seconds < 2.0, f"verify + load of {modules} modules took {seconds:.3f}s"


def test_wrong_shared_memory_and_host_tensors_are_refused_on_the_gpu(kernels):
    torch = pytest.importorskip("torch")
    from mamba_forge.runtime import LaunchRefused, launch

    f = kernels.function("softplus_forward_f32")
    x = torch.zeros(16, device="cuda")
    with pytest.raises(LaunchRefused, match="host"):
        launch(f, (1,), f.block, (x, torch.zeros(16), 16))
    with pytest.raises(LaunchRefused, match="dynamic shared memory"):
        launch(f, (1,), f.block, (x, x, 16), shared_mem=4096)
