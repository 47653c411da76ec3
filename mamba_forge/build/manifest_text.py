"""build/manifest.toml's text: the TOML of a BuildManifest, or the previous file's own bytes where they differ
from it only in how each program was got (`cached`, `compile_seconds`), and the private-cache memo that lets a
rebuild that changes nothing skip writing the TOML."""

from __future__ import annotations

import hashlib
import marshal
import math
import re
from pathlib import Path

from mamba_forge.build.jobs import sha as _sha
from mamba_forge.core.cache import cache_key, memo_cache, memo_writes
from mamba_forge.core.schema import BuildManifest

_CACHE_FIELDS = re.compile(rb"^cached = (?:true|false)\ncompile_seconds = ([0-9][0-9.e+-]{0,30})$", re.M)


def _written_float(text: bytes) -> bool:
    """Whether `text` is how tomli-w writes a finite float (a carried time must be one this build could write)."""
    try:
        value = float(text)
    except ValueError:
        return False
    return math.isfinite(value) and repr(value).encode() == text


def manifest_bytes(manifest: BuildManifest, previous: Path) -> bytes:
    """The manifest's TOML, or the `previous` file's own bytes where they differ from it only in which programs
    came from the cache (`cached`, `compile_seconds`): a rebuild that changes nothing leaves manifest.toml (and its
    mtime) alone; those fields keep saying how the build that wrote the file got each program.

    Writing the TOML (tomli-w: 0.15 s for the built-in catalog's 2083 symbols) is skipped when the manifest-text
    memo (:func:`_text_memo`) says the previous bytes are what it would write: those exact bytes were written by
    this code from a record whose plain data, with the previous file's own `cached` and `compile_seconds` put in,
    is this record's (compared by a sha256 of its JSON, which tells every type and order tomli-w writes apart)."""
    return _manifest_text(manifest, previous)[0]


def _manifest_text(manifest: BuildManifest, previous: Path) -> tuple[bytes, tuple[bytes, str] | None]:
    """manifest_bytes, and the (bytes, plain-data digest) to remember once they are written (None: nothing new)."""
    from mamba_forge.core.safety import MAX_MANIFEST_BYTES, PathRefused, read_bounded
    from mamba_forge.manifest.toml_io import dumps

    try:
        old = read_bounded(previous, MAX_MANIFEST_BYTES, what="manifest", follow=False)
    except (PathRefused, OSError):  # none yet, or not one to keep: the new one is written
        old = None
    got = _got_fields(old, manifest) if old is not None else None
    remembered = _text_memo(old) if got is not None else None  # type: ignore[arg-type]
    if remembered is not None and remembered == _plain_digest(manifest, got):
        return old, None  # type: ignore[return-value]
    data = dumps(manifest).encode()
    if old is None or old == data:
        return data, (data, _plain_digest(manifest))
    # how each program was got, as tomli-w writes it in each module table (one line each: tomli-w writes no
    # multi-line strings, so `^` finds only keys); the previous file's values put in the new text's places
    # must give the previous file's bytes, anything else is a changed manifest
    new = _CACHE_FIELDS.split(data)[::2]  # the text around the fields (split also returns the group)
    if got is None or len(new) != len(got) + 1:
        return data, (data, _plain_digest(manifest))
    as_before = b"".join(piece for i, text in enumerate(new[:-1]) for piece in (text, got[i])) + new[-1]
    if as_before == old:
        return old, (old, _plain_digest(manifest, got))
    return data, (data, _plain_digest(manifest))


def _got_fields(old: bytes, manifest: BuildManifest) -> list[bytes] | None:
    """The previous file's `cached`/`compile_seconds` lines, one per module of `manifest`, or None."""
    got = [m.group(0) for m in _fields_in(old) if _written_float(m.group(1))]
    return got if len(got) == len(manifest.modules) else None


def _fields_in(text: bytes) -> list[re.Match]:
    """_CACHE_FIELDS.finditer(text), found ten times faster (1 ms, not 11, in the built-in catalog's 1.5 MB
    manifest): only a line that starts with "cached = " can start a match, and bytes.find finds those."""
    text = b"\n" + text  # the first line starts after a newline too; what a match holds is unchanged
    found, pos = [], 0
    while (i := text.find(b"\ncached = ", pos)) >= 0:
        m = _CACHE_FIELDS.match(text, i + 1)
        if m is None:
            pos = i + 1
            continue
        found.append(m)
        pos = m.end()
    return found


def _plain_digest(manifest: BuildManifest, got: list[bytes] | None = None) -> str:
    """sha256 of the manifest's plain data (order and types kept: 1, 1.0 and true differ), with each module's
    `cached` and `compile_seconds` taken from the `got` lines when given. The data is serialised by marshal's
    version 2, which writes every value out (no references, so equal data gives equal bytes however objects are
    shared) and tells each type apart, in 5 ms where json.dumps took 20 (2083 symbols); another Python may write
    other bytes: a memo miss, never a false hit."""
    from mamba_forge.core.codec import to_dict

    plain = to_dict(manifest)
    for module, line in zip(plain["modules"], got or (), strict=False):
        cached, seconds = line.split(b"\n")
        module["cached"] = cached.endswith(b"true")
        module["compile_seconds"] = float(seconds.split(b" = ", 1)[1])
    return hashlib.sha256(marshal.dumps(plain, 2)).hexdigest()


_TEXT_CODE = ("manifest/toml_io.py", "core/codec.py", "core/schema.py", "core/schema_build.py", "core/record.py",
              "build/manifest_text.py")
_text_code_digest: str | None = None


def _text_memo(data: bytes, digest: str | None = None) -> str | None:
    """The manifest-text memo, in the private cache under the sha256 of the exact bytes (and tomli-w's version
    and the code that turns a record into them): `digest` given, remember that these bytes are what `dumps` wrote
    for a record of that plain-data digest; else the remembered digest, or None. No usable cache: None."""
    global _text_code_digest
    import tomli_w

    cache = memo_cache() if digest is None or memo_writes() else None
    if cache is None:
        return None
    if _text_code_digest is None:
        pkg = Path(__file__).resolve().parents[1]
        _text_code_digest = hashlib.sha256(b"".join(_sha((pkg / f).read_bytes()).encode() for f in _TEXT_CODE)).hexdigest()
    key = cache_key({"kind": "build-manifest-text", "format": 1, "sha256": _sha(data), "size": len(data),
                     "tomli_w": getattr(tomli_w, "__version__", "?"), "code": _text_code_digest})
    if digest is not None:
        cache.put(key, {"plain_sha256": digest.encode()})
        return None
    parts = cache.get(key, lambda p: None if re.fullmatch(rb"[0-9a-f]{64}", p.get("plain_sha256", b"")) else "bad")
    return parts["plain_sha256"].decode() if parts is not None else None
