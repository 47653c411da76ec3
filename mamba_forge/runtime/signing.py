"""Ed25519 signatures over the exact bytes of a manifest body. Standard library + cryptography only, so the
runtime loader can import it without pydantic.

A signed document is the body's bytes followed by one trailing TOML table::

    <body bytes, ending in a newline>
    [signature]
    algorithm = "ed25519"
    key_id = "<sha256 of the raw 32-byte public key, hex>"
    development_key = false
    value = "<base64 signature over the body bytes>"

The whole file is still TOML; verification splits at the last ``\\n[signature]\\n`` and checks the signature
over the bytes before it, so any change to the body (a flipped byte, reordered tables, truncation) fails.
Key files: private keys are PKCS#8 PEM (mode 0600), public keys are the raw key in base64 on one line
(``ed25519 <base64>``), named by key id.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

try:  # what ed25519 itself imports; cryptography's public `serialization` package adds ~9 ms (SSH, ciphers)
    from cryptography.hazmat.primitives._serialization import Encoding, PublicFormat
except ImportError:  # pragma: no cover - a cryptography that moved it
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from mamba_forge.core import safety
from mamba_forge.core.errors import ForgeError
from mamba_forge.core.fsio import write_atomic
from mamba_forge.runtime.errors import SignatureRefused

MARKER = b"\n[signature]\n"
ALGORITHM = "ed25519"
KEY_ENV = "MAMBA_FORGE_SIGNING_KEY"  # PEM text of the private key (CI secrets)
_PUB_LINE = re.compile(r"^ed25519 ([A-Za-z0-9+/=]{44})\s*$")


class SignatureError(Exception):
    """A signed document does not verify; the message is one sentence saying why."""


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_text(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return f"ed25519 {base64.b64encode(raw).decode()}\n"


def parse_public(text: str) -> Ed25519PublicKey:
    m = _PUB_LINE.match(text.strip())
    if m is None:
        raise SignatureError("not an mamba-forge public key (expected one line: 'ed25519 <base64>')")
    raw = base64.b64decode(m.group(1))
    if len(raw) != 32:
        raise SignatureError("public key is not 32 bytes")
    return Ed25519PublicKey.from_public_bytes(raw)


def private_pem(private: Ed25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization  # keys are written and read by the CLI only

    return private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def parse_private(pem: bytes) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"not a PEM Ed25519 private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError("the private key is not an Ed25519 key")
    return key


KEY_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")  # a plain file-name stem: no '/', no leading dot


def write_keypair(folder: Path, name: str = "mamba-forge") -> tuple[Path, Path, str]:
    """Generate a key pair: <name>.key (PEM, 0600) and <name>.pub. Returns (private, public, key id).

    Both files are created exclusively (never over an existing file) and atomically; when the second cannot be
    written (a full disk), the first is removed again, so a failed run leaves nothing and a rerun succeeds.
    Raises ForgeError (one line) for a bad name or folder, FileExistsError for an existing key."""
    if not KEY_NAME.fullmatch(name) or ".." in name:
        raise ForgeError(f"key name {name!r} is not a plain file-name stem",
                         hint="use letters, digits, '_', '-' and '.', not starting with a dot, without '/' or '..'")
    try:
        safety.prepare_output_dir(Path(folder), what="key folder")
    except safety.PathRefused as exc:
        raise ForgeError(str(exc)) from None
    private = Ed25519PrivateKey.generate()
    priv_path, pub_path = folder / f"{name}.key", folder / f"{name}.pub"
    for p in (priv_path, pub_path):
        if p.exists() or p.is_symlink():
            raise FileExistsError(f"{p} exists; remove it or choose another name")
    written: list[Path] = []
    try:
        written.append(write_atomic(priv_path, private_pem(private), mode=0o600, exclusive=True))
        written.append(write_atomic(pub_path, public_text(private.public_key()), exclusive=True))
    except BaseException as exc:
        for p in written:  # ours: created exclusively a moment ago
            with contextlib.suppress(OSError):
                os.unlink(p)
        if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
            raise ForgeError(f"cannot write the key pair in {folder}: {exc.strerror or exc}") from None
        raise
    return priv_path, pub_path, key_id(private.public_key())


@dataclass(frozen=True)
class Signature:
    algorithm: str
    key_id: str
    development_key: bool
    value: bytes


def sign(body: bytes, private: Ed25519PrivateKey, *, development_key: bool = False) -> bytes:
    """The signed document: body + signature table."""
    if not body.endswith(b"\n"):
        body += b"\n"
    if MARKER in body:
        raise ValueError("the body already contains a [signature] table")
    sig = Signature(ALGORITHM, key_id(private.public_key()), development_key, private.sign(body))
    return body + MARKER[1:] + canonical_tail(sig)


def canonical_tail(sig: Signature) -> bytes:
    """The [signature] table exactly as sign() writes it. Verification demands these bytes: TOML would also
    read a tab for a space or a base64 value with other padding bits, which would let changed bytes pass."""
    value = base64.b64encode(sig.value).decode()
    return (
        f'algorithm = "{sig.algorithm}"\nkey_id = "{sig.key_id}"\n'
        f"development_key = {'true' if sig.development_key else 'false'}\nvalue = \"{value}\"\n"
    ).encode()


def split(document: bytes) -> tuple[bytes, Signature]:
    """(body, signature) of a signed document; raises SignatureError if it has no well-formed signature."""
    at = document.rfind(MARKER)
    if at < 0:
        raise SignatureError("the manifest is not signed (no [signature] table at its end)")
    body, tail = document[: at + 1], document[at + len(MARKER) :]
    if len(tail) > safety.MAX_SIGNATURE_TAIL:  # the canonical table is ~190 bytes: never parse more
        raise SignatureError("the [signature] table is malformed (too long)")
    try:
        table = safety.parse_toml(tail.decode("utf-8"), what="the [signature] table")
        sig = Signature(
            algorithm=table["algorithm"],
            key_id=table["key_id"],
            development_key=bool(table.get("development_key", False)),
            value=base64.b64decode(table["value"], validate=True),
        )
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        raise SignatureError("the [signature] table is malformed") from None
    if set(table) - {"algorithm", "key_id", "development_key", "value"}:
        raise SignatureError("the [signature] table has unexpected fields")
    if sig.algorithm != ALGORITHM:
        raise SignatureError(f"unsupported signature algorithm {sig.algorithm!r}")
    if tail != canonical_tail(sig):
        raise SignatureError("the [signature] table is not in canonical form")
    return body, sig


def verify(document: bytes, trusted: dict[str, Ed25519PublicKey]) -> tuple[bytes, Signature]:
    """Check a signed document against trusted keys (key id -> key). Returns (body, signature)."""
    body, sig = split(document)
    key = trusted.get(sig.key_id)
    if key is None:
        raise SignatureError(f"the manifest is signed by key {sig.key_id[:16]}…, which is not trusted")
    try:
        key.verify(sig.value, body)
    except InvalidSignature:
        raise SignatureError(f"the signature by key {sig.key_id[:16]}… does not match the manifest's bytes") from None
    return body, sig


def load_trusted(paths: list[Path], *, installed: bool = False) -> dict[str, Ed25519PublicKey]:
    """Public keys from files or folders (every *.pub inside), keyed by key id. Unless `installed` (the shipped
    release keys, trusted as the package is), every folder and key file must be private (safety.py: no
    symlinked component, owned by you or root, writable by nobody else); each key is read bounded."""
    out: dict[str, Ed25519PublicKey] = {}
    for p in map(Path, paths):
        if not (p.exists() or p.is_symlink()):
            raise SignatureError(f"trusted key path {p} does not exist")
        try:
            if p.is_dir() and not installed:
                safety.check_trusted_dir(p)
            files = sorted(p.glob("*.pub")) if p.is_dir() and not p.is_symlink() else [p]
            for f in files:
                if not installed:
                    safety.check_trusted_file(f)
                data = safety.read_bounded(f, safety.MAX_KEY_BYTES, what="trusted key")
                try:
                    key = parse_public(data.decode("utf-8", errors="replace"))
                except SignatureError as exc:
                    raise SignatureError(f"{f} is not a usable public key: {exc}") from None
                out[key_id(key)] = key
        except safety.PathRefused as exc:
            raise SignatureError(f"refused: {exc}") from None
    return out


class TrustEnvRefused(SignatureRefused, ForgeError):
    """$MAMBA_FORGE_TRUST is relative: which keys are trusted would depend on the current folder. A loader refusal
    (SignatureRefused) and, at the command line, bad input (ForgeError: one line, exit 2)."""

    exit_code = 2


def config_home() -> Path:
    """$XDG_CONFIG_HOME when absolute, else ~/.config: the XDG spec calls a relative value invalid, to be ignored,
    so nothing found under it depends on the current folder."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or ""
    return Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".config"


def user_trust_dir() -> Path:
    """The user's trust folder: $MAMBA_FORGE_TRUST (absolute: a relative one is refused, TrustEnvRefused), else
    $XDG_CONFIG_HOME/mamba-forge/trusted (a relative $XDG_CONFIG_HOME is ignored), else ~/.config/..."""
    env = os.environ.get("MAMBA_FORGE_TRUST")
    if env:
        if not Path(env).is_absolute():
            raise TrustEnvRefused(f"MAMBA_FORGE_TRUST={env!r} is not an absolute path; set an absolute path")
        return Path(env)
    return config_home() / "mamba-forge" / "trusted"
