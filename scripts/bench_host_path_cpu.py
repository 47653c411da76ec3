"""Host time per call of the runtime's launch path on the CPU (no GPU): kernels.gemm and a keyword launch, with the
real loader, signatures and contracts of the tests' tiny catalog (tests/runtime_support.py, built with NVRTC), the
tests' fake torch tensors (tests/runtime_fakes.py) and a no-op driver: the real CudaBackend.launch and
gpu.launcher.launch run, and cuda.bindings' cuLaunchKernel is replaced by a function returning CUDA_SUCCESS.
torch's current stream comes from a stand-in module (as on a CUDA build: ``torch.cuda.current_stream`` makes a
Stream object; ``torch._C._cuda_getCurrentRawStream`` returns the raw handle).

Not a benchmark (nothing recorded): a dev tool for issue 25's host-path goal. The H200 figures come from
scripts/profile_host_path.py. Figures are thread-CPU microseconds per call, the median over --batches batches of
--calls calls (the median of those medians over --repeat runs is printed last).

    python scripts/bench_host_path_cpu.py [--calls 2000] [--batches 15] [--repeat 3] [--profile CASE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time
import types
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def _routes():
    """The route table of tests/test_runtime_gemm.py: bf16 nn through the skinny TMA rungs, f32 nn with a bias."""
    skinny = "gemm_bi_nn_sm90a_wgmma_skinny"
    bf16 = [{"symbol": f"{skinny}_m64n32_bf16", "eq_class": "k16", "m_min": 1, "m_max": 16, "needs": {"n": 8, "k": 8}},
            {"symbol": f"{skinny}_m64n64_bf16", "eq_class": "k16", "needs": {"n": 8, "k": 8}}]
    f32 = [{"symbol": "tiny_gemm_f32", "eq_class": "chain", "bias": True}]
    return [{"layout": "nn", "a": "bf16", "b": "bf16", "c": "bf16", "symbols": [r["symbol"] for r in bf16],
             "rungs": bf16},
            {"layout": "nn", "a": "f32", "b": "f32", "c": "f32", "symbols": ["tiny_gemm_f32"], "rungs": f32}]


class _RawStreamGetter:
    """torch._C._cuda_getCurrentRawStream's stand-in: the current stream's raw handle."""

    def __init__(self, handles: dict):
        self.handles = handles

    def __call__(self, device: int) -> int:
        return self.handles[device]


def fake_torch():
    """A torch module stand-in with what the runtime asks of a CUDA build: torch.cuda.current_stream(d) (a Stream
    object made per call, as torch's Python-level Stream.__new__) and torch._C._cuda_getCurrentRawStream(d)."""
    handles = {0: 0x5150}

    class Stream:
        def __init__(self, device):
            self.device_index, self.cuda_stream = device, handles[device]

    def current_stream(device=None):
        return Stream(device or 0)

    current_stream.__module__ = "torch.cuda"  # torch's own, as runtime/streams.py tells it
    return SimpleNamespace(cuda=SimpleNamespace(current_stream=current_stream, is_initialized=lambda: True),
                           _C=SimpleNamespace(_cuda_getCurrentRawStream=_RawStreamGetter(handles)))


def setup(tmp: Path):
    """The loaded tiny Kernels on a backend whose launch is the real CudaBackend.launch over a no-op driver."""
    from runtime_support import GEMM_TOML, FakeBackend, signed_tiny

    from mamba_forge.gpu import core, launcher, tma
    from mamba_forge.gpu import driver as cu
    from mamba_forge.runtime import load
    from mamba_forge.runtime.backend import CudaBackend

    real = core.bindings()
    success = (real.CUresult.CUDA_SUCCESS,)

    drv = types.ModuleType("cuda.bindings.driver")  # a copy of the module whose cuLaunchKernel does nothing
    drv.__dict__.update(real.__dict__)
    drv.cuLaunchKernel = lambda *args: success
    launcher.bindings = lambda: drv
    cu.bindings = lambda: drv

    def encode(ptr, rows, cols, element_bytes, dtype, box, swizzle, l2, name, row_stride=None):  # maps spell the args
        return struct.pack("<QQQQQ", ptr, rows, cols, box[0], box[1]).ljust(tma.TMA_DESC_BYTES, b"\0")

    tma._encode_tiled = encode

    class Backend(FakeBackend):
        launch = CudaBackend.launch

        def get_function(self, module, name):  # what gpu.launcher.launch reads of a driver.Function
            return SimpleNamespace(name=super().get_function(module, name), handle=name)

        def set_max_dynamic_smem(self, fn, nbytes: int) -> None:
            self.smem[fn.name] = nbytes

    backend = Backend()
    backend.cuda, backend._streams = cu, {}
    tiny = signed_tiny(tmp, GEMM_TOML, _routes())
    return load(tiny.manifest, trusted_keys=[tiny.pub], backend=backend)


def cases(kernels):
    from runtime_fakes import FakeTorchTensor as T

    M, N, K = 1, 4096, 1024  # in_proj's shape at d_model 1024, M = 1 (issue 25's H200 profile)
    A, W, C = T.matrix(M, K, dtype="bf16"), T.matrix(K, N, dtype="bf16"), T.matrix(M, N, dtype="bf16")
    a32, w32, c32 = T.matrix(4, 256), T.matrix(256, 512), T.matrix(4, 512)
    bias = T.matrix(512)
    n = 1 << 20
    y, x = T(n), T(n)
    scale = kernels.fn("scale", "f32")
    return {
        "kernels.gemm bf16 M=1 (TMA rung, maps cached)": lambda: kernels.gemm(A, W, C),
        "kernels.gemm f32 M=4 (+bias)": lambda: kernels.gemm(a32, w32, c32, bias=bias),
        "kernels.gemm f32 M=4 (bias None)": lambda: kernels.gemm(a32, w32, c32),
        "keyword launch scale_f32(y, x, a)": lambda: scale(y=y, x=x, a=2.0),
    }


def per_call_us(fn, batches: int, calls: int) -> float:
    for _ in range(calls):
        fn()
    times = []
    for _ in range(batches):
        t0 = time.thread_time()
        for _ in range(calls):
            fn()
        times.append((time.thread_time() - t0) / calls * 1e6)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=15)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", help="print cProfile's top functions for the case whose name starts with this")
    a = ap.parse_args(argv)
    sys.modules["torch"] = fake_torch()  # before any runtime module looks for it
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "mf-cache"  # the loader's verified-body memo: never the user's cache
        cache.mkdir(mode=0o700)
        os.environ["MAMBA_FORGE_CACHE"] = str(cache)
        kernels = setup(Path(tmp))
        runs = cases(kernels)
        if a.profile:
            import cProfile
            import pstats

            fn = next(f for name, f in runs.items() if name.startswith(a.profile))
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(a.calls):
                fn()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(20)
            return 0
        results: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(a.repeat):
            for name, fn in runs.items():
                us = per_call_us(fn, a.batches, a.calls)
                results[name].append(us)
                print(f"run {r + 1}: {name:48s} {us:7.2f} us/call", flush=True)
        print("---- median over runs (thread CPU time, us per call)")
        for name, v in results.items():
            print(f"{name:48s} {statistics.median(v):7.2f}  ({', '.join(f'{x:.2f}' for x in v)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
