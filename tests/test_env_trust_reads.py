"""`mamba-forge env` reads the trusted keys as `verify` judges them (bounded, the user's folder and files private):
a FIFO or a link to /dev/zero is an error entry, never a hang or a read without end; a trust folder that cannot be
named is reported, not a crash. And lines for a person (env's, `say()`'s) escape control characters: a path with
an escape sequence and a newline is one escaped line."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from mamba_forge import cli_env
from mamba_forge.cli import main
from mamba_forge.core.errors import ForgeError
from mamba_forge.runtime import signing, trust
from mamba_forge.runtime.signing import Ed25519PrivateKey

HOSTILE = "a\x1b[2J\nok: forged"


def _good_key(folder: Path, name: str = "good.pub") -> str:
    key = Ed25519PrivateKey.generate().public_key()
    (folder / name).write_text(signing.public_text(key))
    (folder / name).chmod(0o600)
    return signing.key_id(key)


@pytest.fixture
def trust_dir(tmp_path, monkeypatch):
    """A private user trust folder holding a good key, a FIFO and a 1 MiB file."""
    folder = tmp_path / "T"
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    kid = _good_key(folder)
    os.mkfifo(folder / "a.pub")
    (folder / "big.pub").write_bytes(b"ed25519 " + b"A" * (1 << 20))
    (folder / "big.pub").chmod(0o600)
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(folder))
    return folder, kid


def _keys_within(seconds: float) -> list[dict]:
    """cli_env._keys() run in a thread: a read that blocks (a FIFO without writer) fails the test, not the run."""
    got: list = []
    t = threading.Thread(target=lambda: got.append(cli_env._keys()), daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "reading the trusted keys blocked"
    return got[0]


def _small_memory() -> None:  # the child: a read without end fails at 1 GiB of heap instead of eating the machine
    resource.setrlimit(resource.RLIMIT_DATA, (1 << 30, 1 << 30))


def _by_path(keys: list[dict]) -> dict[str, dict]:
    return {Path(k["path"]).name: k for k in keys if "path" in k}


def test_fifo_and_oversized_keys_are_error_entries_and_the_good_key_listed(trust_dir):
    folder, kid = trust_dir
    got = _by_path([k for k in _keys_within(30) if k["origin"] == "user"])
    assert got["good.pub"] == {"origin": "user", "key_id": kid, "path": str(folder / "good.pub")}
    assert "key_id" not in got["a.pub"] and "regular file" in got["a.pub"]["error"]
    assert "key_id" not in got["big.pub"] and got["big.pub"]["error"].startswith("refused")


def test_env_returns_promptly_in_a_process(trust_dir):
    """Also a link to /dev/zero: in a child process with bounded memory, as a read without end would eat it."""
    folder, kid = trust_dir
    os.symlink("/dev/zero", folder / "z.pub")
    r = subprocess.run([sys.executable, "-m", "mamba_forge.cli", "env", "--json"], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "MAMBA_FORGE_TRUST": str(folder)}, preexec_fn=_small_memory)
    assert r.returncode == 0, r.stderr
    keys = _by_path(json.loads(r.stdout)["result"]["trusted_keys"])
    assert keys["good.pub"]["key_id"] == kid and "error" in keys["a.pub"] and "error" in keys["z.pub"]


def test_release_keys_are_read_bounded_too(tmp_path, monkeypatch):
    """The shipped folder is trusted as the package is (no ownership rules), but its reads are bounded."""
    rel = tmp_path / "release"
    rel.mkdir()
    kid = _good_key(rel, "release.pub")
    os.mkfifo(rel / "fifo.pub")
    (rel / "big.pub").write_bytes(b"ed25519 " + b"A" * (1 << 20))
    monkeypatch.setattr(trust, "release_keys_dir", lambda: rel)
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "absent"))
    keys = _keys_within(30)
    got = _by_path(keys)
    assert got["release.pub"]["key_id"] == kid
    assert "error" in got["fifo.pub"] and "error" in got["big.pub"]
    assert all(k["origin"] == "release" for k in keys)  # an absent user folder trusts nothing and is no error


def test_a_user_folder_others_may_write_is_refused_with_its_keys(tmp_path, monkeypatch):
    folder = tmp_path / "open"
    folder.mkdir()
    _good_key(folder)
    folder.chmod(0o777)
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(folder))
    got = _by_path([k for k in cli_env._keys() if k["origin"] == "user"])
    assert got["open"]["error"].startswith("refused")
    assert "key_id" not in got["good.pub"] and "folder is refused" in got["good.pub"]["error"]


def test_a_trust_folder_that_cannot_be_named_is_reported(monkeypatch, capsys):
    def refuse():
        raise ForgeError("MAMBA_FORGE_TRUST must be an absolute path")

    monkeypatch.setattr(signing, "user_trust_dir", refuse)
    keys = cli_env._keys()
    assert {"origin": "user", "error": "ForgeError: MAMBA_FORGE_TRUST must be an absolute path"} in keys
    assert main(["env"]) == 0
    assert "key (user) ForgeError: MAMBA_FORGE_TRUST must be an absolute path" in capsys.readouterr().out


def test_env_text_escapes_a_hostile_trust_path(tmp_path, monkeypatch, capsys):
    folder = tmp_path / HOSTILE
    folder.mkdir(mode=0o700)
    folder.chmod(0o700)
    _good_key(folder)
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(folder))
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\nok: forged" not in out
    line = next(ln for ln in out.splitlines() if "good.pub" in ln)
    assert line.startswith("key (user) ") and "a\\x1b[2J\\nok: forged/good.pub" in line


def test_cache_dir_prints_one_escaped_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(tmp_path / HOSTILE))
    assert main(["cache", "dir"]) == 0
    assert capsys.readouterr().out == str(tmp_path) + "/a\\x1b[2J\\nok: forged\n"
    assert main(["cache", "dir", "--json"]) == 0  # JSON escapes itself: the path as it is
    assert json.loads(capsys.readouterr().out)["result"]["path"] == str(tmp_path / HOSTILE)


def test_say_prints_a_path_as_one_escaped_line(tmp_path, cli_consoles, capsys):
    cli_consoles()
    out_dir = tmp_path / HOSTILE
    assert main(["keygen", "--out", str(out_dir)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "\x1b" not in out
    assert out.startswith(f"private key {tmp_path}/a\\x1b[2J\\nok: forged/mamba-forge.key (mode 0600)")


def test_say_never_cuts_a_long_line(cli_consoles, capsys):
    from mamba_forge.cli.common import say

    cli_consoles()
    say("x" * 5000 + "\x07")
    assert capsys.readouterr().out == "x" * 5000 + "\\x07\n"
