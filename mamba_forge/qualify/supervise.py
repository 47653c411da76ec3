"""Supervision of the worker subprocesses: each runs some groups of symbols on one device and streams events
(events.py); a worker that faults (the CUDA context is then dead), hangs, dies or breaks the protocol is killed
with its process group, the symbol in flight is rejected with the reason, and a fresh worker takes the rest."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mamba_forge.qualify.budget import backstop_s
from mamba_forge.qualify.events import (
    Done,
    Event,
    Fatal,
    Fault,
    Hello,
    ModuleError,
    ModuleLoaded,
    ProtocolError,
    Start,
    SymbolResult,
    Timeout,
    WorkerDevice,
    from_json_line,
)
from mamba_forge.qualify.plan import Group
from mamba_forge.qualify.sanitize import TIME_FACTOR, UNATTRIBUTED, is_report_line, wrap_command

DEFAULT_WORKER = [sys.executable, "-m", "mamba_forge.qualify.worker"]
MAX_FRUITLESS_RESTARTS = 2  # a worker that dies twice before finishing any symbol: give up on the rest
# after a fault or timeout event the worker only has to exit; a process whose exit waits on the driver (tearing
# down a context with a kernel still spinning) is killed after this long instead of the idle backstop
EXIT_GRACE_S = 3.0

OnEvent = Callable[[int, Event], None]  # (device ordinal, event): every event a worker sends, as it comes


@dataclass
class WorkerSettings:
    build_dir: Path
    catalog: Path
    device: int = 0
    level: str = "quick"
    seed: int = 0
    timeout_s: float | None = None  # a fixed budget per launch (--timeout); None: scaled per symbol (budget.py)
    idle_s: float | None = None  # parent-side backstop: no event for this long kills the worker
    command: list[str] = field(default_factory=lambda: list(DEFAULT_WORKER))
    sanitize_tool: str | None = None
    env: dict[str, str] | None = None
    state_capacity: int = 0  # the build's compiled MF_STATE_CAP: the contract the qualifier launches through holds it

    @property
    def time_scale(self) -> float:
        return TIME_FACTOR if self.sanitize_tool else 1

    @property
    def idle_limit(self) -> float:
        if self.idle_s is not None:
            return self.idle_s * self.time_scale
        return backstop_s(self.timeout_s, self.time_scale)


@dataclass
class Outcome:
    results: dict[str, SymbolResult] = field(default_factory=dict)  # symbol -> verdict
    device: WorkerDevice | None = None
    module_notes: dict[str, str] = field(default_factory=dict)  # "module/target" -> how it loaded
    sanitizer: dict[str, list[str]] = field(default_factory=dict)  # symbol -> sanitizer report lines
    restarts: int = 0
    last_failure: str = ""  # why the last worker ended early


def run_groups(groups: list[Group], ws: WorkerSettings, on_event: OnEvent | None = None, sanitize: bool = False) -> Outcome:
    """Qualify every symbol of `groups` in worker subprocesses; a fault or hang rejects the symbol that caused
    it and a fresh worker continues with the rest. Never raises for a misbehaving kernel or worker."""
    out = Outcome()
    all_names = [s["name"] for g in groups for s in g.symbols]
    where = {s["name"]: (g.module, g.target) for g in groups for s in g.symbols}
    fruitless = 0
    while True:
        remaining = [n for n in all_names if n not in out.results]
        if not remaining:
            break
        rem = set(remaining)
        job_groups = [g.job(rem) for g in groups if any(s["name"] in rem for s in g.symbols)]
        job = {"device": ws.device, "level": ws.level, "seed": ws.seed, "timeout_s": ws.timeout_s,
               "time_scale": ws.time_scale, "state_capacity": ws.state_capacity,
               "catalog": str(ws.catalog), "build_dir": str(ws.build_dir), "sanitize": sanitize, "groups": job_groups}
        before = len(out.results)
        _one_worker(job, rem, ws, out, where, on_event)
        if len(out.results) == before:
            fruitless += 1
            if fruitless >= MAX_FRUITLESS_RESTARTS:
                why = out.last_failure or "the worker failed before qualifying any symbol"
                for n in remaining:
                    if n not in out.results:
                        m, t = where[n]
                        out.results[n] = SymbolResult.rejected(n, m, t, "harness", f"{n}: not qualified: {why}")
                break
        else:
            fruitless = 0
    return out


def _one_worker(job: dict, names: set[str], ws: WorkerSettings, out: Outcome, where: dict[str, tuple[str, str]],
                on_event: OnEvent | None) -> None:
    with tempfile.TemporaryDirectory(prefix="mf-qualify-") as tmp:
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        err_path = Path(tmp) / "stderr.txt"
        cmd = [*ws.command, "--job", str(job_path)]
        if ws.sanitize_tool:
            cmd = wrap_command(ws.sanitize_tool, cmd)
        env = dict(os.environ, **(ws.env or {}))
        env.setdefault("PYTHONUNBUFFERED", "1")
        with open(err_path, "w") as err_f:
            # under compute-sanitizer its reports may come on either stream: read both, in order
            stderr = subprocess.STDOUT if ws.sanitize_tool else err_f
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                    env=env, start_new_session=True)
        q: queue.Queue = queue.Queue()
        threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
        current: str | None = None
        done = False
        timed_out = False
        broken = ""  # why a line from the worker was refused
        exiting_since: float | None = None  # when the worker reported the fault or hang it exits for
        while True:
            wait = ws.idle_limit
            if exiting_since is not None:
                wait = max(0.0, min(wait, exiting_since + EXIT_GRACE_S - time.monotonic()))
            try:
                line = q.get(timeout=wait)
            except queue.Empty:
                if exiting_since is None:
                    timed_out = True
                _kill(proc)
                break
            if line is None:
                break
            line = line.rstrip("\n")
            if not line.startswith("{"):
                if is_report_line(line):
                    out.sanitizer.setdefault(current or UNATTRIBUTED, []).append(line)
                continue
            try:
                ev = from_json_line(line)
            except ProtocolError as exc:
                broken = f"the worker broke the protocol ({exc}): {line[:120]}"
                _kill(proc)
                break
            match ev:
                case Hello():
                    out.device = ev.device
                case ModuleLoaded():
                    out.module_notes[f"{ev.module}/{ev.target}"] = ev.load
                case ModuleError():
                    for n, (m, t) in where.items():
                        if (m, t) == (ev.module, ev.target) and n not in out.results and n in names:
                            out.results[n] = SymbolResult.rejected(n, m, t, "load", ev.reason)
                case Start():
                    current = ev.symbol
                case SymbolResult():
                    out.results[ev.symbol] = ev
                    current = None
                case Fault() | Timeout():
                    m, t = where.get(ev.symbol, ("", ""))
                    check = "fault" if isinstance(ev, Fault) else "timeout"
                    out.results[ev.symbol] = SymbolResult.rejected(ev.symbol, m, t, check, ev.reason)
                    current = None
                    exiting_since = time.monotonic()
                case Fatal():
                    out.last_failure = ev.reason
                case Done():
                    done = True
            if on_event:
                on_event(ws.device, ev)
        if not timed_out:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                _kill(proc)
        stderr_tail = err_path.read_text(errors="replace").strip().splitlines()[-3:] if err_path.exists() else []
        if not done:
            out.restarts += 1
            if timed_out:
                why = f"timed out after {ws.idle_limit:g} s without a word from the worker"
            elif broken:
                why = broken
            else:
                why = f"the worker {_describe_exit(proc.returncode)}"
                if stderr_tail:
                    why += f" ({' | '.join(stderr_tail)[:300]})"
            out.last_failure = why
            if current is not None and current not in out.results:
                m, t = where.get(current, ("", ""))
                if timed_out:
                    rec = SymbolResult.rejected(current, m, t, "timeout", f"{current}: timed out after {ws.idle_limit:g} s")
                else:
                    rec = SymbolResult.rejected(current, m, t, "fault", f"{current}: {why}")
                out.results[current] = rec
                if on_event:
                    on_event(ws.device, rec)


def _reader(stream, q: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        q.put(line)
    q.put(None)


def _kill(proc: subprocess.Popen) -> None:
    """Kill the worker (and what it started, e.g. under compute-sanitizer): its own process group."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def in_parallel(fn: Callable, items: list) -> list:
    """fn over items, one thread each (each thread supervises its own worker process)."""
    results: list = [None] * len(items)

    def run(i: int) -> None:
        results[i] = fn(items[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return results


def merge_outcomes(parts: list[Outcome]) -> Outcome:
    out = Outcome()
    for p in parts:
        out.results.update(p.results)
        out.device = out.device or p.device
        out.module_notes.update(p.module_notes)
        out.restarts += p.restarts
        for k, v in p.sanitizer.items():
            out.sanitizer.setdefault(k, []).extend(v)
    return out


__all__ = ["DEFAULT_WORKER", "OnEvent", "Outcome", "WorkerSettings", "in_parallel", "merge_outcomes", "run_groups"]
