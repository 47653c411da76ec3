"""CUDA-event timing shared by the benchmark scripts (run as `python benchmarks/bench_*.py`, so this module is
importable as `timing`). Every figure is a median over launches each bracketed by a pair of events, after
warm-up calls, on the legacy default stream that torch, CuPy and mamba_forge.gpu (stream None) all use here.
Kernels are launched through the public runtime (mamba_forge.runtime: signed bundles, or benchmarks/built.py's
fresh builds)."""

from __future__ import annotations

import statistics
from collections.abc import Callable


def median_ms(fn: Callable[[], object], reps: int, warmup: int = 5) -> float:
    """Median milliseconds of fn() over `reps` launches, each between its own pair of torch CUDA events."""
    return median_ms_queued(fn, reps, per=1, warmup=warmup)


def median_ms_queued(fn: Callable[[], object], reps: int, per: int = 10, warmup: int = 5) -> float:
    """Median milliseconds per call of fn(), each sample `per` back-to-back launches between one pair of events:
    the host enqueues faster than the GPU runs them, so a short kernel's time is not its host launch overhead
    (which a pair of events around one launch would include). Use it for kernels of a few microseconds."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(per):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / per)
    return statistics.median(times)


def capture_graph(fn: Callable[[], object], inner: int):
    """A torch CUDA graph of `inner` calls of fn, captured after 3 warm-up calls on a side stream (what capture
    needs: no first-call allocation or module load inside it)."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    return g


def time_events(fn: Callable[[], object], reps: int) -> float:
    """Median seconds of fn() over `reps` launches, timed with mamba_forge.gpu events on the legacy stream, after
    3 warm-up calls."""
    from mamba_forge.gpu import driver as cu

    for _ in range(3):
        fn()
    cu.context_synchronize()
    legacy = cu.Stream.legacy()
    start, stop = cu.Event(), cu.Event()
    times = []
    try:
        for _ in range(reps):
            start.record(legacy)
            fn()
            stop.record(legacy)
            stop.synchronize()
            times.append(start.elapsed_ms(stop) * 1e-3)
    finally:
        start.destroy()
        stop.destroy()
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

