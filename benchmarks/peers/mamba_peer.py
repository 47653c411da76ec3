"""Import the peer mamba-ssm pieces the scan benchmark compares against, without installing the package.

* selective_scan_cuda: the compiled extension built in place by build_mamba_ssm.sh (/tmp/peers/...).
* selective_state_update: mamba_ssm/ops/triton/selective_state_update.py loaded by file path (it only needs
  torch, triton and einops; its `from mamba_ssm.ops.triton.softplus import softplus` is satisfied by loading
  softplus.py under that module name first). A missing einops gets a stub: the function never calls it.
Each loader returns None and a reason instead of raising, so the benchmark still runs ours alone.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from pathlib import Path

PEER_DIR = Path(os.environ.get("MAMBA_PEER_DIR", "/tmp/peers")) / "mamba_ssm-2.3.2.post1"
SDIST = Path(__file__).resolve().parents[2] / ".peers" / "mamba_ssm-2.3.2.post1.tar.gz"


def _source_dir() -> Path | None:
    if (PEER_DIR / "mamba_ssm").is_dir():
        return PEER_DIR
    if SDIST.is_file():  # the Triton file needs no build: unpack the sdist to read it
        import tarfile

        PEER_DIR.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(SDIST) as tf:
            tf.extractall(PEER_DIR.parent, filter="data")
        return PEER_DIR
    return None


def load_selective_scan_cuda():
    """(module, reason): the compiled selective_scan_cuda extension, or None and why not."""
    try:
        import torch  # noqa: F401  (the extension links against torch)
    except ImportError as exc:
        return None, f"torch not importable: {exc}"
    so = sorted(PEER_DIR.glob("selective_scan_cuda*.so"))
    if not so:
        return None, f"no selective_scan_cuda*.so under {PEER_DIR} (run benchmarks/peers/build_mamba_ssm.sh)"
    spec = importlib.util.spec_from_file_location("selective_scan_cuda", so[0])
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as exc:  # noqa: BLE001 - report, never fail the benchmark
        return None, f"selective_scan_cuda failed to load: {exc}"
    return mod, ""


def _load_by_path(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_selective_state_update():
    """(function, reason): mamba_ssm's Triton selective_state_update, or None and why not."""
    src = _source_dir()
    if src is None:
        return None, f"no mamba-ssm sources ({PEER_DIR} or {SDIST})"
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as exc:
        return None, f"torch/triton not importable: {exc}"
    try:
        import einops  # noqa: F401
    except ImportError:
        stub = types.ModuleType("einops")
        stub.rearrange = stub.repeat = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("einops stub"))
        sys.modules["einops"] = stub
    for pkg in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
        if pkg not in sys.modules:
            m = types.ModuleType(pkg)
            m.__path__ = []
            sys.modules[pkg] = m
    tri = src / "mamba_ssm" / "ops" / "triton"
    try:
        _load_by_path("mamba_ssm.ops.triton.softplus", tri / "softplus.py")
        mod = _load_by_path("mamba_ssm.ops.triton.selective_state_update", tri / "selective_state_update.py")
    except Exception as exc:  # noqa: BLE001
        return None, f"selective_state_update failed to load: {exc}"
    return mod.selective_state_update, ""
