"""A signed fixture for the hardening tests: the tiny runtime catalog (tests/runtime_support.py) built once per
session, qualified for an H200, signed with a runtime table, and bundled; plus a CLI runner in a subprocess that
reports (exit code, stdout, stderr)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from runtime_support import build_tiny, keypair, qualified_body, write_tiny_catalog, write_with_runtime_table


def make_fixture(root: Path) -> SimpleNamespace:
    cat = write_tiny_catalog(root / "cat")  # its families declare their qualification dims
    bm = build_tiny(cat, root / "build", root / "cache")
    priv, pub, kid = keypair(root / "keys", "release")
    body = qualified_body(bm, cat)
    manifest = root / "build" / "h200.toml"
    write_with_runtime_table(body, priv, manifest)
    from mamba_forge.manifest.bundle import write_bundle
    from mamba_forge.runtime.trust import trusted_keys

    tar = write_bundle(manifest, root / "h200.tar.gz", keys=trusted_keys([pub], defaults=False), build=root / "build")
    return SimpleNamespace(root=root, build=root / "build", manifest=manifest, tar=tar, priv=priv, pub=pub, kid=kid,
                           body=body, keys=root / "keys")


def cli(*args, env: dict | None = None, cwd: Path | None = None, timeout: float = 60) -> tuple[int, str, str]:
    """`mamba-forge ARGS` in a fresh process (this checkout first on the path)."""
    full = {**os.environ, **(env or {})}
    r = subprocess.run([sys.executable, "-m", "mamba_forge.cli", *map(str, args)], capture_output=True, text=True,
                       env=full, cwd=cwd, timeout=timeout)
    return r.returncode, r.stdout, r.stderr


def one_line_error(err: str) -> bool:
    """Bad input: `error: ...` on one line (plus at most one `hint:` line), never a traceback."""
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    return ("Traceback" not in err and 1 <= len(lines) <= 2 and lines[0].startswith("error: ")
            and all(ln.startswith("hint:") for ln in lines[1:]))
