"""The watchdog's time budget per launch (pure; the worker's Context.wait enforces it).

A fixed budget (`qualify --timeout SECONDS`, or a family's `qualify.timeout_s`) holds for every launch. Without
one the budget scales with the symbol: its first launch may take FIRST_LAUNCH_S, every later launch
FACTOR x the first launch's measured time + SLACK_S, at least FLOOR_S. A kernel that hangs costs seconds, while
one whose launches legitimately take long gets a budget to match. Under compute-sanitizer every figure is
multiplied by the tool's slowdown factor (sanitize.TIME_FACTOR).
"""

from __future__ import annotations

from dataclasses import dataclass

FIRST_LAUNCH_S = 10.0  # a symbol's first launch (lazy function loading included) before anything is measured
FACTOR = 50.0
SLACK_S = 1.0
FLOOR_S = 2.0


def seconds_text(x: float) -> str:
    """3 significant digits, never an exponent: '2', '13.5', '1500'."""
    return f"{x:.3g}" if x < 1000 else f"{x:.0f}"


@dataclass
class LaunchBudget:
    fixed_s: float | None = None  # every launch, when given
    source: str = ""  # where a fixed budget comes from ("--timeout", "the family's timeout_s")
    scale: float = 1.0  # the sanitizer's slowdown factor, or 1
    first_launch_s: float | None = None  # the first launch's measured time (None until measured)

    @property
    def limit(self) -> float:
        """Seconds the next launch may take."""
        if self.fixed_s is not None:
            return self.fixed_s * self.scale
        if self.first_launch_s is None:
            return FIRST_LAUNCH_S * self.scale
        return max(FLOOR_S * self.scale, FACTOR * self.first_launch_s + SLACK_S * self.scale)

    def observe(self, seconds: float) -> None:
        """A launch finished in `seconds`; the first such figure sets the scaled budget."""
        if self.first_launch_s is None:
            self.first_launch_s = max(0.0, seconds)

    def describe(self) -> str:
        """What the budget is and where it comes from, for the manifest and the timeout reason."""
        tool = f" (x{self.scale:g} under compute-sanitizer)" if self.scale != 1 else ""
        if self.fixed_s is not None:
            return f"launch budget {seconds_text(self.limit)} s, fixed by {self.source or '--timeout'}{tool}"
        if self.first_launch_s is None:
            return f"launch budget {seconds_text(self.limit)} s for the first launch{tool}"
        return (f"launch budget {seconds_text(self.limit)} s: {FACTOR:g} x the first launch's "
                f"{seconds_text(self.first_launch_s * 1e3)} ms "
                f"+ {SLACK_S * self.scale:g} s, at least {FLOOR_S * self.scale:g} s{tool}")


def backstop_s(fixed_s: float | None, scale: float = 1.0) -> float:
    """The parent's idle limit (no event from the worker for this long kills it): only for a worker stuck outside
    its own deadline (in a blocking driver call); three of the longest first-launch budgets and a minute."""
    return (3 * (fixed_s if fixed_s is not None else FIRST_LAUNCH_S) + 60) * scale


__all__ = ["FACTOR", "FIRST_LAUNCH_S", "FLOOR_S", "SLACK_S", "LaunchBudget", "backstop_s", "seconds_text"]
