"""`mamba-forge env` (what this installation sees, like `flashinfer show-config`) and `mamba-forge cache
dir|size|clean|prune` (like `uv cache`). Registered on the main app by :func:`register`; never needs a GPU."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Annotated

import typer

from mamba_forge import __version__
from mamba_forge.core.errors import ForgeError, printable

# Every environment variable the tool reads (tests/test_env_cli.py greps the package to keep this list whole).
ENV_VARS: dict[str, str] = {
    "MAMBA_FORGE_CACHE": "build cache folder (absolute), or 0/off to disable it",
    "MAMBA_FORGE_CACHE_MAX": "size cap for `cache prune` (500M, 2G, 1.5GiB, bytes)",
    "MAMBA_FORGE_ARCH": "build targets when --arch is not given (sm_90a,sm_80 or 8.0 9.0a; all; native)",
    "TORCH_CUDA_ARCH_LIST": "build targets when neither --arch nor MAMBA_FORGE_ARCH is given (as FlashInfer does)",
    "MAMBA_FORGE_TRUST": "folder of trusted public keys (default $XDG_CONFIG_HOME/mamba-forge/trusted)",
    "MAMBA_FORGE_SIGNING_KEY": "PEM private key for qualify and merge (the value is never shown)",
    "XDG_CACHE_HOME": "base of the default cache folder",
    "XDG_CONFIG_HOME": "base of the default trust folder and development key",
    "HOME": "fallback base of both",
    "CUDA_CACHE_DISABLE": "NVRTC's own compute cache; the build sets 1 unless you set it",
}
SECRET_VARS = {"MAMBA_FORGE_SIGNING_KEY"}
_SHOWN = 200

cache_app = typer.Typer(help="The private build cache: dir, size, clean, prune.", no_args_is_help=True,
                        add_completion=False, rich_markup_mode=None)
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout (schema: mamba-forge schema).")]


def _say(text: str) -> None:
    """One line on stdout, control characters escaped (errors.printable, never cut): it shows paths and values
    from the environment, where a newline or an escape sequence must not reach the terminal."""
    sys.stdout.write(printable(text, limit=1 << 20) + "\n")


def _show(as_json: bool, result: dict, text: str | list[str]) -> None:
    """The result as the --json envelope, or as lines for a person (`text`: one line, or a list of them)."""
    if as_json:
        from mamba_forge.cli_json import emit

        emit(result)
    else:
        for line in [text] if isinstance(text, str) else text:
            _say(line)


def _dist(name: str) -> str | None:
    from importlib import metadata  # here, not at the top: ~25 ms that `mamba-forge -h` does not need

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _attempt(fn):
    """fn()'s value, or {"error": ...}: `env` reports every part it can and fails on none."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a report of what is broken must not break
        return {"error": f"{type(exc).__name__}: {exc}"}


def _keys() -> list[dict]:
    """Every key of the release and user trust folders, each judged and read as `verify` does
    (signing.load_trusted: bounded reads; the user's folder and files private), so a FIFO or a link to
    /dev/zero is an error entry, never a hang."""
    from mamba_forge.runtime import signing
    from mamba_forge.runtime.trust import release_keys_dir

    found = []
    for origin, folder in (("release", _attempt(release_keys_dir)), ("user", _attempt(signing.user_trust_dir))):
        got = folder if not isinstance(folder, Path) else _attempt(lambda o=origin, f=folder: _folder_keys(o, f))
        found += [{"origin": origin, "error": got["error"]}] if isinstance(got, dict) else got
    return found


def _folder_keys(origin: str, folder: Path) -> list[dict]:
    """The entries of one trust folder: what verify (runtime/trust.py trusted_keys) would load from it, one
    signing.load_trusted call per file so one bad key does not hide the others."""
    from mamba_forge.core import safety
    from mamba_forge.runtime import signing

    installed = origin == "release"
    present = folder.is_dir() if installed else folder.exists() or folder.is_symlink()
    if not present:
        return []  # verify skips it: an absent trust folder trusts nothing more
    found, refused = [], None
    if folder.is_symlink() or not folder.is_dir():  # verify reads it as one key file (and refuses a symlink)
        files = [folder]
    else:
        files = sorted(folder.glob("*.pub"))
        try:
            if not installed:
                safety.check_trusted_dir(folder)
        except safety.PathRefused as exc:
            refused = f"refused: {exc}"
            found.append({"origin": origin, "path": str(folder), "error": refused})
    for f in files:
        try:
            if refused:
                raise signing.SignatureError("not trusted: its folder is refused")
            keys = signing.load_trusted([f], installed=installed)
        except (OSError, signing.SignatureError) as exc:
            found.append({"origin": origin, "path": str(f), "error": str(exc)})
        else:
            found += [{"origin": origin, "key_id": kid, "path": str(f)} for kid in keys]
    return found


def _cache() -> dict:
    from mamba_forge.build import cache_admin

    root = cache_admin.cache_root()
    why = cache_admin.safety(root)
    used = cache_admin.usage(root)
    return {"path": str(root), "safe": why is None, "problem": why, "bytes": used.bytes, "entries": used.entries}


def _targets() -> dict:
    from mamba_forge.catalog.targets import DEFAULT_TARGETS, select_targets

    sel = select_targets(None, os.environ)
    return {"default": list(DEFAULT_TARGETS), "build": list(sel.names), "source": sel.source}


def _environment() -> dict:
    out = {}
    for name, meaning in ENV_VARS.items():
        value = os.environ.get(name)
        shown = None if value is None else "(set, hidden)" if name in SECRET_VARS else value[:_SHOWN]
        out[name] = {"set": value is not None, "value": shown, "meaning": meaning}
    return out


