"""The GPU harnesses cover what the catalog holds, checked without a GPU.

The whole GPU suite runs rarely (device time is scarce); in the eighteenth session its first full run in several
sessions found the scan harness (tests/gpu/test_scan.py) building only fixed/scan.toml while listing the token scans
too, giving the token-major fold an odd d_state its catalog rule refuses, and the elementwise harness
(tests/gpu/test_fixed_elementwise.py) without an odd shape for transpose_rows. These checks load the harnesses'
own tables and evaluate every launch they would make (qualify/spec.py is pure NumPy), so that drift fails CPU CI.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from mamba_forge.catalog.model import load_catalog
from mamba_forge.qualify import spec as S

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # gpu_support, which the harnesses import


def _harness(name: str):
    spec = importlib.util.spec_from_file_location(f"_harness_{name}", TESTS / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def scan():
    return _harness("test_scan")


@pytest.fixture(scope="module")
def scan_fixed(scan):
    """The Fixed module of the scan harness's own catalog (the files it builds)."""
    return load_catalog(scan.scan_catalog_path()).module("Fixed")


def test_the_scan_harness_builds_every_ssm_symbol_it_lists(scan, scan_fixed):
    built = {s.name for s in scan_fixed.symbols if s.name.startswith("ssm_")}
    assert set(scan.NAMES) == built, f"listed but not built: {sorted(set(scan.NAMES) - built)}"


def test_every_scan_harness_launch_evaluates_within_the_dims_rules(scan, scan_fixed):
    fams = {f.name: f for f in scan_fixed.families}
    for sym in scan_fixed.symbols:
        if sym.name not in scan.NAMES:
            continue
        fam = fams[sym.family]
        qual = S.evaluate(sym, fam)
        odd = scan._odd_dims(qual.dims, fam)
        S.evaluate(sym, fam, odd)  # raises SpecError where a dims rule or the contract refuses the shape
        for k, hi in fam.requires.at_most.items():
            assert odd.get(k, 0) <= hi, (sym.name, k)
        for k, m in fam.requires.multiple_of.items():
            assert odd.get(k, 0) % m == 0, (sym.name, k)


def test_the_odd_shape_the_scan_harness_once_used_is_refused(scan_fixed):
    """Negative: d_state 35 at the token-major fold (its kernel stages 16 states) is refused when evaluated."""
    sym = next(s for s in scan_fixed.symbols if s.name == "ssm_parallel_scan_bwd_fold_tokens_bf16")
    fam = next(f for f in scan_fixed.families if f.name == sym.family)
    dims = {**S.evaluate(sym, fam).dims, "batch": 3, "d_inner": 24, "d_state": 35, "L": 523}
    with pytest.raises(S.SpecError, match="at most 16"):
        S.evaluate(sym, fam, dims)


def test_the_elementwise_harness_has_an_odd_shape_for_every_family():
    ew = _harness("test_fixed_elementwise")
    missing = sorted(f.name for f in ew.FAMILIES.values() if tuple(sorted(f.qualify.dims)) not in ew.ODD)
    assert not missing, f"no odd shape for {missing}"
    for sym in ew.SYMBOLS:
        S.evaluate(sym, ew.FAMILIES[sym.family], ew.odd_dims(ew.FAMILIES[sym.family]))
