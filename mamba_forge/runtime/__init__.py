"""mamba_forge.runtime: load signed, qualified kernels and launch them.

Imports only the standard library, cryptography and cuda-bindings (no typer, rich, pydantic), plus the manifest
schema and codec (standard library), so an engine process pays milliseconds for it. See
:mod:`mamba_forge.runtime.loader`.
"""

from mamba_forge.runtime.errors import (
    ArtifactRefused,
    DeviceMismatch,
    DriverError,
    LaunchRefused,
    LoadError,
    ManifestRefused,
    SignatureRefused,
    SymbolUnavailable,
)
from mamba_forge.runtime.loader import CudaBackend, DeviceInfo, Kernel, Kernels, Typed, check_device, launch, load
from mamba_forge.runtime.trust import release_keys_dir, trusted_keys
from mamba_forge.runtime.verify import Verified, open_verified, verify_document

__all__ = [
    "ArtifactRefused", "CudaBackend", "DeviceInfo", "DeviceMismatch", "DriverError", "Kernel", "Kernels",
    "LaunchRefused", "LoadError", "ManifestRefused", "SignatureRefused", "SymbolUnavailable", "Typed", "Verified",
    "check_device", "launch", "load", "open_verified", "release_keys_dir", "trusted_keys", "verify_document",
]
