"""mamba_forge.runtime: load signed, qualified kernels and launch them.

Imports only the standard library, cryptography and cuda-bindings (no typer, rich, pydantic), plus mamba_forge.core
(standard library: the manifest schema and codec among it), so an engine process pays milliseconds for it. See
:mod:`mamba_forge.runtime.loader`.

The names below resolve on first use (PEP 562): ``import mamba_forge.runtime`` imports only the error classes
(every refusal of errors.py; TrustRefused, a bad trust folder or key, with the trusted keys);
``runtime.load`` imports the loader with what every load needs (schema, codec, cryptography's Ed25519 through
the trusted keys, logging); the driver is imported when a CudaBackend is made, the keyword launch on a kernel's
first call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mamba_forge.runtime.errors import (
    ArtifactRefused,
    DeviceMismatch,
    DriverError,
    FamilyUnavailable,
    IncompleteOnDevice,
    LaunchRefused,
    LoadError,
    ManifestRefused,
    SignatureRefused,
    SymbolUnavailable,
    TileRequired,
)

_LAZY = {
    "CudaBackend": "loader", "DeviceInfo": "loader", "Kernel": "loader", "Kernels": "loader", "Typed": "loader",
    "check_device": "loader", "launch": "loader", "load": "loader",
    "release_keys_dir": "trust", "trusted_keys": "trust", "TrustRefused": "trust",
    "Verified": "verify", "open_verified": "verify", "verify_document": "verify",
}

if TYPE_CHECKING:
    from mamba_forge.runtime.loader import CudaBackend, DeviceInfo, Kernel, Kernels, Typed, check_device, launch, load
    from mamba_forge.runtime.trust import TrustRefused, release_keys_dir, trusted_keys
    from mamba_forge.runtime.verify import Verified, open_verified, verify_document


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # once: later look-ups are plain module attributes
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ArtifactRefused", "CudaBackend", "DeviceInfo", "DeviceMismatch", "DriverError", "FamilyUnavailable",
    "IncompleteOnDevice", "Kernel", "Kernels", "LaunchRefused", "LoadError", "ManifestRefused", "SignatureRefused",
    "SymbolUnavailable", "TileRequired", "TrustRefused", "Typed", "Verified", "check_device", "launch", "load",
    "open_verified", "release_keys_dir", "trusted_keys", "verify_document",
]
