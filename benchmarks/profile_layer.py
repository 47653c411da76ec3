"""Where a Mamba layer call spends its GPU time: per-kernel time of one mft.Mamba call and of mamba-ssm's Mamba with
the same weights (its fast path where causal-conv1d imports), from torch.profiler's CUDA activity, eager, the
kernels summed per name over a few calls. Not a benchmark (no ratio recorded, no goal): it names the limiter that
bench_mamba_block.py's figures leave open (which projection, the conv, the scan or a copy).

    python benchmarks/profile_layer.py --bundle h200.tar.gz --key manifests/keys [--d-models 1024,2560] [--train]
        [--smoke]

Decode at batch 1, 16 and 256 (one token from a one-token cache, as bench_mamba_block.py's decode), prefill at
(b1, L2048) and (b4, L4096). --train: forward + backward instead (bench_mamba_train.py's step, from a fixed output
gradient) at (b8, L2048). --smoke: d_model 256, batch 1 decode and (b1, L64) prefill (--train: (b2, L128)), two calls
each.
Peers: benchmarks/peers/build_mamba_ssm.sh (as bench_mamba_block.py).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", required=True, help="signed bundle or manifest to load (qualified on this GPU)")
    p.add_argument("--key", required=True, help="trusted public key (file or folder of *.pub)")
    p.add_argument("--d-models", default="1024,2560")
    p.add_argument("--calls", type=int, default=20, help="decode calls profiled per shape (prefill: a quarter)")
    p.add_argument("--top", type=int, default=14, help="kernels listed per call")
    p.add_argument("--train", action="store_true", help="forward + backward at (b8, L2048) instead of inference")
    p.add_argument("--smoke", action="store_true", help="d_model 256, one decode and one prefill shape, 2 calls")
    return p.parse_args(argv)


def per_kernel(title: str, module, h, calls: int, top: int, **kw) -> None:
    """Prints module(h, **kw)'s CUDA kernels under torch.profiler: us per call summed per kernel name, largest first."""
    per_kernel_of(title, lambda: module(h, **kw), calls, top)


def per_kernel_of(title: str, call, calls: int, top: int) -> None:
    """Prints call()'s CUDA kernels under torch.profiler: us per call summed per kernel name, largest first."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    total, count = defaultdict(float), defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total[e.name] += getattr(e, "device_time_total", 0.0) or e.cuda_time_total
            count[e.name] += 1
    print(f"== {title}\n   total {sum(total.values()) / calls:8.1f} us/call")
    for name, us in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"   {us / calls:8.1f} us  x{count[name] / calls:.0f}  {name[:110]}")


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    from bench_mamba_block import layer_pair, peer_decode_cache, peer_module
    from common import register_signed

    import mamba_forge.runtime.torch as mft

    register_signed(a.bundle, a.key)
    Peer, fast, why = peer_module()
    print(f"peer: {'mamba-ssm Mamba, fast path' if fast else 'mamba-ssm Mamba without causal-conv1d' if Peer else why}")
    bf = torch.bfloat16
    d_models = [256] if a.smoke else [int(x) for x in a.d_models.split(",")]
    batches = [1] if a.smoke else [1, 16, 256]
    prefill = [(1, 64)] if a.smoke else [(1, 2048), (4, 4096)]
    calls = 2 if a.smoke else a.calls
    if a.train:
        return train_profile(a, mft, Peer, layer_pair, d_models)
    for dm in d_models:
        ours, peer = layer_pair(mft, Peer, dm, bf)
        with torch.no_grad():
            for b in batches:
                h = torch.randn(b, 1, dm, device="cuda", dtype=bf)
                oc = mft.InferenceParams(2, b)
                ours(h, inference_params=oc)
                oc.seqlen_offset = 1
                per_kernel(f"d{dm} decode batch {b}: ours", ours, h, calls, a.top, inference_params=oc)
                if peer is not None:
                    from mamba_ssm.utils.generation import InferenceParams

                    pc = peer_decode_cache(peer, InferenceParams, b)
                    peer(h, inference_params=pc)
                    per_kernel(f"d{dm} decode batch {b}: peer", peer, h, calls, a.top, inference_params=pc)
            for b, L in prefill:
                h = torch.randn(b, L, dm, device="cuda", dtype=bf)
                n = max(1, calls // 4)
                per_kernel(f"d{dm} prefill b{b} L{L}: ours", ours, h, n, a.top)
                if peer is not None:
                    per_kernel(f"d{dm} prefill b{b} L{L}: peer", peer, h, n, a.top)
        ours = peer = None
        torch.cuda.empty_cache()
    return 0


def train_profile(a, mft, Peer, layer_pair, d_models) -> int:
    """Forward + backward per kernel, ours and the peer's, from the same input and output gradient."""
    import torch
    from bench_mamba_train import fwd_bwd

    bf = torch.bfloat16
    b, L = (2, 128) if a.smoke else (8, 2048)
    calls = 2 if a.smoke else max(2, a.calls // 4)
    for dm in d_models:
        ours, peer = layer_pair(mft, Peer, dm, bf)
        g = torch.Generator(device="cuda").manual_seed(dm)
        h = torch.randn(b, L, dm, device="cuda", dtype=bf, generator=g)
        dout = torch.randn(b, L, dm, device="cuda", dtype=bf, generator=g)
        for name, model in (("ours", ours), ("peer", peer)):
            if model is not None:
                per_kernel_of(f"d{dm} forward+backward b{b} L{L}: {name}", fwd_bwd(model, h, dout)[0], calls, a.top)
        ours = peer = None
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
