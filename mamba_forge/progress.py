"""Progress of the long commands (`build`, `qualify`) on stderr, one way for both.

Three modes: ``off`` (``-q``/``--json``: nothing), ``lines`` (stderr is not a terminal, e.g. a CI log: one plain
line per finished unit, as ninja prints them, ``[12/25] Fixed sm_90a 41.2 s (about 6 min left)``), and ``bar`` (a
terminal: a rich progress bar, transient, with the unit in flight). A command that knows its plan says it first in
one header line (`begin`); from then on each timed unit's line carries an estimate of what remains: the mean time of
the timed units finished so far (before the first one, the caller's prior) times the timed units left, over the
workers running them; or, where the units are weighed (a build's programs by their symbols: the Fixed program takes
60 s where a small one takes 3, and the big ones go first), the time per weight finished so far times the weight left;
where the caller also gives the order the workers take the units in (a build), each running unit's share less what
it has run, and never less than the longest unit's share (`estimate_left_s`). The stages report through plain callbacks (the builder's
``progress(kind, record)``, the qualifier's ``on_event(device, event)``); the CLI turns them into calls here.
rich is imported only in ``bar`` mode, so this module is safe on any path.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

RUNNING_FLOOR_S = 1.0  # what a running unit still takes at the least, however long past its estimate it has run


class _Console(Protocol):  # what we use of rich.console.Console (or a stand-in in tests)
    is_terminal: bool

    def print(self, *objects: Any, **kw: Any) -> None: ...


def choose_mode(console: _Console | None, *, quiet: bool) -> str:
    if quiet or console is None:  # None: the caller prints nothing (and so never creates a console)
        return "off"
    return "bar" if console.is_terminal else "lines"


class Progress:
    """``with Progress("build", 25, console, quiet=False) as p: p.started("Fixed sm_90a"); p.finished(...)``."""

    def __init__(self, label: str, total: int, console: _Console | None, *, quiet: bool = False,
                 mode: str | None = None, clock: Callable[[], float] = time.monotonic):
        self.label, self.total, self.console, self._clock = label, total, console, clock
        self.mode = mode or choose_mode(console, quiet=quiet)
        self.done = 0
        self._lock = threading.Lock()  # the qualifier reports from one thread per worker
        self._bar: Any = None
        self._task: Any = None
        self._timed_total = 0  # units that take time (`begin`); the others (cache hits) finish at once
        self._timed_done = 0
        self._timed_seconds = 0.0
        self._prior_s: float | None = None
        self._workers = 1
        self._weight_total: int | None = None  # the timed units' total weight (`begin`), None: each weighs 1
        self._weight_done = 0
        # with `begin(queue=...)`: the units in the order the workers take them, and those running since when
        self._queue: list[tuple[str, int]] | None = None
        self._running: dict[str, tuple[float, int]] = {}

    def __enter__(self) -> Progress:
        if self.mode == "bar":
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn(f"[bold]{self.label}[/bold]"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), TextColumn("{task.description}"), console=self.console,
                            transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
            self._bar = None

    def _line(self, text: str) -> None:
        target = self._bar.console if self._bar is not None else self.console
        target.print(text, markup=False, highlight=False, soft_wrap=True)

    def begin(self, header: str, *, timed: int, workers: int = 1, prior_s: float | None = None,
              weight: int | None = None, queue: Iterable[tuple[str, int]] | None = None) -> None:
        """Print the plan's header line at once (both visible modes) and start estimating: `timed` of the units
        take time, `workers` run them side by side, `prior_s` is a unit's time before any has finished. With
        `weight` (the timed units' total, each unit's given to `finished`), `prior_s` is the time per weight.
        With `queue` (every unit as (name, weight), in the order the workers take them), the estimate follows the
        units: the first `workers` start now, the next whenever a timed unit finishes (a unit that finishes
        untimed, a cache hit, gives its place to the next at once), and what a running unit has already run is
        taken off its share (`estimate_left_s`), so the figure does not rise while one long unit runs."""
        with self._lock:
            self._timed_total, self._workers, self._prior_s = max(0, timed), max(1, workers), prior_s
            self._weight_total = None if weight is None else max(0, weight)
            if queue is not None:
                self._queue, self._running = list(queue), {}
                self._fill(self._clock())
            if self.mode != "off":
                self._line(header)

    def _fill(self, now: float) -> None:
        while self._queue and len(self._running) < self._workers:
            name, w = self._queue.pop(0)
            self._running[name] = (now, max(0, w))

    def _track(self, unit: str, timed: bool) -> None:
        """`unit` finished: out of the running (or, not yet started as this model had it, out of the queue)."""
        if self._queue is None:
            return
        started = self._running.pop(unit, None)
        if started is None:
            self._queue = [q for q in self._queue if q[0] != unit]
        self._fill(self._clock() if timed or started is None else started[0])

    def remaining_s(self) -> float | None:
        """Seconds the timed units left should take (None: nothing to estimate from, or nothing left)."""
        left = self._timed_total - self._timed_done
        if left <= 0:
            return None
        if self._weight_total is not None:
            rate = self._timed_seconds / self._weight_done if self._weight_done else self._prior_s
            if rate is None:
                return None
            if self._queue is not None and (self._running or self._queue):
                now = self._clock()
                return estimate_left_s(rate, [(w, now - t0) for t0, w in self._running.values()],
                                       [w for _, w in self._queue], self._workers)
            return rate * max(0, self._weight_total - self._weight_done) / min(self._workers, left)
        per_unit = self._timed_seconds / self._timed_done if self._timed_done else self._prior_s
        if per_unit is None:
            return None
        return per_unit * math.ceil(left / self._workers)

    def started(self, unit: str) -> None:
        """A unit began (only the bar shows it)."""
        with self._lock:
            if self._bar is not None:
                self._bar.update(self._task, description=unit)

    def finished(self, unit: str, *, seconds: float | None = None, tag: str = "", weight: int = 1) -> str:
        """A unit finished: the bar advances, or one line ``[n/total] unit tag 41.2 s (about 6 min left)``; a unit
        with `seconds` counts as timed for the estimate (with its `weight` where `begin` took one). Returns that
        line."""
        with self._lock:
            self.done += 1
            parts = [f"[{self.done}/{self.total}]", unit]
            if tag:
                parts.append(tag)
            if seconds is not None:
                parts.append(f"{seconds:.1f} s")
                self._timed_done += 1
                self._timed_seconds += seconds
                self._weight_done += max(0, weight)
            self._track(unit, seconds is not None)
            left = self.remaining_s() if self._timed_total else None
            if left is not None:
                parts.append(f"({about(left)} left)")
            line = " ".join(parts)
            if self.mode == "lines":
                self._line(line)
            elif self._bar is not None:
                self._bar.update(self._task, advance=1,
                                 description=unit if left is None else f"{unit} ({about(left)} left)")
            return line

    def note(self, text: str) -> None:
        """A line worth keeping (a rejection, a module error), shown in both visible modes."""
        with self._lock:
            if self.mode != "off":
                self._line(text)


def estimate_left_s(rate: float, running: Iterable[tuple[int, float]], queued: Iterable[int], workers: int,
                    floor: float = RUNNING_FLOOR_S) -> float:
    """Seconds until the last of some units finishes, at `rate` seconds per weight: `running` as (weight,
    seconds it has run so far), each with its estimate less what it has run (never below `floor`), `queued` as
    weights. The work spread over the workers, but never less than the longest unit: one large program is the
    critical path, however many workers wait beside it."""
    shares = [max(floor, rate * w - ran) for w, ran in running] + [rate * w for w in queued]
    if not shares:
        return 0.0
    return max(sum(shares) / max(1, min(workers, len(shares))), max(shares))


def about(seconds: float) -> str:
    """A rough duration for a person: 'about 40 s', 'about 6 min', 'about 1.5 h'."""
    if seconds < 60:
        return f"about {max(5, 5 * round(seconds / 5))} s"
    if seconds < 3600:
        return f"about {round(seconds / 60)} min"
    return f"about {seconds / 3600:.1f} h"

