"""Signing keys and the signed files: which key signs (--sign-key, $MAMBA_FORGE_SIGNING_KEY or a local
development key, made once), and the signed manifest, its runtime table and public key written beside it.

Every key is read bounded (safety.read_bounded: a folder, FIFO, device or oversized file is refused unread) and
every failure is one ForgeError line saying what to do. The manifest and its runtime table are written as a pair:
both are staged as complete temp files first and renamed only then, the old table restored when the manifest's
rename fails, so the folder holds the old pair or the new pair, never a new table beside an old manifest."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from mamba_forge.core import fsio, safety
from mamba_forge.core.errors import ForgeError
from mamba_forge.core.fsio import AtomicSetError, write_atomic_set
from mamba_forge.core.schema import QualifiedManifest
from mamba_forge.manifest.qualified import signed_files
from mamba_forge.runtime import signing
from mamba_forge.runtime.sources import runtime_table_path

DEV_KEY_NAME = "mamba-forge-dev"
_KEY_HINT = "pass --sign-key a PEM Ed25519 private key (`mamba-forge keygen` makes one)"


@dataclass
class SigningKey:
    private: object
    development: bool
    source: str
    path: Path | None = None  # the key file read (--sign-key or the development key); None for the env var


def dev_key_dir() -> Path:
    """$XDG_CONFIG_HOME/mamba-forge/dev-key, else ~/.config/...; a relative $XDG_CONFIG_HOME is ignored (the XDG
    spec calls it invalid), so which key signs never depends on the current folder."""
    return signing.config_home() / "mamba-forge" / "dev-key"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _absent(path: Path) -> bool:
    """Nothing at `path`, not even a dangling symlink (a name too long or unreadable counts as present: the
    bounded read then says why it cannot be used)."""
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return True
    except (OSError, ValueError):
        return False
    return False


def _parse(pem: bytes, where: str, hint: str) -> object:
    try:
        return signing.parse_private(pem)
    except signing.SignatureError as exc:
        raise ForgeError(f"{where}: {_one_line(exc)}", hint=hint) from None


def resolve_key(path: Path | None) -> SigningKey:
    """--sign-key PATH, else $MAMBA_FORGE_SIGNING_KEY (PEM text), else a local development key (made once)."""
    if path is not None:
        path = Path(path)
        try:
            pem = safety.read_bounded(path, safety.MAX_KEY_BYTES, what="signing key")
        except safety.PathRefused as exc:
            if _absent(path):
                raise ForgeError(f"signing key not found: {path}", hint="run `mamba-forge keygen`") from None
            raise ForgeError(str(exc), hint=_KEY_HINT) from None
        return SigningKey(_parse(pem, str(path), _KEY_HINT), False, str(path), path)
    text = os.environ.get(signing.KEY_ENV)
    if text:
        where = f"${signing.KEY_ENV}"
        if len(text) > safety.MAX_KEY_BYTES:
            raise ForgeError(f"{where} is {len(text)} characters, above the limit of {safety.MAX_KEY_BYTES}",
                             hint=f"set {signing.KEY_ENV} to the PEM text of an Ed25519 private key")
        pem = text.encode("utf-8", "surrogateescape")  # bytes that are not UTF-8 reach the parser, which refuses
        return SigningKey(_parse(pem, where, f"set {signing.KEY_ENV} to the PEM text of an Ed25519 private key"),
                          False, where)
    return _development_key()


def _development_key() -> SigningKey:
    folder = dev_key_dir()
    priv = folder / f"{DEV_KEY_NAME}.key"
    redo = f"remove {priv} and {folder / f'{DEV_KEY_NAME}.pub'} (a new development key is made), or {_KEY_HINT}"
    how = "reused"
    if _absent(priv):
        try:
            signing.write_keypair(folder, DEV_KEY_NAME)
            how = "generated"
        except FileExistsError as exc:  # a stray .pub, or another run made the pair meanwhile (then reuse it)
            if not os.path.exists(priv):
                raise ForgeError(f"cannot make the development key: {_one_line(exc)}", hint=redo) from None
    try:
        pem = safety.read_bounded(priv, safety.MAX_KEY_BYTES, what="development key")
    except safety.PathRefused as exc:
        raise ForgeError(str(exc), hint=redo) from None
    return SigningKey(_parse(pem, f"development key {priv}", redo), True, f"{how} development key {priv}", priv)


def public_key_path(out: Path, key: SigningKey) -> Path:
    """Where write_signed puts the public key that verifies `out`: beside it, named by key id."""
    pub = key.private.public_key()  # type: ignore[attr-defined]
    return Path(out).parent / f"{signing.key_id(pub)[:16]}.pub"


def written_paths(out: Path, key: SigningKey | None) -> list[Path]:
    """Every file write_signed(…, key, out) writes: the manifest, its runtime table and (given the key) the
    public key; the command checks each against its inputs before any work."""
    out = Path(out)
    return [out, runtime_table_path(out), *([public_key_path(out, key)] if key is not None else [])]


def write_signed(manifest: QualifiedManifest, key: SigningKey, out: Path) -> tuple[Path, Path]:
    """Write the signed manifest, its runtime table beside it (X.runtime.json) and the public key that
    verifies them (beside it, named by key id). Raises ForgeError "cannot write PATH: …" on an I/O failure,
    with the old manifest and table left as they were (and no new public key left behind)."""
    manifest = dataclasses.replace(manifest, development_key=key.development)
    data, table = signed_files(manifest, key.private)
    out = Path(out)
    pub = key.private.public_key()  # type: ignore[attr-defined]
    pub_path = public_key_path(out, key)
    current = out
    try:
        current = out.parent
        out.parent.mkdir(parents=True, exist_ok=True)
        current = pub_path
        made_pub = _write_public_key(pub_path, signing.public_text(pub).encode())
        try:
            current = out
            write_atomic_set([(runtime_table_path(out), table), (out, data)])  # the table first: the manifest names it
        except BaseException:
            if made_pub:
                with contextlib.suppress(OSError):
                    os.unlink(pub_path)
            raise
    except AtomicSetError as exc:
        raise ForgeError(f"cannot write {exc.path}: {exc.strerror}", hint=_WRITE_HINT) from None
    except OSError as exc:
        raise ForgeError(f"cannot write {current}: {exc.strerror or exc}", hint=_WRITE_HINT) from None
    return out, pub_path


_WRITE_HINT = "free space or choose another --out; the previous manifest and its runtime table are unchanged"


def _write_public_key(path: Path, text: bytes) -> bool:
    """Write the public key unless `path` already holds exactly it; True when this call created the file."""
    with contextlib.suppress(safety.PathRefused):
        if safety.read_bounded(path, safety.MAX_KEY_BYTES, what="public key", follow=False) == text:
            return False
    existed = not _absent(path)
    fsio.write_atomic(path, text)
    return not existed


__all__ = ["DEV_KEY_NAME", "SigningKey", "dev_key_dir", "public_key_path", "resolve_key", "write_signed",
           "written_paths"]
