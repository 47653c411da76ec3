"""The watchdog on CPU: a launch budget that scales with the symbol's first launch (budget.py), enforced by the
worker's wait (against the emulated driver of test_qualify_emulated.py, with a fake clock), and the parent's
supervision that does not wait out its idle backstop when a worker that reported a hang is slow to exit."""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import pytest
from test_qualify_cpu import fake_worker_script
from test_qualify_emulated import FakeStream, _run, emulated  # noqa: F401 - the fixture is used by name

from mamba_forge.gpu import driver as cu
from mamba_forge.qualify import budget as B
from mamba_forge.qualify import checks as C
from mamba_forge.qualify import plan, runner, supervise
from mamba_forge.qualify.sanitize import TIME_FACTOR

NEGATIVE = Path(__file__).parent / "fixtures" / "qualify_negative" / "catalog.toml"


# ---- the budget ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("first", "limit"), [
    (0.0, 2.0),  # the floor
    (0.001, 2.0),  # 50 x 1 ms + 1 s = 1.05 s: the floor
    (0.02, 2.0),  # 50 x 20 ms + 1 s = 2 s
    (0.1, 6.0),
    (1.0, 51.0),
    (30.0, 1501.0),  # no exponent in the text
])
def test_the_scaled_budget_is_fifty_times_the_first_launch_plus_a_second_at_least_two(first, limit):
    b = B.LaunchBudget()
    assert b.limit == B.FIRST_LAUNCH_S
    b.observe(first)
    assert b.limit == pytest.approx(limit)
    b.observe(100.0)  # only the first launch sets it
    assert b.limit == pytest.approx(limit)
    assert f"the first launch's {B.seconds_text(first * 1e3)} ms" in b.describe()
    assert f"launch budget {B.seconds_text(limit)} s:" in b.describe() and "e+" not in b.describe()


def test_a_fixed_budget_holds_for_every_launch_and_says_where_it_comes_from():
    b = B.LaunchBudget(7.0, "--timeout")
    b.observe(0.001)
    assert b.limit == 7.0 and b.describe() == "launch budget 7 s, fixed by --timeout"
    f = B.LaunchBudget(5.0, "the family's timeout_s", scale=TIME_FACTOR)
    assert f.limit == 5.0 * TIME_FACTOR and "x20 under compute-sanitizer" in f.describe()


def test_under_the_sanitizer_every_figure_scales():
    b = B.LaunchBudget(scale=TIME_FACTOR)
    assert b.limit == B.FIRST_LAUNCH_S * TIME_FACTOR
    b.observe(0.001)
    assert b.limit == B.FLOOR_S * TIME_FACTOR


def test_the_parents_backstop_follows_the_budget():
    assert B.backstop_s(None) == 3 * B.FIRST_LAUNCH_S + 60
    assert B.backstop_s(20.0) == 120.0  # the old fixed figure, still what --timeout 20 gives
    ws = supervise.WorkerSettings(Path("."), NEGATIVE)
    assert ws.timeout_s is None and ws.idle_limit == B.backstop_s(None)
    assert supervise.WorkerSettings(Path("."), NEGATIVE, sanitize_tool="memcheck").idle_limit == B.backstop_s(None) * 20
    assert runner.QualifyRequest.__dataclass_fields__["timeout_s"].default is None


# ---- the worker's wait --------------------------------------------------------------------------------------


class _Clock:
    def __init__(self, step: float):
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_wait_measures_the_first_launch_and_holds_the_rest_to_the_scaled_budget(monkeypatch):
    clock = _Clock(0.01)
    monkeypatch.setattr(C.time, "monotonic", clock)
    monkeypatch.setattr(C.time, "sleep", lambda s: None)
    info = cu.DeviceInfo(0, "Emulated", (9, 0), 132, 13000, 232448, 233472, 1 << 37, "")
    ctx = C.Context(device=None, info=info, timeout_s=None)  # type: ignore[arg-type]
    assert ctx.budget.fixed_s is None and ctx.budget.limit == B.FIRST_LAUNCH_S

    class Finishes(FakeStream):
        def __init__(self, polls):
            super().__init__()
            self.polls = polls

        def query_done(self):
            self.polls -= 1
            return self.polls < 0

    ctx.wait(Finishes(3))  # ~40 ms of fake time
    assert ctx.budget.first_launch_s == pytest.approx(0.04)
    assert ctx.budget.limit == pytest.approx(3.0)  # 50 x 40 ms + 1 s
    hung = FakeStream()
    hung.hung = True
    start = clock.now
    with pytest.raises(C.Hang) as err:
        ctx.wait(hung)
    assert clock.now - start == pytest.approx(3.0, abs=0.05)  # seconds, not the old 20 s or the 120 s backstop
    assert "timed out after 3 s (launch budget 3 s: 50 x the first launch's 40 ms + 1 s, at least 2 s)" == str(err.value)


