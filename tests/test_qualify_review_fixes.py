"""Review fixes of the qualifier, on the CPU emulation of test_qualify_emulated.py: each flawed kernel (or catalog
entry) that used to be admitted is now rejected, and its correct control is still admitted."""

from __future__ import annotations

import json
import shutil
import sys
import textwrap

import numpy as np
import pytest
import test_qualify_emulated as T
from pydantic import ValidationError
from test_qualify_cpu import _groups, fake_worker_script
from test_qualify_emulated import emulated  # noqa: F401 - the emulated driver fixture, by name

from mamba_forge.catalog.entries import QualifySpec
from mamba_forge.catalog.model import load_catalog
from mamba_forge.core.errors import ForgeError
from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import guards as G
from mamba_forge.qualify import outputs as O
from mamba_forge.qualify import placement as P
from mamba_forge.qualify import spec as S
from mamba_forge.qualify import supervise
from mamba_forge.qualify import worker as W

SCALE2 = 'qualify = { dims = { n = 4096 }, reference = "qneg_refs:scale2" }'
ROWS = 'dims = { rows = 512, cols = 1024 }, reference = "qneg_refs:row_sum", batch_dim = "rows"'
f32 = np.float32


def _catalog(tmp_path, edit=lambda t: t):
    d = tmp_path / "fx"
    shutil.copytree(T.FIXTURE, d)
    p = d / "negative.toml"
    text = p.read_text()
    p.write_text(edit(text))
    return load_catalog(d / "catalog.toml")


def _run(ctx, cat, name):
    job = {"seed": 5, "level": "quick"}
    group = {"module": "QualifyNegative", "target": "sm_90a"}
    return W.SymbolRun(ctx, cat, T.FakeModule(), job, {"name": name, "build_layout": []}, group).run()


def _check(r, name):
    return next(c for c in r.checks if c.name == name)


def _scale2_kernel(monkeypatch, body):
    """wrong_scale's launches run `body(x, y, n)` instead (y a writable view of the output)."""
    real = T.run_kernel

    def kernel(name, v, mem, rng, stream):
        if name != "wrong_scale":
            return real(name, v, mem, rng, stream)
        y_p, x_p, n = v
        x = mem.view(x_p, f32, n)
        y = np.frombuffer(mem.at(y_p)[0], f32, n, mem.at(y_p)[1])
        body(x, y, n)
    monkeypatch.setattr(T, "run_kernel", kernel)


# ---- 1. tolerances must be finite ------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["nan", "inf", "-1e-3", "2.0"])
def test_a_non_finite_or_absurd_tolerance_is_refused_by_the_catalog(tmp_path, bad):
    with pytest.raises((ForgeError, ValidationError, ValueError), match="tolerance"):
        _catalog(tmp_path, lambda t: t.replace(SCALE2, SCALE2[:-2] + f", rtol = {bad} }}"))
    with pytest.raises(ValidationError, match="finite"):
        QualifySpec.model_validate({"atol": float(bad)})


def test_compare_fails_a_non_finite_limit_and_passes_a_finite_one():
    got, ref = np.array([1.0, 100.0]), np.array([2.0, 0.0])
    for rtol, atol in ((float("nan"), 1e-6), (1e-3, float("inf")), (-1.0, 0.0)):
        ok, detail = O.compare(got, ref, "f32", rtol, atol, False)
        assert not ok and "tolerance" in detail
    assert O.compare(ref, ref, "f32", 1e-5, 1e-6, False)[0]


def test_a_finite_tolerance_still_loads_and_qualifies(emulated, tmp_path, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path, lambda t: t.replace(SCALE2, SCALE2[:-2] + ", rtol = 1e-5, atol = 1e-6 }"))
    _scale2_kernel(monkeypatch, lambda x, y, n: y.__setitem__(slice(None), 2 * x))
    r = _run(ctx, cat, "wrong_scale")
    assert r.status == "admitted", r.reason


# ---- 2. an unwritten element is not excused by a NaN reference -------------------------------------------------


def test_check_outputs_exempts_poison_bytes_only_where_the_other_poison_run_agrees(emulated, tmp_path):  # noqa: F811
    cat = _catalog(tmp_path)
    sym = cat.symbols["wrong_scale"]
    spec = S.evaluate(sym, cat.module(sym.module).family(sym.family))
    ref = {"y": np.full(4096, np.nan)}
    first = {"y": bytes([G.POISON]) * 4 * 4096}
    unwritten = {"y": bytes([G.POISON_ALT]) * 4 * 4096}
    ok, detail = O.check_outputs(spec, first, ref, unwritten)
    assert not ok and "not written" in detail
    assert O.check_outputs(spec, first, ref, first)[0]  # the kernel wrote 0xFFFFFFFF NaNs both times


