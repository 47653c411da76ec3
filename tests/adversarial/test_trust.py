"""Trust folders and key files: every owner/mode/symlink combination of the user's trust folder ($MAMBA_FORGE_TRUST)
and of a --key file or folder; only private ones (owned by you or root, writable by nobody else, no symlinked
component) are trusted. Through `verify` a refused trust path is bad input: exit 2, one line naming the path."""

from __future__ import annotations

import os
import shutil

import pytest
from harden_support import cli, make_fixture, one_line_error

from mamba_forge.runtime import load
from mamba_forge.runtime.trust import TrustRefused, trusted_keys

FOREIGN = 54321
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to a foreign owner needs root")


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    return make_fixture(tmp_path_factory.mktemp("trust"))


def _trust_folder(base, fx, *, dir_mode=0o755, dir_uid=None, key_mode=0o644, key_uid=None):
    folder = base / "trusted"
    folder.mkdir()
    key = folder / "release.pub"
    shutil.copy(fx.pub, key)
    os.chmod(key, key_mode)
    os.chmod(folder, dir_mode)
    if dir_uid is not None or key_uid is not None:
        os.chown(folder, dir_uid if dir_uid is not None else -1, -1)
        os.chown(key, key_uid if key_uid is not None else -1, -1)
    return folder, key


# (folder mode, folder uid, key mode, key uid, refused?)
COMBOS = [(dm, du, km, ku) for dm in (0o700, 0o755, 0o775, 0o777, 0o1777) for du in (None, FOREIGN)
          for km in (0o600, 0o644, 0o664, 0o666) for ku in (None, FOREIGN)]


@needs_root
@pytest.mark.parametrize(("dir_mode", "dir_uid", "key_mode", "key_uid"), COMBOS)
def test_trust_folder_owner_and_mode(tmp_path, fx, monkeypatch, dir_mode, dir_uid, key_mode, key_uid):
    folder, _ = _trust_folder(tmp_path, fx, dir_mode=dir_mode, dir_uid=dir_uid, key_mode=key_mode, key_uid=key_uid)
    unsafe = dir_mode & 0o022 or dir_uid is not None or key_mode & 0o022 or key_uid is not None
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(folder))
    if unsafe:
        with pytest.raises(TrustRefused, match="trust|key") as exc:
            trusted_keys()
        assert str(folder) in str(exc.value) and "\n" not in str(exc.value)
    else:
        assert fx.kid in trusted_keys()


@needs_root
@pytest.mark.parametrize(("mode", "uid"), [(0o666, None), (0o622, None), (0o644, FOREIGN), (0o600, FOREIGN)])
def test_unsafe_trust_folder_through_verify_is_exit_2(tmp_path, fx, mode, uid):
    folder, _ = _trust_folder(tmp_path, fx, key_mode=mode, key_uid=uid)
    rc, out, err = cli("verify", fx.manifest, env={"MAMBA_FORGE_TRUST": str(folder)})
    assert rc == 2 and out == "" and one_line_error(err) and str(folder) in err


def test_world_writable_trust_folder_through_verify_and_load(tmp_path, fx, monkeypatch):
    folder, _ = _trust_folder(tmp_path, fx, dir_mode=0o777)
    rc, _, err = cli("verify", fx.manifest, env={"MAMBA_FORGE_TRUST": str(folder)})
    assert rc == 2 and one_line_error(err) and "group- or world-writable" in err
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(folder))
    from runtime_support import FakeBackend

    with pytest.raises(TrustRefused, match="world-writable"):
        load(fx.manifest, backend=FakeBackend())


def test_private_trust_folder_verifies(tmp_path, fx):
    folder, _ = _trust_folder(tmp_path, fx, dir_mode=0o700, key_mode=0o600)
    rc, out, err = cli("verify", fx.manifest, env={"MAMBA_FORGE_TRUST": str(folder)})
    assert rc == 0 and out.startswith("ok: ") and err == ""


@pytest.mark.parametrize("where", ["key", "folder", "ancestor"])
def test_symlinked_trust_paths_are_refused(tmp_path, fx, monkeypatch, where):
    real, key = _trust_folder(tmp_path, fx)
    if where == "key":  # a key symlinked from a world-writable folder
        drop = tmp_path / "drop"
        drop.mkdir()
        os.chmod(drop, 0o777)
        shutil.move(key, drop / "release.pub")
        key.symlink_to(drop / "release.pub")
        folder = real
    elif where == "folder":
        folder = tmp_path / "link"
        folder.symlink_to(real)
    else:
        (tmp_path / "alias").symlink_to(tmp_path)
        folder = tmp_path / "alias" / "trusted"
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(folder))
    with pytest.raises(TrustRefused, match="symlink") as exc:
        trusted_keys()
    assert "\n" not in str(exc.value)
    rc, _, err = cli("verify", fx.manifest, env={"MAMBA_FORGE_TRUST": str(folder)})
    assert rc == 2 and one_line_error(err) and "symlink" in err


@needs_root
@pytest.mark.parametrize(("mode", "uid", "ok"), [(0o644, None, True), (0o600, None, True), (0o664, None, False),
                                                  (0o666, None, False), (0o644, FOREIGN, False)])
def test_key_option_file_rules(tmp_path, fx, mode, uid, ok):
    key = tmp_path / "k.pub"
    shutil.copy(fx.pub, key)
    os.chmod(key, mode)
    if uid is not None:
        os.chown(key, uid, -1)
    rc, out, err = cli("verify", fx.manifest, "--key", key, env={"MAMBA_FORGE_TRUST": str(tmp_path / "none")})
    if ok:
        assert rc == 0 and out.startswith("ok: ")
    else:
        assert rc == 2 and one_line_error(err) and str(key) in err


@pytest.mark.parametrize("kind", ["fifo", "folder-named-pub", "dev-zero", "missing", "not-a-key", "oversize"])
def test_key_files_that_are_not_keys(tmp_path, fx, kind):
    folder = tmp_path / "trusted"
    folder.mkdir()
    target = folder / "x.pub"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder-named-pub":
        target.mkdir()
    elif kind == "dev-zero":
        target = tmp_path / "zero"
        os.symlink("/dev/zero", target)
    elif kind == "missing":
        target = tmp_path / "absent.pub"
    elif kind == "not-a-key":
        target.write_text("ed25519 not-base64\n")
    else:
        target.write_bytes(b"ed25519 " + b"A" * (1 << 20))
    arg = target if kind in ("dev-zero", "missing") else folder
    rc, _, err = cli("verify", fx.manifest, "--key", arg, env={"MAMBA_FORGE_TRUST": str(tmp_path / "none")}, timeout=20)
    assert rc == 2 and one_line_error(err)


def test_shipped_release_keys_are_trusted_as_installed(fx, monkeypatch, tmp_path):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "none"))
    from mamba_forge.runtime.trust import release_keys_dir

    shipped = trusted_keys()
    assert len(shipped) == len(list(release_keys_dir().glob("*.pub"))) >= 1


def test_absent_trust_folder_trusts_nothing_more(fx, monkeypatch, tmp_path):
    monkeypatch.setenv("MAMBA_FORGE_TRUST", str(tmp_path / "none"))
    assert fx.kid not in trusted_keys()
    rc, _, err = cli("verify", fx.manifest, env={"MAMBA_FORGE_TRUST": str(tmp_path / "none")})
    assert rc == 1 and "not trusted" in err
