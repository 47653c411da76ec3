"""The loader's refusals. Each is raised with one sentence saying what is wrong; nothing is loaded after one."""

from __future__ import annotations


class LoadError(Exception):
    """Base of every loader refusal (a manifest, bundle, device or symbol that cannot be used)."""


class SignatureRefused(LoadError):
    """The document is unsigned, malformed, signed by an untrusted key, or its bytes do not match the signature."""


class ManifestRefused(LoadError):
    """The signed body is not a usable manifest or index (schema, kind, expiry, missing fields)."""


class ArtifactRefused(LoadError):
    """An artifact is missing, has the wrong size or sha256, or the bundle holds files the manifest does not name."""


class DeviceMismatch(LoadError):
    """The manifest was qualified for another GPU model, compute capability, SM count or a newer driver."""


class SymbolUnavailable(LoadError, KeyError):
    """A symbol is rejected, absent, or only checked here: carries the recorded reason and deciding check."""

    def __init__(self, name: str, message: str, *, reason: str = "", check: str = ""):
        self.name, self.reason, self.check = name, reason, check
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class LaunchRefused(LoadError, ValueError):
    """A launch's arguments, grid, block or shared memory do not fit the symbol's recorded ABI and limits."""


class DriverError(LoadError):
    """A CUDA driver call failed; names the call and the CUresult."""


class TileRequired(SymbolUnavailable):
    """A family variant has several tiles and none was named; carries the tile names (never picked silently)."""

    def __init__(self, name: str, message: str, tiles: tuple[str, ...]):
        self.tiles = tiles
        super().__init__(name, message, reason="several tiles", check="tile")


class FamilyUnavailable(SymbolUnavailable, AttributeError):
    """`kernels.<name>` names no family of the manifest (an AttributeError too, so hasattr() answers False)."""


class IncompleteOnDevice(LoadError):
    """load(strict=True): something the manifest lists for this device does not serve; carries the summary."""

    def __init__(self, message: str, summary):
        self.summary = summary
        super().__init__(message)
