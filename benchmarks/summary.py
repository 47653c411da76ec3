"""Append benchmark records to benchmarks/results/summary.json, shared by the bench_*.py scripts.

The file is a JSON list of records {"family", "symbol", "shape", "dtype", "ours", "baseline", "baseline_name",
"unit", "speedup", "goal", "met", "date", "gpu"}; the latest record for a (symbol, shape, dtype) supersedes older
ones, so re-running a benchmark replaces its rows. One call may not carry two records of one key (one would
silently drop the other): variants of one kernel carry a ':' suffix on the symbol ('name:vs-peer').
Every record's goal is a string naming what `met` was judged against, thresholds included (">=85% copy", "<= 1.0x
peer time"). A record with no stated goal has goal "" and met = parity with its baseline (ours no worse than the
baseline: bench_scan.py's plain backward, bench_build.py's cold build, bench_sm120_tma.py's tiles), so goal "" needs
a baseline; a met that compares against any other threshold writes that threshold into goal.

Writing: values are made plain JSON first (numpy scalars to Python numbers; anything else is refused before the
file is touched), then a temporary file beside the summary is written, flushed and fsynced, given mode 0644 and
renamed over it; it is removed on any failure. An exclusive flock on the summary's folder (no lock file left
beside it) spans the read-modify-write, so concurrent appends (threads or processes) keep every row.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import tempfile
import threading
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from mamba_forge.core.fsio import fsync_dir

SUMMARY = Path(__file__).resolve().parent / "results" / "summary.json"
FIELDS = ("family", "symbol", "shape", "dtype", "ours", "baseline", "baseline_name", "unit", "speedup", "goal",
          "met", "date", "gpu")
MODE = 0o644
_THREAD_LOCK = threading.Lock()  # belt and braces beside flock for threads of one process


def record(*, family: str, symbol: str, shape: str, dtype: str, ours: float, baseline: float | None,
           baseline_name: str, unit: str, goal: str, met: bool, gpu: str = "", speedup: float | None = None) -> dict:
    """One summary record; speedup defaults to baseline / ours (a time: higher is better for us)."""
    if speedup is None and baseline:
        speedup = round(baseline / ours, 3) if ours else None
    return {"family": family, "symbol": symbol, "shape": shape, "dtype": dtype, "ours": ours, "baseline": baseline,
            "baseline_name": baseline_name, "unit": unit, "speedup": speedup, "goal": goal, "met": bool(met),
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "gpu": gpu}


def plain(value, where: str = "value"):
    """`value` as plain JSON types: numpy (or torch) scalars become Python numbers via .item(); NaN / inf and any
    other type raise TypeError naming `where`."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if type(value) in (int, float):
        if isinstance(value, float) and not math.isfinite(value):
            raise TypeError(f"{where}: non-finite number {value!r}")
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): plain(v, f"{where}.{k}") for k, v in value.items()}
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", ()) == ():
        try:
            scalar = item()
        except (TypeError, ValueError) as e:
            raise TypeError(f"{where}: cannot convert {type(value).__name__} to a JSON scalar") from e
        if isinstance(scalar, (bool, int, float, str)):
            return plain(scalar, where)
    raise TypeError(f"{where}: {type(value).__name__} is not a JSON value")


def _key(r: dict) -> tuple:
    return (r["symbol"], r["shape"], r["dtype"])


def checked(records: list[dict]) -> list[dict]:
    """The records as plain JSON, each with every field and no two sharing a (symbol, shape, dtype) key."""
    out, seen = [], {}
    for r in records:
        missing = set(FIELDS) - set(r)
        if missing:
            raise ValueError(f"summary record for {r.get('symbol')!r} lacks {sorted(missing)}")
        r = plain(r, f"record {r.get('symbol')!r}")
        if not isinstance(r["goal"], str) or not isinstance(r["met"], bool):
            raise ValueError(f"summary record for {r['symbol']!r}: goal must be a string and met a bool")
        if r["goal"] == "" and r["baseline"] is None:
            raise ValueError(f"summary record for {r['symbol']!r}: goal \"\" means parity with the baseline, "
                             "and it has none: state the goal")
        k = _key(r)
        if k in seen:
            raise ValueError(f"two records in one call share the key {k} (goals {seen[k]!r} and {r['goal']!r}): "
                             "give the variants distinct symbols, e.g. a ':vs-peer' suffix")
        seen[k] = r["goal"]
        out.append(r)
    return out


def _write(path: Path, rows: list[dict]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".summary-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(rows, f, indent=1, allow_nan=False)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, MODE)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)  # the rename itself durable


@contextmanager
def _locked(folder: Path):
    """An exclusive flock on `folder` (and this process's thread lock) while the block runs."""
    with _THREAD_LOCK:
        dfd = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(dfd)  # closing the descriptor releases the flock


def append(records: list[dict], path: Path = SUMMARY) -> list[dict]:
    """Merge records into the summary (the newest per (symbol, shape, dtype) wins); returns the whole list.
    A bad record (a missing field, a value that is not JSON, two records of one key) writes nothing."""
    records = checked(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path.parent):
        old = json.loads(path.read_text()) if path.exists() else []
        if not isinstance(old, list):
            raise ValueError(f"{path} is not a JSON list")
        fresh = {_key(r) for r in records}
        merged = [r for r in old if _key(r) not in fresh] + records
        _write(path, merged)
    return merged
