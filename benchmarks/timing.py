"""CUDA-event timing shared by the benchmark scripts (run as `python benchmarks/bench_*.py`, so this module is
importable as `timing`). Every figure is a median over launches each bracketed by a pair of events, after
warm-up calls, on the legacy default stream that torch and CuPy both use here."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def median_ms(fn: Callable[[], object], reps: int, warmup: int = 5) -> float:
    """Median milliseconds of fn() over `reps` launches, timed with torch CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def time_events(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of fn() over `reps` launches, timed with CuPy CUDA events, after 3 warm-up calls."""
    import cupy as cp

    for _ in range(3):
        fn()
    cp.cuda.runtime.deviceSynchronize()
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e-3)
    return statistics.median(times)


def copy_seconds(nbytes: int, reps: int) -> float:
    """torch device-to-device copy of nbytes (moving 2 * nbytes): median seconds, CUDA events, 3 warm-ups."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = median_ms(lambda s=src, d=dst: d.copy_(s), reps, warmup=3) * 1e-3
    del src, dst
    torch.cuda.empty_cache()
    return seconds
