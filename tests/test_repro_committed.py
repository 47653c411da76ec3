"""Reproducibility of the committed qualified manifests: rebuild their kernels on this (CPU) machine and compare
every artifact's sha256. A kernel change without a new qualification fails, naming the stale modules and
symbols and the command that re-qualifies them. The same check runs on a manifest made in a fixture, with the
negative case of a changed source."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from runtime_support import build_tiny, keypair, qualified_body, sign_body, write_tiny_catalog

from mamba_forge.report.diff import rebuild_and_compare, stale_message

ROOT = Path(__file__).resolve().parent.parent


def committed_manifests() -> list:
    out = [
        pytest.param(p, id=p.name)
        for p in sorted((ROOT / "manifests").glob("*.toml"))
        if tomllib.loads(p.read_text(encoding="utf-8")).get("kind") == "qualified"
    ]
    return out or [pytest.param(None, id="none", marks=pytest.mark.skip(reason="no qualified manifest committed in manifests/ yet"))]


@pytest.mark.parametrize("manifest", committed_manifests())
def test_committed_manifest_matches_a_fresh_build(manifest, tmp_path):
    body = tomllib.loads(manifest.read_text(encoding="utf-8"))
    stale = rebuild_and_compare(body, tmp_path / "build")
    assert not stale, stale_message(manifest.relative_to(ROOT), stale, body.get("level", "quick"))


def test_fixture_manifest_reproduces_and_a_source_change_is_named(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro")
    cat = write_tiny_catalog(root / "cat")
    cache = root / "cache"
    bm = build_tiny(cat, root / "build", cache)
    priv, _, _ = keypair(root / "keys", "k")
    body = tomllib.loads(sign_body(qualified_body(bm, cat), priv).decode())
    # a fresh build (other folder, through the cache) reproduces every artifact
    assert rebuild_and_compare(body, root / "again", catalog=cat, cache_location=cache) == []
    # the same check without any cache: NVRTC itself is deterministic for these options
    assert rebuild_and_compare(body, root / "cold", catalog=cat, cache_location=None) == []
    # change a kernel without re-qualifying: the module and its symbols are named
    src = cat.parent / "tiny.cu"
    src.write_text(src.read_text().replace("from_f32<T>(a * to_f32(x[i]))", "from_f32<T>(a * to_f32(x[i]) + 1.0f)"))
    stale = rebuild_and_compare(body, root / "changed", catalog=cat, cache_location=cache)
    assert [(s["module"], s["target"]) for s in stale if s["path"].endswith(".cubin")] == [("Tiny", "sm_90a")]
    cubin = next(s for s in stale if s["path"].endswith(".cubin"))
    assert "scale_bf16" in cubin["symbols"] and "slow_copy_f16" in cubin["symbols"]
    msg = stale_message("manifests/h200.toml", stale)
    assert msg.startswith("manifests/h200.toml is stale") and "Tiny on sm_90a" in msg and "scale_bf16" in msg
    assert "mamba-forge qualify --build build --level quick --out manifests/h200.toml" in msg


def test_a_module_that_no_longer_compiles_is_stale(tmp_path_factory):
    root = tmp_path_factory.mktemp("repro-broken")
    cat = write_tiny_catalog(root / "cat")
    bm = build_tiny(cat, root / "build", root / "cache")
    body = qualified_body(bm, cat)
    src = cat.parent / "tiny.cu"
    src.write_text(src.read_text() + "\nthis is not C++;\n")
    stale = rebuild_and_compare(body, root / "broken", catalog=cat, cache_location=None)
    assert {s["actual"] for s in stale} == {"failed to compile"} and len(stale) == len(body["artifacts"])
