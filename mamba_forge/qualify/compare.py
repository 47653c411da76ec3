"""Across GPUs of one model (--device all): a symbol admitted on every GPU must give bitwise equal outputs
(the same digest per check) on each, else it is rejected everywhere."""

from __future__ import annotations

from mamba_forge.qualify.events import CheckResult
from mamba_forge.qualify.supervise import Outcome


def cross_device(outcomes: dict[int, Outcome]) -> list[str]:
    """Reject a symbol whose digests differ between two GPUs of the same model."""
    notes = []
    devs = sorted(outcomes)
    names = {d: outcomes[d].device.name if outcomes[d].device else None for d in devs}
    if len(set(names.values())) > 1:
        notes.append(f"GPUs of different models ({sorted(set(map(str, names.values())))}): digests not compared")
        return notes
    first = devs[0]
    for name, rec in outcomes[first].results.items():
        recs = {d: outcomes[d].results.get(name) for d in devs}
        if any(r is None or not r.admitted for r in recs.values()):
            # rejected anywhere: rejected everywhere, with the first reason
            bad_dev, bad = next((d, r) for d, r in recs.items() if r is None or not r.admitted)
            if rec.admitted:
                rec.reject(bad.check if bad else "fault", f"on GPU {bad_dev}: {bad.reason if bad else 'no result'}")
            continue
        sig0 = [(c.name, c.digest) for c in rec.checks]
        for d in devs[1:]:
            sig = [(c.name, c.digest) for c in recs[d].checks]  # type: ignore[union-attr]
            if sig != sig0:
                rec.reject("cross-device", f"{name}: output digests differ between GPU {first} and GPU {d} of the same model")
                rec.checks.append(CheckResult("cross-device", False, "", f"GPU {first} vs GPU {d}"))
                break
        else:
            rec.checks.append(CheckResult("cross-device", True, sig0[-1][1] if sig0 else "", f"{len(devs)} GPUs bitwise equal"))
    return notes


__all__ = ["cross_device"]
