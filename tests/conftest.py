"""Test configuration: GPU tests are marked `gpu` and skip cleanly on machines without an NVIDIA GPU."""

from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        from cuda.bindings import driver
    except ImportError:
        return False
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:  # noqa: BLE001 - without libcuda, cuInit raises instead of returning an error
        return False


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """Builds and the loader's verified-body memos go to a private cache of the session's own, never the user's
    (a test that needs another location sets MAMBA_FORGE_CACHE itself)."""
    folder = tmp_path_factory.mktemp("mf-cache")
    folder.chmod(0o700)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MAMBA_FORGE_CACHE", str(folder))
        yield folder


@pytest.fixture
def isolated_trust(tmp_path, monkeypatch):
    """Only keys a test passes are trusted: an empty user trust folder (MAMBA_FORGE_TRUST), not the machine's."""
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "no-trust"))


@pytest.fixture
def cli_consoles(isolated_trust, monkeypatch):
    """For CLI tests: isolated_trust, and consoles(width=None, **stdout_options), which gives the CLI fresh rich
    consoles writing to whatever sys.stdout and sys.stderr are then (pytest's capture), `width` columns each."""
    from rich.console import Console

    from mamba_forge import cli

    def consoles(width: int | None = None, **stdout_options) -> None:
        monkeypatch.setattr(cli, "out", Console(width=width, **stdout_options))
        monkeypatch.setattr(cli, "err", Console(stderr=True, width=width))

    return consoles


@pytest.fixture
def fake_tensor_streams(monkeypatch):
    """For tests of fake tensors that claim to be torch's (tests/runtime_fakes.py): the runtime's stream lookup
    sees no torch, as on a machine without it, even when another test module imported a real (CPU) torch, whose
    torch.cuda.current_stream would fail. Only the stream module's view of sys.modules changes."""
    import sys
    from types import SimpleNamespace

    from mamba_forge.runtime import streams

    real = sys.modules.get("torch")

    class Modules:  # sys.modules read through, less the real torch (a stand-in a test plants still shows)
        def get(self, name, default=None):
            got = sys.modules.get(name, default)
            return default if name == "torch" and real is not None and got is real else got

    monkeypatch.setattr(streams, "sys", SimpleNamespace(modules=Modules()))


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# the adversarial suite's case count in the terminal summary of a whole-suite run (CI)
from adversarial.conftest import pytest_terminal_summary  # noqa: E402,F401