def test_a_kernel_skipping_nan_inputs_is_rejected_as_not_written(emulated, tmp_path, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path, lambda t: t.replace(SCALE2, SCALE2[:-2] + ", nonfinite = true }"))

    def skip(x, y, n):
        ok = ~np.isnan(x)
        y[ok] = 2 * x[ok]  # never writes the outputs of NaN inputs
    _scale2_kernel(monkeypatch, skip)
    r = _run(ctx, cat, "wrong_scale")
    assert r.status == "rejected" and r.check == "correctness" and "not written" in r.reason


def test_a_kernel_writing_all_ones_nans_is_admitted(emulated, tmp_path, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path, lambda t: t.replace(SCALE2, SCALE2[:-2] + ", nonfinite = true }"))

    def writes(x, y, n):
        y[:] = 2 * x
        y.view(np.uint32)[np.isnan(x)] = 0xFFFFFFFF  # a NaN whose bytes are the poison's
    _scale2_kernel(monkeypatch, writes)
    r = _run(ctx, cat, "wrong_scale")
    assert r.status == "admitted", r.reason


# ---- 3. a reference must name every output ---------------------------------------------------------------------


@pytest.mark.parametrize("keys, said", [({"Y"}, "'y'"), ({"y", "z"}, "'z'"), (set(), "'y'")])
def test_a_reference_missing_or_misnaming_an_output_fails_correctness(emulated, tmp_path, monkeypatch, keys, said):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path)
    import qneg_refs

    monkeypatch.setattr(qneg_refs, "scale2", lambda args, dims: {k: 2.0 * args["x"] for k in keys})
    r = _run(ctx, cat, "wrong_scale")
    assert r.status == "rejected" and r.check == "correctness" and said in r.reason and "reference" in r.reason


# ---- 4. the batch check must compare something -----------------------------------------------------------------


def test_a_batch_dim_of_one_is_a_spec_error(emulated, tmp_path):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path, lambda t: t.replace(ROWS, ROWS.replace("rows = 512", "rows = 1")))
    r = _run(ctx, cat, "control_row_sum")
    assert r.status == "rejected" and r.check == "spec" and "at least 2" in r.reason
    assert not any(c.name == "batch" and c.passed for c in r.checks)


def test_no_batch_size_to_compare_is_no_pass(emulated, tmp_path, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path)
    monkeypatch.setattr(S, "batch_sizes", lambda full: [])
    r = _run(ctx, cat, "control_row_sum")
    assert r.status == "rejected" and r.check == "batch" and not _check(r, "batch").passed


def test_a_batch_dim_of_two_still_qualifies(emulated, tmp_path):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path, lambda t: t.replace(ROWS, ROWS.replace("rows = 512", "rows = 2")))
    r = _run(ctx, cat, "control_row_sum")
    assert r.status == "admitted", r.reason
    assert _check(r, "batch").passed


# ---- 5. the graph check reads the replay's own outputs ---------------------------------------------------------


def test_a_graph_replay_that_runs_nothing_fails(emulated, tmp_path, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path)

    class NoopGraph(T.FakeGraph):
        def launch(self, stream):
            pass
    assert _run(ctx, cat, "control_row_sum").status == "admitted"  # the control, with a replaying graph
    monkeypatch.setattr(T.cu, "Graph", NoopGraph)
    r = _run(ctx, cat, "control_row_sum")
    assert r.status == "rejected" and r.check == "graph" and not _check(r, "graph").passed


# ---- 6. no placement run is no pass ------------------------------------------------------------------------------


def test_no_placement_run_is_recorded_as_not_passed(emulated, tmp_path, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path)
    assert _check(_run(ctx, cat, "control_row_sum"), "placement").passed  # the control: placements ran

    def refused():
        raise P.Unavailable("emulated: refused")
    monkeypatch.setattr(P, "placements", lambda *a: ([P.Placement("nowhere", refused)], []))
    r = _run(ctx, cat, "control_row_sum")
    pl = _check(r, "placement")
    assert not pl.passed and pl.detail.startswith("not run") and "refused" in pl.detail
    assert r.status == "admitted"  # not the symbol's rejection (placement.Unavailable), only no pass


