"""compute-sanitizer passes: how a worker is run under a tool, which of its output lines are reports, and the
verdict those reports give on the symbols that the main pass admitted."""

from __future__ import annotations

import re
import shutil
from typing import TYPE_CHECKING, Literal

from mamba_forge.qualify.events import CheckResult

if TYPE_CHECKING:
    from mamba_forge.qualify.supervise import Outcome

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
TIME_FACTOR = 20  # launches under a tool take this much longer (worker deadlines and the parent's backstop)
SANITIZER_LINE = "========="
UNATTRIBUTED = "*"  # sanitizer lines printed while no symbol was running
# a line that continues the report above it: indented past the prefix ("=========     and Write access at ...")
_CONTINUATION = re.compile(r"^=+ {2,}\S")
_SANITIZER_NOISE = re.compile(r"^=+\s*(COMPUTE-SANITIZER|ERROR SUMMARY: 0 errors|RACECHECK SUMMARY: 0 hazards|$)")


SanitizerMode = Literal["ran", "not-found", "off"]  # what the qualified manifest records


def sanitizer_available() -> bool:
    return shutil.which("compute-sanitizer") is not None


def sanitizer_mode(level: str, requested: bool | None) -> SanitizerMode:
    """Whether the sanitizer passes run: always with --sanitize (qualify() refuses it first when the tool is
    missing), never with --no-sanitize ("off"); by default at --level full whenever compute-sanitizer is on PATH
    ("not-found" when it is not, so the manifest says the full qualification went without it); else "off"."""
    if requested is not None:
        return "ran" if requested else "off"
    if level == "full":
        return "ran" if sanitizer_available() else "not-found"
    return "off"


def wrap_command(tool: str, cmd: list[str]) -> list[str]:
    """The worker command run under compute-sanitizer's `tool`."""
    exe = shutil.which("compute-sanitizer") or "compute-sanitizer"
    # API errors are the harness's own (the ABI census probes cuFuncGetParamInfo past the last
    # parameter, which answers CUDA_ERROR_INVALID_VALUE by design): report kernels' errors only
    return [exe, "--tool", tool, "--report-api-errors", "no", "--print-limit", "20", "--error-exitcode", "0", *cmd]


def is_report_line(line: str) -> bool:
    """A line of a sanitizer report (not its banner nor a clean summary)."""
    return line.startswith(SANITIZER_LINE) and not _SANITIZER_NOISE.match(line)


def first_report(lines: list[str], most: int = 3) -> str:
    """The first report of a symbol's sanitizer lines, with the lines that continue it (racecheck names a race's
    two accesses on two lines: "Race reported between Read access at f+0x27a0 ..." then "and Write access at ...":
    the second says which store it is), at most `most` lines, joined by " "."""
    kept = [ln for ln in lines if ln.strip("= ").strip()]
    if not kept:
        return "report"
    report = [kept[0].strip("= ").strip()]
    for ln in kept[1:most]:
        if not _CONTINUATION.match(ln):  # the next report
            break
        report.append(ln.strip("= ").strip())
    return " ".join(report)


def apply_sanitizer(oc: Outcome, soc: Outcome, tool: str) -> None:
    """Reject every symbol with a compute-sanitizer report (or that failed under the tool). Lines printed
    outside any symbol go to the symbols they name; a non-zero error summary nobody can be blamed for rejects
    every symbol of the run (better a false rejection than a missed report)."""
    loose = soc.sanitizer.get(UNATTRIBUTED, [])
    attributed = any(k != UNATTRIBUTED for k in soc.sanitizer)
    unexplained = [ln for ln in loose if re.search(r"ERROR SUMMARY: [1-9]|SUMMARY: [1-9]\d* hazard", ln)]
    for name, rec in soc.results.items():
        main = oc.results.get(name)
        if main is None or not main.admitted:
            continue
        lines = soc.sanitizer.get(name, []) + [ln for ln in loose if re.search(rf"\b{re.escape(name)}\b", ln)]
        if not lines and unexplained and not attributed:
            lines = unexplained
        if lines:
            first = first_report(lines)
            main.checks.append(CheckResult("sanitize", False, "", f"{tool}: {first}"))
            main.reject("sanitize", f"{name}: compute-sanitizer {tool}: {first}")
        elif not rec.admitted:
            main.checks.append(CheckResult("sanitize", False, "", f"{tool}: {rec.reason}"))
            main.reject("sanitize", f"{name}: under compute-sanitizer {tool}: {rec.reason}")
        else:
            main.checks.append(CheckResult("sanitize", True, "", f"{tool}: no report"))


__all__ = ["SANITIZER_TOOLS", "TIME_FACTOR", "UNATTRIBUTED", "SanitizerMode", "apply_sanitizer", "is_report_line",
           "sanitizer_available", "sanitizer_mode", "wrap_command"]
