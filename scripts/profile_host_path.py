"""Host time per call of the layer's launch paths, under cProfile (issue 25's host-path goal: at most 1.2x
torch.matmul's host time per call). Not a benchmark (nothing recorded): a dev tool that prints, for kernels.gemm at
M = 1 (in_proj's shape at d_model 1024), for torch.ops.mamba_forge.gemm and for one Mamba decode call at batch 1,
the mean host time per call against torch.matmul's (with out=: kernels.gemm's baseline; allocating: the op's) and the
top functions by own time.

    python scripts/profile_host_path.py --bundle h200.tar.gz --key manifests/keys [--calls 2000]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path


def host_us(fn, calls: int, sync) -> float:
    for _ in range(20):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    sync()
    return dt / calls * 1e6


def profile(fn, calls: int, top: int) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    import torch

    import mamba_forge.runtime.torch as mft
    from mamba_forge.runtime import load

    keys = sorted(Path(a.key).glob("*.pub")) if Path(a.key).is_dir() else [Path(a.key)]
    kernels = load(a.bundle, trusted_keys=keys)
    mft.register(kernels)
    bf = torch.bfloat16
    sync = torch.cuda.synchronize
    A = torch.randn(1, 1024, device="cuda", dtype=bf)
    W = torch.randn(1024, 4096, device="cuda", dtype=bf)
    C = torch.empty(1, 4096, device="cuda", dtype=bf)
    layer = mft.Mamba(1024, layer_idx=0, device="cuda", dtype=bf)
    layer.prepare()
    ip = mft.InferenceParams(2, 1)
    h = torch.randn(1, 1, 1024, device="cuda", dtype=bf)
    with torch.no_grad():
        layer(h, inference_params=ip)
        ip.seqlen_offset = 1
        cases = {
            "torch.matmul(out=)": lambda: torch.matmul(A, W, out=C),
            "torch.matmul": lambda: torch.matmul(A, W),  # allocates C, as the op does: the op's baseline
            "kernels.gemm(out=)": lambda: kernels.gemm(A, W, C),
            "torch.ops.mamba_forge.gemm": lambda: torch.ops.mamba_forge.gemm(A, W, None),
            "Mamba decode call (b1)": lambda: layer(h, inference_params=ip),
        }
        for name, fn in cases.items():
            print(f"{name:32s} {host_us(fn, a.calls, sync):8.1f} us per call (host)", flush=True)
        for name in ("kernels.gemm(out=)", "Mamba decode call (b1)"):
            print(f"---- {name}: top {a.top} by own time over {a.calls // 4} calls")
            print(profile(cases[name], a.calls // 4, a.top))
            sync()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
