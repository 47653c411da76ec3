"""Where the package's own data lives: the built-in catalog with its kernel sources, and the release public keys.

A wheel carries them as package data (`mamba_forge/_kernels/`, `mamba_forge/_keys/`, mapped from the
repository's `kernels/` and `manifests/keys/` at build time, see pyproject.toml); a source checkout or an editable
install reads the repository's folders themselves. NVRTC needs headers as files it can collect, so the data must
be a real folder on disk: a wheel install is; an install whose files are not on disk (a zip) is refused clearly.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mamba_forge.core.errors import ForgeError

KERNELS = ("_kernels", "kernels")  # (folder in the installed package, folder in a source checkout)
RELEASE_KEYS = ("_keys", "manifests/keys")


def _package_folder() -> Path:
    root = resources.files("mamba_forge")
    if not isinstance(root, Path):
        raise ForgeError(
            f"mamba-forge's package data is not on disk ({type(root).__name__}); NVRTC needs real files",
            hint="install mamba-forge from a wheel or a source checkout into a normal folder",
        )
    return root


def source_checkout() -> Path | None:
    """The repository folder when the package is imported from a source checkout (or an editable install of one):
    the package's parent holds this project's pyproject.toml. None for a wheel install, whose site-packages
    folder is no checkout, so no generic folder found beside it is ever trusted."""
    parent = _package_folder().parent
    try:
        text = (parent / "pyproject.toml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return parent if 'name = "mamba-forge"' in text else None


def data_folder(which: tuple[str, str]) -> Path:
    """The folder of shipped data `which` (KERNELS or RELEASE_KEYS): the package data when installed, else the
    checkout's folder. Raises ForgeError when neither exists."""
    packaged, in_checkout = which
    shipped = _package_folder() / packaged
    if shipped.is_dir():
        return shipped
    checkout = source_checkout()
    if checkout is not None and (checkout / in_checkout).is_dir():
        return checkout / in_checkout
    raise ForgeError(
        f"mamba-forge's {in_checkout}/ data is missing from the installation ({shipped} does not exist)",
        hint="reinstall from a wheel built with `pip wheel .`, or use a source checkout",
    )
