"""The adversarial suite's case count in the terminal summary ("adversarial: N cases, P passed ...").

Counted from the test reports the terminal reporter collected, so it works under xdist (-n) as well: the
controller receives every worker's reports. Pytest loads this file in the controller when tests/adversarial is
named on the command line; a whole-suite run (`pytest -n 2` from the root, as CI does) loads only the root's
tests/conftest.py there, which re-exports this hook (`from adversarial.conftest import pytest_terminal_summary`)."""

from __future__ import annotations

PREFIX = "tests/adversarial/"


def adversarial_counts(stats: dict) -> dict[str, int]:
    """outcome -> number of adversarial cases (one per test: its call report, or the setup report that skipped
    or errored it)."""
    out: dict[str, int] = {}
    seen: set[str] = set()
    for outcome, reports in stats.items():
        for r in reports:
            nodeid = getattr(r, "nodeid", "")
            when = getattr(r, "when", None)
            if not nodeid.startswith(PREFIX) or nodeid in seen or when not in ("call", "setup"):
                continue
            if when == "setup" and outcome not in ("skipped", "error"):
                continue
            seen.add(nodeid)
            out[outcome] = out.get(outcome, 0) + 1
    return out


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if getattr(config, "_adversarial_counted", False):  # registered twice (this conftest and a re-export)
        return
    config._adversarial_counted = True
    counts = adversarial_counts(terminalreporter.stats)
    total = sum(counts.values())
    if total:
        detail = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        terminalreporter.write_line(f"adversarial: {total} cases ({detail})")
