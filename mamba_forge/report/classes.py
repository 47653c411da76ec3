"""Rejections grouped by the class of their reason: what kind of fault a deciding check found, so a report says
"3 placement-variant, 1 timeout" before it lists symbols. Pure: check name in, class out."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

# classes in the order a report shows them: what breaks a process first, then wrong memory, then wrong bits
CLASSES = (
    "fault", "timeout", "bounds", "input written", "uninitialized", "incorrect", "in-place-unsafe", "nondeterministic",
    "batch-variant", "placement-variant", "split-variant", "route-inequivalent", "sanitizer", "resource", "ABI",
    "static policy", "build", "harness", "other",
)

CHECK_CLASS = {
    # the context died or the process did
    "fault": "fault", "load": "fault",
    "timeout": "timeout",
    # the guards (guards.py)
    "bounds": "bounds", "input-written": "input written", "uninitialized": "uninitialized",
    "correctness": "incorrect",
    "in-place": "in-place-unsafe",  # other bits when an output is written over the input it declares in_place_of
    # bits that change with something other than the inputs
    "repeat": "nondeterministic", "stream": "nondeterministic", "neighbour": "nondeterministic",
    "address": "nondeterministic", "graph": "nondeterministic", "cross-device": "nondeterministic",
    "pdl": "nondeterministic",  # read before its programmatic-dependent-launch wait: bits that depend on timing
    "batch": "batch-variant",
    "placement": "placement-variant",
    "split": "split-variant",  # bits that change with how a sequence is cut into calls (qualify/split.py)
    "route-equivalence": "route-inequivalent",
    "sanitize": "sanitizer",
    # limits of the target or the symbol's own policy (build/admit.py, qualify/checks.live_admit)
    "block": "resource", "registers": "resource", "smem": "resource", "spills": "resource", "stack": "resource",
    "occupancy": "resource",
    "abi": "ABI", "exports": "ABI",
    "float-atomics": "static policy", "static-tokens": "static policy", "pdl-wait": "static policy",
    "compile": "build",
    # the qualifier could not judge the symbol
    "harness": "harness", "reference": "harness", "spec": "harness", "untested": "harness",
}


def reason_class(check: str) -> str:
    """The class of a rejection decided by `check` ('other' for a check this table does not know)."""
    return CHECK_CLASS.get(check, "other")


class _Rejected(Protocol):
    check: str


def group_rejections(symbols: Iterable[_Rejected]) -> list[tuple[str, list]]:
    """(class, the symbols it holds) for every class that holds one, in CLASSES order; symbols keep their order."""
    groups: dict[str, list] = {}
    for s in symbols:
        groups.setdefault(reason_class(s.check), []).append(s)
    return [(c, groups[c]) for c in CLASSES if c in groups]


def class_counts(groups: list[tuple[str, list]]) -> dict[str, int]:
    return {c: len(members) for c, members in groups}


def counts_line(groups: list[tuple[str, list]]) -> str:
    """'12 rejected: 3 placement-variant, 1 timeout, ...' (classes in CLASSES order)."""
    total = sum(len(m) for _, m in groups)
    return f"{total} rejected: " + ", ".join(f"{len(m)} {c}" for c, m in groups)


def check_verdict(c) -> str:
    """'' for a passed check, 'not run' for one recorded as run on nothing (the qualifier's placement check where
    no placement could run), else 'FAILED'."""
    if c.passed:
        return ""
    return "not run" if c.detail.startswith("not run") else "FAILED"


__all__ = ["CHECK_CLASS", "CLASSES", "check_verdict", "class_counts", "counts_line", "group_rejections", "reason_class"]