def test_an_explicit_wait_limit_neither_measures_nor_uses_the_budget(monkeypatch):
    monkeypatch.setattr(C.time, "monotonic", _Clock(1.0))
    monkeypatch.setattr(C.time, "sleep", lambda s: None)
    info = cu.DeviceInfo(0, "Emulated", (9, 0), 132, 13000, 232448, 233472, 1 << 37, "")
    ctx = C.Context(device=None, info=info, timeout_s=None)  # type: ignore[arg-type]
    ctx.wait(FakeStream(), 60.0)
    assert ctx.budget.first_launch_s is None
    hung = FakeStream()
    hung.hung = True
    with pytest.raises(C.Hang, match=r"^timed out after 4 s$"):
        ctx.wait(hung, 4.0)


def test_a_symbol_that_hangs_after_its_first_launches_is_stopped_by_its_scaled_budget(emulated, monkeypatch):  # noqa: F811
    """control_row_sum through the whole worker path, hanging at its fourth launch: the Hang names the scaled
    budget; a symbol that passes records the budget it ran under (the manifest's `timeout` check)."""
    ctx, launches = emulated
    ctx.timeout_s = None
    r = _run(ctx, "control_row_sum")
    rec = next(c for c in r.checks if c.name == "timeout")
    assert rec.passed and rec.detail.startswith("every launch within its launch budget 2 s: 50 x the first launch's")
    real = cu.launch

    def hangs_fourth(fn, grid, block, params, *, smem=0, stream=None):
        real(fn, grid, block, params, smem=smem, stream=stream)
        if launches.count("control_row_sum") - before == 4:
            stream.hung = True

    before = launches.count("control_row_sum")
    monkeypatch.setattr(cu, "launch", hangs_fourth)
    clock = itertools.count(0.0, 0.01)
    monkeypatch.setattr(C.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(C.time, "sleep", lambda s: None)
    with pytest.raises(C.Hang, match=r"timed out after 2 s \(launch budget 2 s: 50 x the first launch's"):
        _run(ctx, "control_row_sum")
    for s in (ctx.stream, ctx.other):
        s.hung = False


def test_the_familys_timeout_wins_over_the_scaled_budget(emulated, monkeypatch):  # noqa: F811  # noqa: F811
    ctx, _ = emulated
    ctx.timeout_s = None
    clock = itertools.count(0.0, 1.0)
    monkeypatch.setattr(C.time, "monotonic", lambda: next(clock))
    monkeypatch.setattr(C.time, "sleep", lambda s: None)
    with pytest.raises(C.Hang, match=r"timed out after 5 s \(launch budget 5 s, fixed by the family's timeout_s\)"):
        _run(ctx, "spin_forever")


# ---- the parent: a worker slow to exit after it reported the hang --------------------------------------------

SLOW_EXIT_WORKER = fake_worker_script(
    '''
    if n.startswith("hang"):
        emit(event="timeout", symbol=n, seconds=2.0,
             reason=n + ": timed out after 2 s (launch budget 2 s: 50 x the first launch's 3 ms + 1 s)")
        time.sleep(3600)  # as an exit that waits on the driver tearing down a spinning kernel
    ''',
    before='if job["timeout_s"] is not None or job["time_scale"] != 1:\n    sys.exit(7)  # the settings did not arrive as the parent holds them')


def test_a_reported_hang_costs_seconds_even_when_the_worker_is_slow_to_exit(tmp_path):
    p = tmp_path / "slow_exit_worker.py"
    p.write_text(SLOW_EXIT_WORKER)
    ws = supervise.WorkerSettings(tmp_path, NEGATIVE, command=[sys.executable, str(p)], idle_s=60)
    groups = [plan.Group("Fixed", "sm_90a", "qualify", "sm_90a/Fixed.cubin", None,
                         [{"name": n, "build_layout": [[0, 8]]} for n in ("ok1", "hang_a", "ok2", "hang_b", "ok3")])]
    t0 = time.monotonic()
    out = supervise.run_groups(groups, ws)
    took = time.monotonic() - t0
    assert took < 2 * supervise.EXIT_GRACE_S + 10  # the old supervisor waited out the 60 s idle limit per hang
    r = out.results
    assert [r[n].status for n in ("ok1", "ok2", "ok3")] == ["admitted"] * 3
    for n in ("hang_a", "hang_b"):
        assert r[n].check == "timeout" and "launch budget 2 s" in r[n].reason
    assert out.restarts == 2
