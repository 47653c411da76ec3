"""`qualify`'s keys and outputs against hostile input: the signing key and the development key read bounded (a
folder, FIFO, /dev/zero, garbage or a dangling symlink is one line, never a traceback or a hang); --out and the
files written beside it (X.runtime.json, <key id>.pub) never name an input (the build's artifacts, the catalog's
files, the key); and a write that fails half-way (a full disk) leaves the old manifest and runtime table as they
were, byte for byte, still verifying."""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
from runtime_support import signed_tiny

from mamba_forge.cli import main
from mamba_forge.core import fsio
from mamba_forge.core.errors import ForgeError
from mamba_forge.core.vocab import DeviceInfo
from mamba_forge.manifest.qualified import parse_body, read_verified
from mamba_forge.qualify import keys
from mamba_forge.runtime import signing
from mamba_forge.runtime.sources import runtime_table_path

FAKE_H200 = DeviceInfo(ordinal=0, name="NVIDIA H200", cc=(9, 0), sm_count=132, driver_version=13000,
                       optin_smem=232448, smem_per_sm=233472, total_memory=1 << 37, uuid="GPU-test")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return signed_tiny(tmp_path_factory.mktemp("qkeys"), build_manifest=True, table=False)


@pytest.fixture(autouse=True)
def _isolated(cli_consoles, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv(signing.KEY_ENV, raising=False)
    cli_consoles(120)


@pytest.fixture
def no_hang():
    """A FIFO must be refused, never waited on: fail the test instead of hanging the suite."""
    def late(*_):
        raise AssertionError("hung on a read")

    old = signal.signal(signal.SIGALRM, late)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def _one_line(exc: ForgeError) -> bool:
    return "\n" not in str(exc) and "Traceback" not in str(exc)


def _hostile(path: Path, kind: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "garbage":
        path.write_bytes(b"\x00\xffnot a key\n" * 10)
    elif kind == "oversized":
        path.write_bytes(b"A" * (1 << 20))
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    return path


HOSTILE = ["folder", "fifo", "dev-zero", "garbage", "oversized", "dangling"]


# ---- A. keys read bounded, each failure one line ----------------------------------------------------------------


@pytest.mark.parametrize("kind", HOSTILE)
def test_sign_key_hostile_is_one_line(tmp_path, kind, no_hang):
    key = _hostile(tmp_path / "k.pem", kind)
    with pytest.raises(ForgeError) as err:
        keys.resolve_key(key)
    assert _one_line(err.value) and str(key) in str(err.value)


@pytest.mark.parametrize("kind", [*HOSTILE, "stray-pub"])
def test_development_key_hostile_is_one_line_saying_what_to_do(tmp_path, kind, no_hang):
    priv = keys.dev_key_dir() / "mamba-forge-dev.key"
    if kind == "stray-pub":  # a .pub left without its .key: write_keypair would refuse (FileExistsError)
        priv.parent.mkdir(parents=True)
        (priv.parent / "mamba-forge-dev.pub").write_text("ed25519 x\n")
    else:
        _hostile(priv, kind)
    with pytest.raises(ForgeError) as err:
        keys.resolve_key(None)
    assert _one_line(err.value) and "remove" in str(err.value) and "--sign-key" in str(err.value)


def test_development_key_made_once_then_reused(tmp_path):
    first = keys.resolve_key(None)
    again = keys.resolve_key(None)
    assert first.development and "generated" in first.source and "reused" in again.source
    assert first.path == again.path == keys.dev_key_dir() / "mamba-forge-dev.key"


def test_env_key_oversized_or_not_utf8_is_one_line(monkeypatch):
    monkeypatch.setenv(signing.KEY_ENV, "A" * (64 << 10))
    with pytest.raises(ForgeError, match="above the limit") as err:
        keys.resolve_key(None)
    assert _one_line(err.value)
    monkeypatch.setenv(signing.KEY_ENV, os.fsdecode(b"-----BEGIN PRIVATE KEY-----\n\xff\xfe\n"))
    with pytest.raises(ForgeError, match="MAMBA_FORGE_SIGNING_KEY") as err:
        keys.resolve_key(None)
    assert _one_line(err.value)


# ---- the command, with a fake GPU and a canned qualify result ----------------------------------------------------


@pytest.fixture
def fake_gpu(tiny, monkeypatch):
    """qualify without a GPU: one fake H200, and the run replaced by the tiny build's qualified manifest.
    `calls` counts the runs (an output refused up front never reaches one)."""
    from mamba_forge.cli import cmd_qualify
    from mamba_forge.gpu import driver as cu

    class FakeDevice:
        def __init__(self, ordinal=0):
            self.ordinal = ordinal

        def info(self):
            return FAKE_H200

    body, _ = signing.split(tiny.doc)
    state = SimpleNamespace(calls=0, manifest=dataclasses.replace(parse_body(body), qualification_seconds=1.5))

    def fake_run(req, cc, quiet=False):
        state.calls += 1
        return SimpleNamespace(manifest=state.manifest, notes=[])

    monkeypatch.setattr(cu, "device_count", lambda: 1)
    monkeypatch.setattr(cu, "Device", FakeDevice)
    monkeypatch.setattr(cmd_qualify, "_qualify_with_progress", fake_run)
    return state


def _qualify(capsys, tiny, *extra):
    rc = main(["qualify", "--build", str(tiny.build), "--catalog", str(tiny.cat), "--quiet", *map(str, extra)])
    out, err = capsys.readouterr()
    return rc, out, err


def _one_error_line(err: str) -> bool:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    return len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["folder", "fifo", "dev-zero", "garbage"])
def test_cli_sign_key_hostile_exits_2_with_one_line(capsys, tiny, fake_gpu, tmp_path, kind, no_hang):
    key = _hostile(tmp_path / "k.pem", kind)
    rc, out, err = _qualify(capsys, tiny, "--sign-key", key, "--out", tmp_path / "m.toml")
    assert rc == 2 and _one_error_line(err), err
    assert not (tmp_path / "m.toml").exists() and fake_gpu.calls == 0


def test_cli_garbage_development_key_exits_2_with_one_line(capsys, tiny, fake_gpu, tmp_path):
    _hostile(keys.dev_key_dir() / "mamba-forge-dev.key", "garbage")
    rc, out, err = _qualify(capsys, tiny, "--out", tmp_path / "m.toml")
    assert rc == 2 and _one_error_line(err) and "remove" in err, err


# ---- B. no output names an input -------------------------------------------------------------------------------


def _artifact(tiny) -> Path:
    return tiny.build / tiny.bm.modules[0].artifacts[0].path


@pytest.mark.parametrize("target", ["artifact", "build-manifest", "catalog-source", "family-file", "header",
                                    "catalog-root"])
def test_out_never_overwrites_an_input(capsys, tiny, fake_gpu, target):
    out = {"artifact": _artifact(tiny), "build-manifest": tiny.build / "manifest.toml",
           "catalog-source": tiny.cat.parent / "tiny.cu", "family-file": tiny.cat.parent / "tiny.toml",
           "header": tiny.cat.parent / "include" / "tiny.cuh", "catalog-root": tiny.cat}[target]
    before_build, before_cat = _snapshot(tiny.build), _snapshot(tiny.cat.parent)
    rc, _, err = _qualify(capsys, tiny, "--out", out)
    assert rc == 2 and _one_error_line(err) and "input" in err, err
    assert _snapshot(tiny.build) == before_build and _snapshot(tiny.cat.parent) == before_cat
    assert fake_gpu.calls == 0


def test_companion_files_never_overwrite_an_input(capsys, tiny, fake_gpu, tmp_path):
    # the runtime table beside --out would be the signing key
    folder = tmp_path / "k"
    folder.mkdir()
    key = folder / "m.runtime.json"
    key.write_bytes(signing.private_pem(tiny.priv))
    rc, _, err = _qualify(capsys, tiny, "--sign-key", key, "--out", folder / "m.toml")
    assert rc == 2 and _one_error_line(err) and "m.runtime.json" in err, err
    assert key.read_bytes() == signing.private_pem(tiny.priv) and not (folder / "m.toml").exists()
    # the <key id>.pub beside --out would be the signing key
    named = folder / f"{tiny.kid[:16]}.pub"
    key.rename(named)
    rc, _, err = _qualify(capsys, tiny, "--sign-key", named, "--out", folder / "m.toml")
    assert rc == 2 and _one_error_line(err) and named.name in err, err
    assert named.read_bytes() == signing.private_pem(tiny.priv) and not (folder / "m.toml").exists()
    assert fake_gpu.calls == 0


def test_out_never_overwrites_the_development_key(capsys, tiny, fake_gpu):
    priv = keys.resolve_key(None).path
    before = priv.read_bytes()
    rc, _, err = _qualify(capsys, tiny, "--out", priv)
    assert rc == 2 and _one_error_line(err), err
    assert priv.read_bytes() == before and fake_gpu.calls == 0


def test_qualify_writes_a_verifying_trio(capsys, tiny, fake_gpu, tmp_path):
    rc, _, err = _qualify(capsys, tiny, "--sign-key", tiny.key_path, "--out", tmp_path / "m" / "h200.toml")
    assert rc == 0, err
    out = tmp_path / "m" / "h200.toml"
    pub = tmp_path / "m" / f"{tiny.kid[:16]}.pub"
    assert runtime_table_path(out).is_file() and pub.is_file()
    assert read_verified(out, signing.load_trusted([pub])).device.name == "NVIDIA H200"
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([out.name, runtime_table_path(out).name, pub.name])


# ---- C. a failed write leaves the old pair --------------------------------------------------------------------


def _manifest(tiny, seconds: float):
    body, _ = signing.split(tiny.doc)
    return dataclasses.replace(parse_body(body), qualification_seconds=seconds)


def _fail_on_call(monkeypatch, n: int):
    real = fsio.stage_file
    calls = []

    def stage(path, payload, **kw):
        calls.append(path)
        if len(calls) == n:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, payload, **kw)

    monkeypatch.setattr(fsio, "stage_file", stage)
    return calls