def environment_report() -> dict:
    from mamba_forge.build import nvrtc
    from mamba_forge.catalog.model import default_catalog_path
    from mamba_forge.core.cache import memo_writes_off
    from mamba_forge.gpu.probe import probe

    environment = _environment()  # first: reading NVRTC sets CUDA_CACHE_DISABLE when the user has not
    gpu = probe()
    with memo_writes_off():  # a report changes nothing: not even the compiler-identity memo in the cache it counts
        nvrtc_identity = _attempt(nvrtc.library_identity)
    return {
        "mamba_forge": {"version": __version__, "package": str(Path(__file__).resolve().parent)},
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "nvrtc": nvrtc_identity,
        "cuda_bindings": _dist("cuda-bindings"),
        "driver": {"version": gpu.driver_version, "gpus": gpu.gpus, "note": gpu.reason},
        "cache": _attempt(_cache),
        "trusted_keys": _keys(),
        "catalog": _attempt(lambda: str(default_catalog_path())),
        "targets": _attempt(_targets),
        "environment": environment,
    }


def _text(report: dict) -> list[str]:
    lines = [f"mamba-forge {report['mamba_forge']['version']} ({report['mamba_forge']['package']})",
             f"python {report['python']['version']} ({report['python']['executable']})"]
    nv = report["nvrtc"]
    lines.append("nvrtc " + (nv["error"] if "error" in nv else ", ".join(f"{k}={v}" for k, v in nv.items())))
    lines.append(f"cuda-bindings {report['cuda_bindings']}")
    drv = report["driver"]
    lines.append(f"driver {drv['version'] or 'none'}" + (f" ({drv['note']})" if drv["note"] else ""))
    lines += [f"gpu {g['ordinal']}: {g['name']} (cc {g['cc']}, {g['sm_count']} SMs)" for g in drv["gpus"]]
    c = report["cache"]
    lines.append("cache " + (c["error"] if "error" in c else
                             f"{c['path']}: {'safe' if c['safe'] else 'UNSAFE: ' + c['problem']}, "
                             f"{c['entries']} entries, {c['bytes']} bytes"))
    for k in report["trusted_keys"] or [{"origin": "-", "error": "no trusted keys found"}]:
        lines.append(f"key ({k['origin']}) " + (f"{k['key_id'][:16]} {k['path']}" if "key_id" in k
                                                else f"{k.get('path', '')} {k['error']}".strip()))
    cat = report["catalog"]
    lines.append(f"catalog {cat['error'] if isinstance(cat, dict) else cat}")
    t = report["targets"]
    lines.append("targets " + (t["error"] if "error" in t else
                               f"default {','.join(t['default'])}; build uses {','.join(t['build'])} ({t['source']})"))
    for name, v in report["environment"].items():
        lines.append(f"  {name}={v['value']!r}" if v["set"] else f"  {name} (unset)")
    return lines


def env(as_json: JsonOpt = False) -> None:
    """Versions, compiler, driver and GPUs, cache, trusted keys, catalog, targets and environment variables."""
    report = environment_report()
    _show(as_json, report, _text(report))


@cache_app.command("dir")
def cache_dir(as_json: JsonOpt = False) -> None:
    """Print the cache folder."""
    from mamba_forge.build import cache_admin

    root = cache_admin.cache_root()
    _show(as_json, {"path": str(root)}, str(root))


@cache_app.command("size")
def cache_size(as_json: JsonOpt = False) -> None:
    """Bytes and entry count of the cache."""
    _cache_counts(as_json, "usage", "", "{bytes} bytes in {entries} entries ({root})")


@cache_app.command("clean")
def cache_clean(as_json: JsonOpt = False) -> None:
    """Remove every cache entry (the folder and its 0700 mode stay). Refuses an unsafe folder."""
    _cache_counts(as_json, "clean", "removed_", "removed {entries} entries, {bytes} bytes ({root})")


def _cache_counts(as_json: bool, op: str, prefix: str, text: str) -> None:
    """cache_admin.<op>(the cache folder)'s bytes and entries, shown as <prefix>bytes, <prefix>entries (JSON) or
    `text` (its {bytes}, {entries} and {root} filled in)."""
    from mamba_forge.build import cache_admin

    root = cache_admin.cache_root()
    n = getattr(cache_admin, op)(root)
    _show(as_json, {"path": str(root), f"{prefix}bytes": n.bytes, f"{prefix}entries": n.entries},
          text.format(bytes=n.bytes, entries=n.entries, root=root))


@cache_app.command("prune")
def cache_prune(
    max_size: Annotated[str | None, typer.Option("--max-size", metavar="SIZE", help="Cap: 500M, 2G, 1.5GiB or bytes "
                                                 "(default: $MAMBA_FORGE_CACHE_MAX).")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove least recently used entries until the cache is at most the cap."""
    from mamba_forge.build import cache_admin

    if max_size is not None:
        cap = cache_admin.parse_size(max_size)
    elif os.environ.get(cache_admin.MAX_ENV):
        cap = cache_admin.parse_size(os.environ[cache_admin.MAX_ENV], cache_admin.MAX_ENV)
    else:
        raise ForgeError("cache prune needs a size cap", hint=f"pass --max-size 2G or set {cache_admin.MAX_ENV}")
    root = cache_admin.cache_root()
    gone = cache_admin.prune(root, cap)
    left = cache_admin.usage(root)
    _show(as_json, {"path": str(root), "max_bytes": cap, "removed_bytes": gone.bytes, "removed_entries": gone.entries,
                    "bytes": left.bytes, "entries": left.entries},
          f"removed {gone.entries} entries, {gone.bytes} bytes; {left.bytes} bytes in {left.entries} entries "
              f"left (cap {cap}) ({root})")


def register(app: typer.Typer) -> None:
    app.command("env")(env)
    app.add_typer(cache_app, name="cache")
