"""`mamba-forge verify`, `merge`, `bundle`, `keygen` and `schema`: the signed artifacts and the JSON schemas."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from mamba_forge import cli_json as js
from mamba_forge.cli.common import JsonOpt, KeyOpt, must_exist, say, say_lines
from mamba_forge.core.errors import ForgeError


def verify(
    target: Annotated[Path, typer.Argument(metavar="PATH", help="A signed manifest, a bundle (.tar.gz or folder) or a release index.")],
    key: KeyOpt = None,
    build_dir: Annotated[Path | None, typer.Option("--build", metavar="DIR", help="Where a bare manifest's artifacts are (default: its folder).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Check the signature, every artifact's size and sha256, and completeness. Exit 0 when all hold, else 1."""
    from mamba_forge.core.errors import ManifestError
    from mamba_forge.runtime.errors import ArtifactRefused, LoadError
    from mamba_forge.runtime.trust import trusted_keys
    from mamba_forge.runtime.verify import open_verified

    must_exist(target, "manifest or bundle", "pass the path of a signed manifest, bundle or index")
    if build_dir is not None:
        _build_folder(build_dir)
    keys = trusted_keys(key or None)  # an unsafe trust folder or key is bad input (TrustRefused: exit 2)
    try:
        v = open_verified(target, keys=keys, build=build_dir)
    except LoadError as exc:
        not_one = _not_a_manifest(target)  # asked only now: a manifest that verifies is read once
        if not_one:
            raise ForgeError(f"{target} {not_one}", hint="pass a signed manifest (.toml), a bundle (.tar.gz or "
                             "folder) or a release index") from None
        hint = None
        if isinstance(exc, ArtifactRefused) and build_dir is None and target.is_file() and not _tarball(target):
            hint = ("its artifacts are looked for beside it; pass --build DIR (the --out folder of `mamba-forge "
                    "build`) if they are elsewhere")
        raise ManifestError(str(exc), hint=hint) from None  # it does not verify: a check failed (exit 1)
    if v.manifest is None:
        what = f"index of {len(v.entries)} manifest(s): " + ", ".join(e.manifest.device.name for e in v.entries)
    else:
        n = sum(1 for s in v.manifest.symbols if s.status == "admitted")
        what = f"{len(v.manifest.artifacts)} artifact(s), {n} admitted symbol(s) for {v.manifest.device.name}"
    dev = " (development key)" if v.signature.development_key else ""
    if as_json:
        js.emit({"path": str(target), "kind": v.kind, "key_id": v.signature.key_id,
                 "development_key": v.signature.development_key, "summary": what})
    else:
        say(f"ok: {target}: signature by key {v.signature.key_id[:16]}{dev}; {what}")


def _build_folder(build_dir: Path) -> None:
    """--build names an existing folder (bad input, exit 2, as qualify says it), not a file whose artifacts would
    then be 'missing'."""
    must_exist(build_dir, "--build folder", "pass the build folder that holds the manifest's artifacts")
    if not build_dir.is_dir():
        raise ForgeError(f"--build {build_dir} is not a folder", hint="pass the --out folder of `mamba-forge build`")


def _tarball(path: Path) -> bool:
    return path.name.endswith((".tar.gz", ".tgz"))


def _not_a_manifest(path: Path) -> str | None:
    """Why a file that failed to verify is not a manifest at all (bad input, exit 2), or None when it is one that
    failed a check (exit 1): runtime/verify.py not_a_manifest, load()'s own words. Folders and bundles: None (what
    they hold is checked by open_verified)."""
    from mamba_forge.manifest.toml_io import read_input
    from mamba_forge.runtime.verify import not_a_manifest

    if not path.is_file() or _tarball(path):
        return None
    try:
        return not_a_manifest(read_input(path))  # bounded: the same limit the verifier applied
    except ForgeError:
        return None


