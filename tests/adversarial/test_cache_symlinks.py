"""A build cache whose folders are swapped for symlinks (the root, `v1`, a shard, `locks`, a lock file; before a
build or during one) is never written through or read from: a warning, no cache, the build goes on. A poisoned
cache is never served: `v1` linked to a foreign folder holding a forged entry, or an entry whose parts hash
correctly but that is not a compile result (no parts, an empty or foreign cubin, a cubin for another SM, metadata
of another shape) is a miss and a rebuild with a warning. A cache path that cannot be used at all (an over-long
name) is a warning, not a traceback."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from mamba_forge.build.builder import BuildRequest, build, plan
from mamba_forge.build.cubin import elf_problem
from mamba_forge.build.worker import entry_problem
from mamba_forge.catalog.model import load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.core import cache as cache_mod
from mamba_forge.core.cache import Cache, CacheRefused, _encode

BASIC = Path(__file__).resolve().parent.parent / "fixtures" / "build_basic" / "catalog.toml"
KEY = "ab" * 32
PARTS = {"cubin": b"c" * 64, "meta": b"{}"}


def private(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(folder.rglob("*"))}


def _plant(root: Path, component: str, kind: str, foreign: Path) -> None:
    """Put a symlink (to a foreign folder, dangling, or to a file) or a plain file where `component` goes."""
    path = {"v1": root / "v1", "shard": root / "v1" / KEY[:2], "locks": root / "v1" / "locks",
            "lockfile": root / "v1" / "locks" / f"{KEY}.lock"}[component]
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if kind == "foreign-dir":
        path.symlink_to(foreign, target_is_directory=True)
    elif kind == "dangling":
        path.symlink_to(foreign / "nothing-here")
    elif kind == "to-file":
        (foreign / "victim").write_bytes(b"victim")
        path.symlink_to(foreign / "victim")
    else:
        path.write_bytes(b"not a folder")


COMPONENTS = ["v1", "shard", "locks", "lockfile"]
KINDS = ["foreign-dir", "dangling", "to-file", "plain-file"]
OPS = ["put", "get", "lock"]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("component", COMPONENTS)
def test_a_swapped_component_is_never_written_through(tmp_path, component, kind, op):
    foreign = private(tmp_path / "foreign")
    (foreign / KEY[:2]).mkdir()
    (foreign / "locks").mkdir()
    root = private(tmp_path / "cache")
    _plant(root, component, kind, foreign)
    before = snapshot(foreign)
    cache = Cache(root)
    uses_component = component in {"put": ("v1", "shard"), "get": ("v1", "shard"), "lock": ("v1", "locks", "lockfile")}[op]
    if component == "lockfile" and kind == "plain-file":
        uses_component = False  # the control: a lock file is a plain file, and locking it is fine
    if op == "put":
        warning = cache.put(KEY, PARTS)
        assert (warning is not None) == uses_component
    elif op == "get":
        assert cache.get(KEY) is None
        assert bool(cache.warnings) == uses_component
    else:
        if uses_component:
            with pytest.raises(OSError):
                with cache.lock(KEY):
                    pass
        else:
            with cache.lock(KEY):
                pass
    assert snapshot(foreign) == before  # nothing written, renamed or removed in the foreign folder
    if kind in ("foreign-dir", "dangling", "to-file"):
        assert Path(root, *{"v1": ["v1"], "shard": ["v1", KEY[:2]], "locks": ["v1", "locks"],
                            "lockfile": ["v1", "locks", f"{KEY}.lock"]}[component]).is_symlink()


@pytest.mark.parametrize("component", ["v1", "shard"])
def test_a_get_through_a_linked_folder_warns(tmp_path, component):
    foreign = private(tmp_path / "foreign")
    good = Cache(private(tmp_path / "good"))
    assert good.put(KEY, PARTS) is None  # a well-formed entry for KEY, in the foreign folder
    src = tmp_path / "good" / "v1"
    root = private(tmp_path / "cache")
    if component == "v1":
        (root / "v1").symlink_to(src)
    else:
        (root / "v1").mkdir(mode=0o700)
        (root / "v1" / KEY[:2]).symlink_to(src / KEY[:2])
    cache = Cache(root)
    assert cache.get(KEY) is None and cache.warnings and "symlink" in cache.warnings[0]
    assert not cache.has(KEY)
    del foreign


@pytest.mark.parametrize("component", ["v1", "shard", "locks", "lockfile"])
def test_a_component_swapped_during_the_build_is_not_written_through(tmp_path, component, monkeypatch):
    """The first compile goes through the cache as usual; then the component is swapped for a link to a foreign
    folder (as another process could); the rest of the build writes nothing there and ends compiled, with a
    warning when it needed the swapped folder."""
    foreign = private(tmp_path / "foreign")
    root = private(tmp_path / "cache")
    cat = load_catalog(BASIC)
    req = BuildRequest(cat, [get_target("sm_80"), get_target("sm_90a")], tmp_path / "out", jobs=1,
                       cache_location=root)
    keys = [j.key for j in plan(req)]
    real_put = Cache.put
    swapped = []

    def put_then_swap(self, key, parts):
        out = real_put(self, key, parts)
        if not swapped:
            target = {"v1": root / "v1", "shard": root / "v1" / keys[1][:2], "locks": root / "v1" / "locks",
                      "lockfile": root / "v1" / "locks" / f"{keys[1]}.lock"}[component]
            if target.is_dir():
                os.rename(target, tmp_path / "moved-away")
            elif target.exists():
                target.unlink()
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(foreign, target_is_directory=True)
            swapped.append(target)
        return out

    monkeypatch.setattr(Cache, "put", put_then_swap)
    bm = build(req)
    assert [m.status for m in bm.modules] == ["compiled", "compiled"] and swapped
    assert snapshot(foreign) == {}
    assert any("build cache" in w for w in req.warnings)
    assert (tmp_path / "out" / "sm_90a" / "Basic.cubin").is_file()


def test_a_linked_cache_root_is_refused_with_a_warning(tmp_path):
    real = private(tmp_path / "real")
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(CacheRefused, match="symlinked component"):
        Cache.open(tmp_path / "link")


@pytest.mark.parametrize("length", [256, 300, 4000, 5000])
def test_an_over_long_cache_path_is_a_warning_not_a_traceback(tmp_path, length):
    location = tmp_path / ("x" * length) / "cache" if length < 4096 else Path("/" + "/".join(["y" * 200] * (length // 200)))
    with pytest.raises(CacheRefused, match="cannot be used|symlink|not a folder"):
        Cache.open(location)


def test_an_over_long_cache_path_builds_without_a_cache(tmp_path):
    req = BuildRequest(load_catalog(BASIC), [get_target("sm_80")], tmp_path / "out", jobs=1,
                       cache_location=tmp_path / ("z" * 300))
    bm = build(req)
    assert bm.modules[0].status == "compiled"
    assert req.warnings and "build cache disabled" in req.warnings[0] and "File name too long" in req.warnings[0]


# ---- poisoned entries ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """One real compile result for sm_80 and its cache key (the Basic fixture)."""
    root = tmp_path_factory.mktemp("good")
    cache_root = private(root / "cache")
    req = BuildRequest(load_catalog(BASIC), [get_target("sm_80")], root / "out", jobs=1, cache_location=cache_root)
    bm = build(req)
    key = bm.modules[0].cache_key
    parts = Cache(cache_root).get(key)
    parts = {k: v for k, v in parts.items() if not k.startswith("sha256.")}
    return key, parts, (root / "out" / "sm_80" / "Basic.cubin").read_bytes()


def _elf(machine=190, cls=2, sm=80, abi=8, size=64) -> bytes:
    head = bytearray(size)
    head[:4] = b"\x7fELF"
    head[4], head[5], head[7], head[8] = cls, 1, 0x41, abi
    struct.pack_into("<H", head, 18, machine)
    struct.pack_into("<I", head, 48, (sm << 8 | 4) if abi >= 7 else sm)
    return bytes(head)


def _meta(**changes) -> bytes:
    meta = {"ok": True, "kernels": {}, "ptxas": {}, "float_atomics": {}, "float_atomics_funcs": [],
            "order_tokens": {}, "order_tokens_funcs": []}
    meta.update(changes)
    return json.dumps({k: v for k, v in meta.items() if v is not ...}).encode()


POISON = {
    "no-parts": lambda g: {},
    "no-meta": lambda g: {k: v for k, v in g.items() if k != "meta"},
    "no-cubin": lambda g: {k: v for k, v in g.items() if k != "cubin"},
    "no-ptx": lambda g: {k: v for k, v in g.items() if k != "ptx"},
    "no-log": lambda g: {k: v for k, v in g.items() if k != "log"},
    "empty-cubin": lambda g: dict(g, cubin=b""),
    "text-cubin": lambda g: dict(g, cubin=b"not an elf file at all, just text " * 4),
    "elf32": lambda g: dict(g, cubin=_elf(cls=1)),
    "x86-64-elf": lambda g: dict(g, cubin=_elf(machine=62)),
    "sm_90-cubin": lambda g: dict(g, cubin=_elf(sm=90)),
    "sm_120-cubin": lambda g: dict(g, cubin=_elf(sm=120)),
    "truncated-elf": lambda g: dict(g, cubin=g["cubin"][:40]),
    "meta-not-json": lambda g: dict(g, meta=b"{not json"),
    "meta-a-list": lambda g: dict(g, meta=b"[]"),
    "meta-failed": lambda g: dict(g, meta=_meta(ok=False)),
    "meta-no-kernels": lambda g: dict(g, meta=_meta(kernels=...)),
    "meta-kernels-a-list": lambda g: dict(g, meta=_meta(kernels=[])),
    "meta-ok-a-string": lambda g: dict(g, meta=_meta(ok="yes")),
}


@pytest.mark.parametrize("name", sorted(POISON))
def test_a_hashed_but_poisoned_entry_is_refused(tmp_path, good, name):
    key, parts, _ = good
    cache = Cache(private(tmp_path / "c"))
    assert cache.put(key, POISON[name](parts)) is None  # hashes correctly: only the content check can refuse it
    assert cache.get(key) is not None  # the control: served without the check
    assert cache.get(key, accept=lambda p: entry_problem(p, 80)) is None
    assert cache.stats.corrupted == 1 and cache.warnings and not cache.has(key)


@pytest.mark.parametrize("name", ["no-parts", "empty-cubin", "sm_90-cubin", "meta-not-json", "no-meta"])
def test_a_poisoned_entry_is_rebuilt_by_the_build(tmp_path, good, name):
    key, parts, real_cubin = good
    root = private(tmp_path / "c")
    Cache(root).put(key, POISON[name](parts))
    req = BuildRequest(load_catalog(BASIC), [get_target("sm_80")], tmp_path / "out", jobs=1, cache_location=root)
    bm = build(req)
    (mod,) = bm.modules
    assert mod.status == "compiled" and not mod.cached and mod.cache_key == key
    assert (tmp_path / "out" / "sm_80" / "Basic.cubin").read_bytes() == real_cubin
    assert any("refused" in w for w in req.warnings)
    assert Cache(root).get(key, accept=lambda p: entry_problem(p, 80)) is not None  # rewritten whole


def test_a_forged_entry_in_a_linked_v1_is_not_served(tmp_path, good):
    key, parts, real_cubin = good
    forged = dict(parts, cubin=real_cubin[:-1] + bytes([real_cubin[-1] ^ 1]))
    foreign = private(tmp_path / "foreign")
    Cache(foreign).put(key, forged)  # a valid entry for the key, in somebody else's folder
    root = private(tmp_path / "c")
    (root / "v1").symlink_to(foreign / "v1")
    req = BuildRequest(load_catalog(BASIC), [get_target("sm_80")], tmp_path / "out", jobs=1, cache_location=root)
    before = snapshot(foreign)
    bm = build(req)
    assert not bm.modules[0].cached
    assert (tmp_path / "out" / "sm_80" / "Basic.cubin").read_bytes() == real_cubin
    assert snapshot(foreign) == before and req.warnings


def test_the_real_cubins_pass_the_elf_check(good):
    _, parts, real = good
    assert elf_problem(real, 80) is None and entry_problem(parts, 80) is None
    assert "sm_80, not sm_90" in elf_problem(real, 90)


def test_the_encoding_is_what_the_cache_reads(tmp_path):
    cache = Cache(private(tmp_path / "c"))
    blob = _encode(PARTS, KEY)
    p = cache._path(KEY)
    p.parent.mkdir(parents=True, mode=0o700)
    p.write_bytes(blob)
    assert cache.get(KEY)["cubin"] == PARTS["cubin"]
    assert cache_mod.MAGIC in blob
