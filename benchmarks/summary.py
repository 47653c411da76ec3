"""Append benchmark records to benchmarks/results/summary.json, shared by the bench_*.py scripts.

The file is a JSON list of records {"family", "symbol", "shape", "dtype", "ours", "baseline", "baseline_name",
"unit", "speedup", "goal", "met", "date", "gpu"}; the latest record for a (symbol, shape, dtype) supersedes older
ones, so re-running a benchmark replaces its rows. Written atomically (a temporary file, then a rename).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

SUMMARY = Path(__file__).resolve().parent / "results" / "summary.json"
FIELDS = ("family", "symbol", "shape", "dtype", "ours", "baseline", "baseline_name", "unit", "speedup", "goal",
          "met", "date", "gpu")


def record(*, family: str, symbol: str, shape: str, dtype: str, ours: float, baseline: float | None,
           baseline_name: str, unit: str, goal: str, met: bool, gpu: str = "", speedup: float | None = None) -> dict:
    """One summary record; speedup defaults to baseline / ours (a time: higher is better for us)."""
    if speedup is None and baseline:
        speedup = round(baseline / ours, 3) if ours else None
    return {"family": family, "symbol": symbol, "shape": shape, "dtype": dtype, "ours": ours, "baseline": baseline,
            "baseline_name": baseline_name, "unit": unit, "speedup": speedup, "goal": goal, "met": bool(met),
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "gpu": gpu}


def append(records: list[dict], path: Path = SUMMARY) -> list[dict]:
    """Merge records into the summary (the newest per (symbol, shape, dtype) wins); returns the whole list."""
    for r in records:
        missing = set(FIELDS) - set(r)
        if missing:
            raise ValueError(f"summary record for {r.get('symbol')!r} lacks {sorted(missing)}")
    old = json.loads(path.read_text()) if path.exists() else []
    if not isinstance(old, list):
        raise ValueError(f"{path} is not a JSON list")
    key = lambda r: (r["symbol"], r["shape"], r["dtype"])  # noqa: E731
    fresh = {key(r) for r in records}
    merged = [r for r in old if key(r) not in fresh] + list(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".summary-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return merged
