"""`mamba-forge env` and `mamba-forge cache dir|size|clean|prune`: exact outcomes, LRU order, refusals, and
symlinks never followed nor removed."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from pathlib import Path

import pytest

from mamba_forge.cli import main
from mamba_forge.cli_env import ENV_VARS
from mamba_forge.core.cache import Cache

PKG = Path(__file__).resolve().parent.parent / "mamba_forge"
KEYS = [f"{i:02x}" + f"{i:062x}" for i in range(1, 6)]


def run(capsys, *argv):
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    root.chmod(0o700)
    monkeypatch.setenv("MAMBA_FORGE_CACHE", str(root))
    monkeypatch.delenv("MAMBA_FORGE_CACHE_MAX", raising=False)
    c = Cache(root)
    for i, k in enumerate(KEYS):  # entry i last used at t0 + i: KEYS[0] is the least recently used
        assert c.put(k, {"cubin": bytes(1000)}) is None
        os.utime(c._path(k), (1_000_000 + i, 1_000_000 + i))
    return c


def entry_size(c: Cache) -> int:
    return c._path(KEYS[0]).stat().st_size


def test_dir_and_size(cache, capsys):
    assert run(capsys, "cache", "dir") == (0, f"{cache.root}\n", "")
    rc, out, _ = run(capsys, "cache", "size", "--json")
    assert rc == 0 and json.loads(out)["result"] == {"path": str(cache.root), "bytes": 5 * entry_size(cache), "entries": 5}


def test_prune_removes_least_recently_used_first(cache, capsys):
    size = entry_size(cache)
    rc, out, _ = run(capsys, "cache", "prune", "--max-size", str(3 * size), "--json")
    assert rc == 0
    assert json.loads(out)["result"]["removed_entries"] == 2 and json.loads(out)["result"]["entries"] == 3
    assert [cache._path(k).exists() for k in KEYS] == [False, False, True, True, True]


def test_a_hit_renews_an_entry_so_prune_keeps_it(cache, capsys, monkeypatch):
    assert cache.get(KEYS[0]) is not None  # KEYS[0] is now the most recently used
    assert cache._path(KEYS[0]).stat().st_mtime > time.time() - 60
    monkeypatch.setenv("MAMBA_FORGE_CACHE_MAX", str(entry_size(cache)))
    assert run(capsys, "cache", "prune")[0] == 0
    assert [cache._path(k).exists() for k in KEYS] == [True, False, False, False, False]


def test_clean_keeps_the_folder_its_mode_and_the_locks(cache, capsys):
    with cache.lock(KEYS[0]):
        pass
    rc, out, _ = run(capsys, "cache", "clean")
    assert rc == 0 and out.startswith("removed 5 entries")
    assert not any(cache._path(k).exists() for k in KEYS)
    assert stat.S_IMODE(cache.root.stat().st_mode) == 0o700
    assert (cache.entries / "locks" / f"{KEYS[0]}.lock").exists()
    assert run(capsys, "cache", "size")[1].startswith("0 bytes in 0 entries")


def test_symlinks_are_neither_followed_nor_removed(cache, capsys, tmp_path):
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / ("ab" + "0" * 62)
    victim.write_bytes(b"precious")
    # a symlinked entry, and a symlinked shard folder pointing at the victim's folder
    link_key = "cd" + "1" * 62
    (cache.entries / "cd").mkdir()
    os.symlink(victim, cache.entries / "cd" / link_key)
    os.symlink(victim_dir, cache.entries / "ab")
    rc, out, _ = run(capsys, "cache", "size", "--json")
    assert json.loads(out)["result"]["entries"] == 5
    assert run(capsys, "cache", "clean")[0] == 0
    assert victim.read_bytes() == b"precious"
    assert (cache.entries / "cd" / link_key).is_symlink()


def test_unsafe_folder_is_refused(cache, capsys):
    cache.root.chmod(0o755)
    rc, out, err = run(capsys, "cache", "clean")
    assert (rc, out) == (2, "") and err.startswith("error: refusing to remove anything: cache folder")
    assert all(cache._path(k).exists() for k in KEYS)
    assert run(capsys, "cache", "prune", "--max-size", "0")[0] == 2


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["cache", "prune"], {}, "error: cache prune needs a size cap"),
        (["cache", "prune", "--max-size", "lots"], {}, "error: --max-size 'lots' is not a size"),
        (["cache", "prune"], {"MAMBA_FORGE_CACHE_MAX": "-5"}, "error: MAMBA_FORGE_CACHE_MAX '-5' is not a size"),
        (["cache", "dir"], {"MAMBA_FORGE_CACHE": "off"}, "error: the build cache is disabled"),
        (["cache", "clean"], {"MAMBA_FORGE_CACHE": "relative/path"}, "is not an absolute path"),
    ],
)
def test_bad_input_is_one_line(cache, capsys, monkeypatch, argv, env, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, out, err = run(capsys, *argv)
    assert (rc, out) == (2, "") and len(err.strip().splitlines()) == 1 and message in err, err
    assert all(cache._path(k).exists() for k in KEYS)


def test_env_lists_every_variable_the_code_reads():
    # reads of the process environment: os.environ lookups, `env.get` in the functions handed os.environ
    # (cache location, target choice), and the *_ENV name constants; writes for child processes do not count
    read = set()
    for py in PKG.rglob("*.py"):
        text = py.read_text()
        read |= set(re.findall(r"""os\.environ(?:\.get\(|\.setdefault\(|\[)\s*["']([A-Z_]+)["']""", text))
        read |= set(re.findall(r"""\benv\.get\(\s*["']((?:MAMBA_FORGE|XDG|HOME|CUDA|TORCH)[A-Z_]*)["']""", text))
        read |= set(re.findall(r"""^[A-Z_]+_ENV\s*=\s*["']([A-Z_]+)["']""", text, re.M))
    assert {"MAMBA_FORGE_CACHE", "XDG_CACHE_HOME", "MAMBA_FORGE_TRUST", "MAMBA_FORGE_ARCH"} <= read
    assert read <= set(ENV_VARS), sorted(read - set(ENV_VARS))


def test_env_reports_without_a_gpu(cache, capsys, monkeypatch):
    monkeypatch.setenv("MAMBA_FORGE_SIGNING_KEY", "-----BEGIN PRIVATE KEY----- secret")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    monkeypatch.delenv("MAMBA_FORGE_ARCH", raising=False)
    rc, out, _ = run(capsys, "env", "--json")
    assert rc == 0
    report = json.loads(out)["result"]
    assert "secret" not in out
    assert report["environment"]["MAMBA_FORGE_SIGNING_KEY"] == {
        "set": True, "value": "(set, hidden)", "meaning": ENV_VARS["MAMBA_FORGE_SIGNING_KEY"]}
    assert report["targets"]["build"] == ["sm_80", "sm_90a"] and report["targets"]["source"] == "TORCH_CUDA_ARCH_LIST"
    assert report["cache"]["path"] == str(cache.root) and report["cache"]["safe"] is True
    assert report["cache"]["entries"] == 5
    assert any(k.get("origin") == "release" and "key_id" in k for k in report["trusted_keys"])
    assert report["catalog"].endswith("catalog.toml")
    assert set(report["driver"]) == {"version", "gpus", "note"}
    rc, out, _ = run(capsys, "env")
    assert rc == 0 and "secret" not in out and "TORCH_CUDA_ARCH_LIST='8.0;9.0a'" in out


def test_env_reports_an_unsafe_cache_instead_of_failing(cache, capsys):
    cache.root.chmod(0o750)
    rc, out, _ = run(capsys, "env", "--json")
    assert rc == 0 and json.loads(out)["result"]["cache"]["safe"] is False
