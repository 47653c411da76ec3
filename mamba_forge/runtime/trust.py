"""Trusted public keys for the loader and `verify`: the shipped release keys (manifests/keys/), the user's trust
folder and whatever the caller passes. Standard library + cryptography only.

Every trust folder and key file except the shipped release keys must be private (mamba_forge/core/safety.py: the
cache's rules): a key anyone else could write or swap would let them sign manifests we trust. A refusal is a
TrustRefused: a loader refusal (SignatureRefused) and, at the command line, bad input (exit 2).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from mamba_forge.core.errors import ForgeError
from mamba_forge.runtime import signing
from mamba_forge.runtime.errors import SignatureRefused


class TrustRefused(SignatureRefused, ForgeError):
    """A trust folder or key file is unsafe, missing or not a key; names the path and the rule."""

    exit_code = 2


def release_keys_dir() -> Path:
    """The shipped release keys: the package data of a wheel install (only those: never a manifests/keys folder
    found near site-packages), or manifests/keys/ of a source checkout."""
    from mamba_forge.core.resources import RELEASE_KEYS, data_folder

    return data_folder(RELEASE_KEYS)


KeySpec = Path | str | bytes | Ed25519PublicKey


def trusted_keys(extra: Iterable[KeySpec] | Mapping[str, Ed25519PublicKey] | None = None, *,
                 defaults: bool = True) -> dict[str, Ed25519PublicKey]:
    """Key id -> public key: the shipped release keys and the user's trust folder (when `defaults`), plus
    `extra`: key objects, key files or folders of *.pub, or 'ed25519 <base64>' text."""
    out: dict[str, Ed25519PublicKey] = {}
    if defaults:
        if release_keys_dir().is_dir():
            out.update(_load_key_paths([release_keys_dir()], installed=True))
        user = signing.user_trust_dir()
        if user.exists() or user.is_symlink():  # an absent trust folder trusts nothing more; a present one is checked
            out.update(_load_key_paths([user]))
    if extra is None:
        return out
    if isinstance(extra, Mapping):
        out.update(extra)
        return out
    if isinstance(extra, (str, bytes, Path, Ed25519PublicKey)):
        extra = [extra]
    for k in extra:
        if isinstance(k, Ed25519PublicKey):
            out[signing.key_id(k)] = k
        elif isinstance(k, bytes) or (isinstance(k, str) and k.strip().startswith("ed25519 ")):
            text = k.decode() if isinstance(k, bytes) else k
            key = _parse_key(text, "a key passed in")
            out[signing.key_id(key)] = key
        else:
            out.update(_load_key_paths([Path(k)]))
    return out


def _parse_key(text: str, where: str) -> Ed25519PublicKey:
    try:
        return signing.parse_public(text)
    except signing.SignatureError as exc:
        raise TrustRefused(f"{where} is not a usable public key: {exc}") from None


def _load_key_paths(paths: list[Path], *, installed: bool = False) -> dict[str, Ed25519PublicKey]:
    try:
        return signing.load_trusted(paths, installed=installed)
    except signing.SignatureError as exc:
        raise TrustRefused(str(exc)) from None


__all__ = ["KeySpec", "TrustRefused", "release_keys_dir", "trusted_keys"]
