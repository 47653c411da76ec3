"""Trust never depends on the current folder: a relative $MAMBA_FORGE_TRUST is refused (one line: set an absolute
path, as a relative $MAMBA_FORGE_CACHE is), and a relative $XDG_CONFIG_HOME is ignored (the XDG spec calls it
invalid), both for the trust folder and for qualify's development key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mamba_forge.cli import main
from mamba_forge.core.errors import ForgeError
from mamba_forge.qualify import keys
from mamba_forge.runtime import signing
from mamba_forge.runtime.errors import LoadError
from mamba_forge.runtime.trust import trusted_keys


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A fresh home and a separate current folder, so anything made relative to the latter shows."""
    home = tmp_path / "home"
    cwd = tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    monkeypatch.delenv("MAMBA_FORGE_TRUST", raising=False)
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    return home


@pytest.mark.parametrize("value", ["trusted", "./keys", "~/keys", "../x"])
def test_relative_trust_folder_is_refused_in_one_line(home, monkeypatch, value):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", value)
    with pytest.raises(signing.TrustEnvRefused) as err:
        signing.user_trust_dir()
    msg = str(err.value)
    assert "MAMBA_FORGE_TRUST" in msg and "absolute path" in msg and "\n" not in msg
    # the loader sees a refusal of its own kind, the CLI bad input (exit 2)
    assert isinstance(err.value, LoadError) and isinstance(err.value, ForgeError) and err.value.exit_code == 2
    with pytest.raises(LoadError):
        trusted_keys()


def test_verify_with_relative_trust_folder_exits_2_with_one_line(home, monkeypatch, capsys, cli_consoles, tmp_path):
    cli_consoles(120)
    doc = tmp_path / "m.toml"
    doc.write_text("kind = 'qualified'\n")
    monkeypatch.setenv("MAMBA_FORGE_TRUST", "trusted")
    rc = main(["verify", str(doc)])
    _, err = capsys.readouterr()
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and "MAMBA_FORGE_TRUST" in lines[0] and "Traceback" not in err, err


def test_absolute_and_empty_trust_folder(home, monkeypatch, tmp_path):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "t"))
    assert signing.user_trust_dir() == tmp_path / "t"
    monkeypatch.setenv("MAMBA_FORGE_TRUST", "")  # empty: unset
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert signing.user_trust_dir() == tmp_path / "cfg" / "mamba-forge" / "trusted"


@pytest.mark.parametrize("value", ["cfg", "./cfg", "", "~/cfg"])
def test_relative_xdg_config_home_is_ignored(home, monkeypatch, value):
    monkeypatch.setenv("XDG_CONFIG_HOME", value)
    assert signing.user_trust_dir() == home / ".config" / "mamba-forge" / "trusted"
    assert keys.dev_key_dir() == home / ".config" / "mamba-forge" / "dev-key"


def test_development_key_never_lands_in_the_current_folder(home, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", "cfg")
    key = keys.resolve_key(None)
    assert key.development and key.path == home / ".config" / "mamba-forge" / "dev-key" / "mamba-forge-dev.key"
    assert key.path.is_file() and list(Path.cwd().iterdir()) == []