def test_full_disk_at_the_second_write_keeps_the_old_pair(tiny, tmp_path, monkeypatch):
    key = keys.resolve_key(tiny.key_path)
    out = tmp_path / "m" / "h200.toml"
    keys.write_signed(_manifest(tiny, 1.0), key, out)
    before = _snapshot(out.parent)
    calls = _fail_on_call(monkeypatch, 2)
    with pytest.raises(ForgeError, match="cannot write .*No space left on device") as err:
        keys.write_signed(_manifest(tiny, 2.0), key, out)
    assert _one_line(err.value) and calls == [runtime_table_path(out), out]
    assert _snapshot(out.parent) == before  # byte for byte, and no temp file left
    assert read_verified(out, signing.load_trusted([tiny.pub])).qualification_seconds == 1.0
    monkeypatch.undo()
    keys.write_signed(_manifest(tiny, 2.0), key, out)  # room again: the new pair
    assert read_verified(out, signing.load_trusted([tiny.pub])).qualification_seconds == 2.0


def test_failed_rename_of_the_manifest_restores_the_old_table(tiny, tmp_path, monkeypatch):
    key = keys.resolve_key(tiny.key_path)
    out = tmp_path / "m" / "h200.toml"
    keys.write_signed(_manifest(tiny, 1.0), key, out)
    before = _snapshot(out.parent)
    real = os.replace

    def replace(src, dst, *a, **kw):
        if Path(dst) == out:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(ForgeError, match=f"cannot write {out}: ") as err:
        keys.write_signed(_manifest(tiny, 2.0), key, out)
    monkeypatch.undo()
    assert _one_line(err.value)
    assert _snapshot(out.parent) == before
    assert read_verified(out, signing.load_trusted([tiny.pub])).qualification_seconds == 1.0


def test_first_write_failing_leaves_nothing(tiny, tmp_path, monkeypatch):
    key = keys.resolve_key(tiny.key_path)
    out = tmp_path / "m" / "h200.toml"
    _fail_on_call(monkeypatch, 3)  # the public key, the table, then the manifest
    with pytest.raises(ForgeError, match="No space left"):
        keys.write_signed(_manifest(tiny, 1.0), key, out)
    assert list(out.parent.iterdir()) == []


def test_cli_full_disk_is_one_line_exit_2(capsys, tiny, fake_gpu, tmp_path, monkeypatch):
    out = tmp_path / "m.toml"
    _fail_on_call(monkeypatch, 2)
    rc, _, err = _qualify(capsys, tiny, "--sign-key", tiny.key_path, "--out", out)
    assert rc == 2 and _one_error_line(err) and "cannot write" in err, err
    assert fake_gpu.calls == 1 and not out.exists() and not runtime_table_path(out).exists()
