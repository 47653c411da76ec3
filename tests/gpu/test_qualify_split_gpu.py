"""The split check on the GPU (mamba_forge/qualify/split.py).

* the negative control (tests/fixtures/qualify_negative, module QualifySplit, built alone for the attached GPU)
  through the worker on the device, on several seeds: the running sum whose first position of each call is an fma
  is rejected by the split check, and by it alone, on every run; the correct running sum is admitted with a
  passing split check whose digest is its repeat check's;
* the built-in token families (ssm_scan_tokens, conv1d_tokens_silu: every dtype) through the qualifier itself
  (runner, worker subprocesses): admitted, each with a passing split check over its declared chunks.

    python -m pytest -q -m gpu tests/gpu/test_qualify_split_gpu.py
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from mamba_forge.build.builder import BuildRequest, build
from mamba_forge.catalog.model import default_catalog_path, load_catalog
from mamba_forge.catalog.targets import get_target
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import checks as C
from mamba_forge.qualify import plan, runner
from mamba_forge.qualify import worker as W
from mamba_forge.report.classes import reason_class

pytestmark = pytest.mark.gpu

NEGATIVE = Path(__file__).resolve().parent.parent / "fixtures" / "qualify_negative" / "catalog.toml"
TOKEN_FAMILIES = ("ssm_scan_tokens", "conv1d_tokens_silu")
REJECTED = re.compile(r"^split_variant_running_sum: called over chunks of L = \d+ \(\d+ calls carrying state\): "
                      r"(out|the final state) differs at batch row \d+, (position \d+, )?element \d+: \S+ \(0x[0-9a-f]{8}\) "
                      r"chunked, \S+ \(0x[0-9a-f]{8}\) in one call \(\d+ of \d+ elements differ\); its bits depend "
                      r"on how a sequence is split into calls$")


def _target() -> str:
    info = cu.Device(0).info()
    return sorted(plan.device_targets(info.cc), key=lambda t: not t.endswith("a"))[0]


@pytest.fixture(scope="module")
def split_module(tmp_path_factory):
    """(context, the QualifySplit module loaded from its cubin, catalog, target)."""
    target = _target()
    if str(NEGATIVE.parent) not in sys.path:  # its references (qneg_refs.py), as the worker's main() adds them
        sys.path.append(str(NEGATIVE.parent))
    out = tmp_path_factory.mktemp("split-build")
    cat = load_catalog(NEGATIVE)
    bm = build(BuildRequest(cat, [get_target(target)], out, cache_location=None, modules=("QualifySplit",)))
    mod = next(m for m in bm.modules if m.kind == "QualifySplit" and m.target == target)
    assert mod.status == "compiled", mod.log_head
    cubin = next(a for a in mod.artifacts if a.code == "cubin")
    dev = cu.Device(0)
    ctx = C.Context(dev, dev.info(), timeout_s=20.0)
    ctx.open()
    return ctx, cu.Module((out / cubin.path).read_bytes()), cat, target


def _run(split_module, name: str, seed: int):
    ctx, module, cat, target = split_module
    return W.SymbolRun(ctx, cat, module, {"seed": seed, "level": "quick"}, {"name": name, "build_layout": []},
                       {"module": "QualifySplit", "target": target}).run()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_the_fma_twin_is_rejected_by_the_split_check_on_every_run(split_module, seed):
    r = _run(split_module, "split_variant_running_sum", seed)
    assert (r.status, r.check, reason_class(r.check)) == ("rejected", "split", "split-variant"), f"[{r.check}] {r.reason}"
    assert REJECTED.match(r.reason), r.reason
    assert [c.name for c in r.checks if not c.passed] == ["split"]  # correct, deterministic, batch-invariant...
    assert {"correctness", "repeat", "placement", "batch", "stream", "address", "graph"} <= {c.name for c in r.checks}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_control_is_admitted_with_a_passing_split_check(split_module, seed):
    r = _run(split_module, "control_split_running_sum", seed)
    assert r.status == "admitted", f"[{r.check}] {r.reason}"
    rec = next(c for c in r.checks if c.name == "split")
    assert rec.passed and rec.detail.startswith("out, state bitwise equal to one call over L = 37 when called over "
                                                "chunks of 1 (37 calls), 5 (8 calls), 16 (3 calls)"), rec.detail
    assert rec.digest == next(c for c in r.checks if c.name == "repeat").digest


def test_the_token_families_pass_the_split_check(tmp_path):
    """Through the qualifier itself: the token symbols of the Fixed module, built alone, qualified at quick level."""
    cat = load_catalog(default_catalog_path())
    target = _target()
    bm = build(BuildRequest(cat, [get_target(target)], tmp_path, modules=("Fixed",),
                            kernels=tuple(f"{f}_*" for f in TOKEN_FAMILIES)))
    req = runner.QualifyRequest(build_dir=tmp_path, build=bm, catalog=cat, devices=[0], level="quick",
                                only_modules={"Fixed"})
    syms = [s for s in runner.qualify(req).manifest.symbols if s.family in TOKEN_FAMILIES and s.target == target]
    assert sorted(s.name for s in syms) == sorted(f"{f}_{t}" for f in TOKEN_FAMILIES for t in ("f32", "bf16", "f16"))
    for s in syms:
        assert s.status == "admitted", f"{s.name}: [{s.check}] {s.reason}"
        rec = next((c for c in s.checks if c.name == "split"), None)
        assert rec is not None and rec.passed, f"{s.name}: {rec}"
        split = cat.module("Fixed").family(s.family).split
        assert "bitwise equal to one call over L = " in rec.detail, rec.detail
        assert all(f" {c} (" in rec.detail for c in split.chunks), rec.detail
        assert rec.digest == next(c for c in s.checks if c.name == "repeat").digest
        print(f"{s.name}: {rec.detail}")
