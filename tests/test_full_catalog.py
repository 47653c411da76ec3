"""The built-in catalog, built the way the README's first command builds it: every default target, every
reference symbol name present and statically admitted, and a no-change rebuild under a second."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.catalog.targets import DEFAULT_TARGETS, get_target
from mamba_forge.core.schema import BuildManifest

DATA = Path(__file__).parent / "data"
FIXED_NAMES = (DATA / "reference-fixed-symbols.txt").read_text().split()
GEMM_NAMES = (DATA / "reference-gemm-symbols.txt").read_text().split()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> Path:
    env = os.environ.get("MAMBA_FORGE_CACHE")
    if env and env not in ("0", "off") and os.path.isabs(env):
        return Path(env)  # CI shares one cache across the run
    d = tmp_path_factory.mktemp("cache") / "c"
    d.mkdir(mode=0o700)
    return d


@pytest.fixture(scope="module")
def full_build(tmp_path_factory, cache_dir) -> tuple[BuildManifest, BuildRequest]:
    req = BuildRequest(load_catalog(default_catalog_path()), [get_target(t) for t in DEFAULT_TARGETS],
                       tmp_path_factory.mktemp("full"), cache_location=cache_dir)
    return build(req), req


def admitted_on(m: BuildManifest, target: str) -> dict[str, str]:
    return {s.name: s.verdict.status for mod in m.modules if mod.target == target for s in mod.symbols}


def test_every_mandatory_module_compiles_for_every_default_target(full_build):
    m, _ = full_build
    assert m.failed_mandatory() == []
    assert {t for mod in m.modules for t in [mod.target]} == set(DEFAULT_TARGETS)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_every_fixed_reference_symbol_is_admitted(full_build, target):
    got = admitted_on(full_build[0], target)
    missing = [n for n in FIXED_NAMES if n not in got]
    rejected = [n for n in FIXED_NAMES if got.get(n) == "rejected"]
    assert not missing, f"{len(missing)} reference Fixed names not built: {missing[:10]}"
    assert not rejected, f"{len(rejected)} rejected on {target}: {rejected[:10]}"


def test_every_reference_gemm_name_is_built_for_its_architecture(full_build):
    m, _ = full_build
    by_name: dict[str, list[str]] = {}
    for mod in m.modules:
        for s in mod.symbols:
            by_name.setdefault(s.name, []).append(mod.target)
    missing = [n for n in GEMM_NAMES if n not in by_name]
    assert not missing, f"{len(missing)} reference GEMM names not built: {missing[:10]}"
    for name in GEMM_NAMES:
        for arch, target in (("sm90a", "sm_90a"), ("sm89", "sm_89"), ("sm120", "sm_120a"), ("sm100", "sm_100a")):
            if f"_{arch}_" in name:
                assert target in by_name[name], f"{name} names {arch} but is not built for {target}"


def test_no_change_rebuild_is_under_a_second(full_build, tmp_path):
    _, req = full_build
    again = BuildRequest(req.catalog, req.targets, req.out, cache_location=req.cache_location)
    times = []
    for _ in range(3):  # the best of three: the 2-core CI machine runs another test's compiles beside this one
        t0 = time.perf_counter()
        m = build(again)
        times.append(time.perf_counter() - t0)
        assert all(mod.cached for mod in m.modules)
    assert min(times) < 1.0, f"no-change rebuild took {min(times):.2f}s at best of {[round(t, 2) for t in times]}"