# ---- 7. a non-sticky fault ends the worker -----------------------------------------------------------------------


def _worker_job(tmp_path, monkeypatch, ctx, names):
    class FakeDevice:
        def __init__(self, ordinal):
            self.ordinal = ordinal

        def info(self):
            return ctx.info

        def make_current(self):
            pass

    monkeypatch.setattr(cu, "Device", FakeDevice)
    monkeypatch.setattr(cu, "Stream", T.FakeStream)
    monkeypatch.setattr(cu, "Module", T.FakeModule)
    monkeypatch.setattr(W.P, "DevicePlacer", T.FakePlacer)
    (tmp_path / "sm_90a").mkdir()
    (tmp_path / "sm_90a" / "QualifyNegative.cubin").write_bytes(b"\x7fELF")
    job = {"device": 0, "level": "quick", "seed": 1, "timeout_s": 1.0, "sanitize": False,
           "catalog": str(T.FIXTURE / "catalog.toml"), "build_dir": str(tmp_path),
           "groups": [{"module": "QualifyNegative", "target": "sm_90a", "role": "qualify",
                       "cubin": "sm_90a/QualifyNegative.cubin", "ptx": None,
                       "symbols": [{"name": n, "build_layout": []} for n in names]}]}
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    return path


def test_a_non_sticky_fault_ends_the_worker_before_the_next_symbol(emulated, tmp_path, monkeypatch, capsys):  # noqa: F811
    ctx, _ = emulated
    real = T.run_kernel

    def kernel(name, v, mem, rng, stream):
        if name == "wrong_scale":
            raise cu.CudaError("emulated launch", "CUDA_ERROR_INVALID_VALUE")
        return real(name, v, mem, rng, stream)
    monkeypatch.setattr(T, "run_kernel", kernel)
    path = _worker_job(tmp_path, monkeypatch, ctx, ["wrong_scale", "control_row_sum"])
    assert W.main(["--job", str(path)]) == W.EXIT_FAULT
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events if e.get("symbol") == "wrong_scale"][-1] == "fault"
    assert not any(e.get("symbol") == "control_row_sum" for e in events)  # left for a fresh worker


def test_after_a_fault_the_supervisor_gives_the_next_symbol_a_fresh_worker(tmp_path):
    script = fake_worker_script(textwrap.indent(textwrap.dedent('''
        if n.startswith("softfault"):
            emit(event="fault", symbol=n, result="CUDA_ERROR_INVALID_VALUE", reason=n + ": launch failed")
            sys.exit(3)  # as worker.main now does after any fault
        if n.startswith("slow"):
            time.sleep(4)  # longer than supervise.EXIT_GRACE_S
        '''), " " * 8))
    p = tmp_path / "w.py"
    p.write_text(script)
    ws = supervise.WorkerSettings(tmp_path, T.FIXTURE / "catalog.toml", command=[sys.executable, str(p)], idle_s=30)
    out = supervise.run_groups(_groups(["softfault_a", "slow_b", "ok_c"]), ws)
    assert out.results["softfault_a"].check == "fault"
    assert out.results["slow_b"].status == "admitted" and out.results["ok_c"].status == "admitted"


# ---- 8. an unreproduced poison difference is said so --------------------------------------------------------------


def test_an_unreproduced_poison_difference_is_recorded_distinctly(emulated, tmp_path, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    cat = _catalog(tmp_path, lambda t: t.replace(SCALE2, SCALE2[:-2] + ', corpora = ["uniform"] }'))
    calls = [0]

    def flaky(x, y, n):  # y = 2x, its first element nudged by (launch count mod 3) ulps: nondeterministic
        y[:] = 2 * x
        for _ in range(calls[0] % 3):
            y[0] = np.nextafter(y[0], f32(np.inf))
        calls[0] += 1
    _scale2_kernel(monkeypatch, flaky)
    r = _run(ctx, cat, "wrong_scale")
    u = _check(r, "uninitialized")
    assert "did not reproduce" in u.detail and "bitwise equal" not in u.detail
    assert r.status == "rejected" and r.check == "repeat"


def test_poison_independent_outputs_are_recorded_bitwise_equal(emulated, tmp_path, monkeypatch):  # noqa: F811
    ctx, _ = emulated
    r = _run(ctx, _catalog(tmp_path), "control_row_sum")
    assert _check(r, "uninitialized").detail.startswith("outputs bitwise equal")

