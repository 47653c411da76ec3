"""Host time per call of a torch custom op's dispatch on the CPU (torch installed; no GPU): a scratch op with
mamba_forge::gemm's schema whose implementation only allocates C (``A.new_empty``), called through the dispatcher
with no autograd kernel, with torch.library.register_autograd's kernel, and with runtime/torch_dispatch.py's,
against the implementation called as a Python function; the two kernels again on an A that requires grad (a graph
recorded). What the differentiable ops' Autograd kernel costs a call (issue 25's host path), apart from the launch
path that scripts/bench_host_path_cpu.py times. Measured on the 2-core CPU machine (2026-12-04, median of 3 runs):
5.4 / 14.6 / 32.8 / 19.0 us without a graph, 91.1 / 53.6 with one.

Not a benchmark (nothing recorded): a dev tool. Figures are thread-CPU microseconds per call, the median over
--repeat runs of the fastest of --batches batches of --calls calls, the cases interleaved.

    python scripts/bench_torch_dispatch_cpu.py [--calls 5000] [--batches 5] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCHEMA = "(Tensor A, Tensor B, Tensor? bias=None, str layout='nn') -> Tensor"


def per_call_us(fn, batches: int, calls: int) -> float:
    for _ in range(calls // 10):
        fn()
    best = float("inf")
    for _ in range(batches):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - t0) / calls * 1e6)
    return best


def cases():
    import torch

    from mamba_forge.runtime import torch_dispatch

    lib = torch.library.Library("mf_dispatch_bench", "DEF")

    def impl(A, B, bias=None, layout="nn"):
        return A.new_empty((A.shape[0], B.shape[1]))

    def setup(ctx, inputs, output):
        ctx.layout = inputs[3]

    def backward(ctx, dC):
        return None, None, None, None

    for name in ("plain", "torch_autograd", "ours"):
        lib.define(name + SCHEMA)
        lib.impl(name, impl, "CPU")
    torch.library.register_autograd("mf_dispatch_bench::torch_autograd", backward, setup_context=setup, lib=lib)
    ops = torch.ops.mf_dispatch_bench
    lib.impl("ours", torch_dispatch.autograd_kernel(ops.ours.default, impl, setup, backward), "Autograd",
             with_keyset=True)
    torch_dispatch.serve_directly(torch._C.DispatchKey.CPU)  # as runtime/torch.py's implement_for does for CUDA
    A, B = torch.randn(1, 1024), torch.randn(1024, 64)
    Ag = A.clone().requires_grad_()  # a call that records a graph (the output and its node dropped at once)
    return lib, {
        "implementation as a function": lambda: impl(A, B, None),
        "op, no autograd kernel": lambda: ops.plain.default(A, B, None),
        "op, register_autograd's kernel": lambda: ops.torch_autograd.default(A, B, None),
        "op, torch_dispatch's kernel": lambda: ops.ours.default(A, B, None),
        "graph: register_autograd's kernel": lambda: ops.torch_autograd.default(Ag, B, None),
        "graph: torch_dispatch's kernel": lambda: ops.ours.default(Ag, B, None),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    lib, runs = cases()
    results: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(a.repeat):
        for name, fn in runs.items():
            results[name].append(per_call_us(fn, a.batches, a.calls))
    print("thread CPU time, us per call: median of runs (each run's fastest batch)")
    for name, v in results.items():
        print(f"{name:34s} {statistics.median(v):7.2f}  ({', '.join(f'{x:.2f}' for x in v)})")
    lib._destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