def merge(
    manifests: Annotated[list[Path], typer.Argument(metavar="MANIFEST", help="Per-device signed manifests (or .tar.gz bundles).")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="FILE", help="The signed index to write (beside the manifests).")],
    sign_key: Annotated[
        Path | None, typer.Option("--sign-key", metavar="KEY", help="PEM private key (default: $MAMBA_FORGE_SIGNING_KEY).")
    ] = None,
    key: KeyOpt = None,
    development_key: Annotated[bool, typer.Option("--development-key", help="Mark the index as signed by a development key.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Write one signed release index over verified per-device manifests; the loader picks the device's entry."""
    from mamba_forge.manifest.bundle import signing_key, trust_inputs, write_index
    from mamba_forge.runtime.trust import trusted_keys

    for m in manifests:
        must_exist(m, "manifest", "pass per-device signed manifests or bundles")
    key_files = trust_inputs(output, "index", sign_key=sign_key, keys=key)  # -o is none of them either
    private = signing_key(sign_key)
    path = write_index(manifests, output, private, keys=trusted_keys(key or None), development_key=development_key,
                       inputs=key_files)
    if as_json:
        js.emit({"path": str(path), "manifests": [str(m) for m in manifests]})
    else:
        say(f"wrote {path}: {len(manifests)} manifest(s)")


def bundle(
    manifest: Annotated[Path, typer.Argument(metavar="MANIFEST", help="A signed qualified manifest.")],
    build_dir: Annotated[Path, typer.Option("--build", metavar="DIR", help="The build folder holding its artifacts.")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="OUT", help="OUT.tar.gz (reproducible bytes) or a new folder.")],
    key: KeyOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pack a verified manifest with exactly the artifacts it names; the loader and `verify` accept the result."""
    from mamba_forge.manifest.bundle import trust_inputs, write_bundle
    from mamba_forge.runtime.trust import trusted_keys

    must_exist(manifest, "manifest", "pass a signed qualified manifest")
    _build_folder(build_dir)
    key_files = trust_inputs(output, "bundle", keys=key)  # -o is none of them either
    path = write_bundle(manifest, output, keys=trusted_keys(key or None), build=build_dir, inputs=key_files)
    if as_json:
        js.emit({"path": str(path)})
    else:
        say(f"wrote {path}")


def keygen(
    out_dir: Annotated[Path, typer.Option("--out", metavar="DIR", help="Folder for <name>.key (mode 0600) and <name>.pub.")] = Path("keys"),
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="File name stem.")] = "mamba-forge",
    as_json: JsonOpt = False,
) -> None:
    """Write an Ed25519 key pair for signing qualified manifests."""
    from mamba_forge.runtime.signing import write_keypair

    if not name or "/" in name or name in (".", "..") or name.startswith("."):
        raise ForgeError(f"--name {name!r} is not a plain file name stem", hint="e.g. --name release")
    if out_dir.exists() and not out_dir.is_dir():
        raise ForgeError(f"--out {out_dir} exists and is not a folder", hint="pass a folder for the key pair")
    try:
        priv, pub, kid = write_keypair(out_dir, name)
    except FileExistsError as exc:
        raise ForgeError(str(exc), hint="choose another --name or --out") from None
    if as_json:
        js.emit({"private_key": str(priv), "public_key": str(pub), "key_id": kid})
    else:
        say(f"private key {priv} (mode 0600), public key {pub}, key id {kid}")


def schema(
    name: Annotated[str | None, typer.Argument(metavar="NAME", help="A command (build, report, cache-prune, ...) or "
                                               "envelope; leave out to list them.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Print the JSON Schema of a command's --json output (the files shipped in mamba_forge/schemas)."""
    from mamba_forge import schemas

    known = schemas.names()
    if name is None:
        if as_json:
            js.emit({"names": known})
        else:
            say_lines(known)
        return
    key = schemas.file_name(name)
    if key not in known:
        raise ForgeError(f"no schema named {name!r}", hint=f"known: {', '.join(known)}")
    doc = json.loads(schemas.shipped(key))
    if as_json:
        js.emit(doc)
    else:
        sys.stdout.write(schemas.dumps(doc))

