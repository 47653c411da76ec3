"""A Mamba-1 layer end to end: mamba_forge.runtime.torch.Mamba against mamba-ssm's Mamba with the same weights
(its fast path when causal-conv1d imports: mamba_inner_fn for prefill, causal_conv1d_update + Triton
selective_state_update for decode), on one GPU in one run (issue 25's goals):

- prefill GPU time at (b1, L2048), (b8, L2048), (b4, L4096), d_model 1024 and 2560: goal our time <= peer / 1.1;
- decode of one token in CUDA graphs at batch 1..256: goal <= peer / 1.2; with our default float32 ssm_state and
  with a bf16 one (allocate_inference_cache(..., ssm_dtype=torch.bfloat16)), as the peer's own cache keeps it;
- every projection GEMM (kernels.gemm, the route's rung) against cuBLAS (torch.matmul) in CUDA graphs at
  M in {1, 4, 16, 64, 256, 2048, 8192, 16384}: goal >= 0.9x;
- host time per layer call (eager, synchronised away) against the peer's.

Appends every figure to benchmarks/results/summary.json.
    python benchmarks/bench_mamba_block.py --bundle h200.tar.gz --key manifests/keys [--smoke]
Peers: benchmarks/peers/build_mamba_ssm.sh (mamba_ssm-2.3.2.post1 and causal_conv1d-1.7.0) builds them in place
under /tmp/peers, or unpacks the extensions benchmarks/peers/prebuild.sh built on a CPU machine for the GPU
machine's torch (.peers/prebuilt/) where they load; this script puts those folders on sys.path.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import bench_parser  # noqa: E402  (benchmarks/common.py)

PEER_ROOT = Path(os.environ.get("MAMBA_PEER_DIR", "/tmp/peers"))


def peer_module():
    """(mamba_ssm Mamba class or None, fast path?, reason)."""
    for name in ("causal_conv1d-1.7.0", "mamba_ssm-2.3.2.post1"):
        if (PEER_ROOT / name).is_dir():
            sys.path.insert(0, str(PEER_ROOT / name))
    try:
        from mamba_ssm.modules import mamba_simple
        from mamba_ssm.modules.mamba_simple import Mamba
    except Exception as exc:  # noqa: BLE001 - the benchmark still runs ours
        return None, False, f"mamba-ssm not importable: {exc}"
    return Mamba, mamba_simple.causal_conv1d_fn is not None, ""


def peer_decode_cache(peer, inference_params_cls, batch: int):
    """The peer's inference cache ready for a decode step at `batch`: its own allocate_inference_cache (zero
    states, as mamba-ssm's generate() makes them) under layer_idx, seqlen_offset 1, so forward() takes step().
    (Filling it by a one-token prefill instead crashed mamba-ssm 2.3.2 + causal-conv1d 1.7.0 on the H200.)"""
    pc = inference_params_cls(max_seqlen=2, max_batch_size=batch)
    pc.key_value_memory_dict[peer.layer_idx] = peer.allocate_inference_cache(batch, 2)
    pc.seqlen_offset = 1
    return pc


def layer_pair(mft, Peer, d_model: int, dtype):
    """(ours, peer): mft.Mamba, prepared, and mamba-ssm's Mamba (None without it) with the same weights, both
    initialised after torch.manual_seed(0), ours first."""
    import torch

    torch.manual_seed(0)
    ours = mft.Mamba(d_model, layer_idx=0, device="cuda", dtype=dtype)
    peer = Peer(d_model, layer_idx=0, device="cuda", dtype=dtype) if Peer is not None else None
    if peer is not None:
        ours.load_state_dict(peer.state_dict())
    ours.prepare()
    return ours, peer


def parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "one small shape, seconds; nothing recorded", signed=True)
    p.add_argument("--d-models", default="1024,2560")
    p.add_argument("--reps", type=int, default=20)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    from common import register_signed
    from summary import append, record
    from timing import capture_graph, median_ms

    import mamba_forge.runtime.torch as mft

    kernels = register_signed(a.bundle, a.key)
    Peer, fast, why = peer_module()
    gpu = torch.cuda.get_device_name()
    bf = torch.bfloat16
    records, rows = [], []
    d_models = [256] if a.smoke else [int(x) for x in a.d_models.split(",")]
    prefill = [(1, 64)] if a.smoke else [(1, 2048), (8, 2048), (4, 4096)]
    decode = [1, 8] if a.smoke else [1, 4, 16, 64, 256]
    reps = 3 if a.smoke else a.reps
    peer_name = f"mamba-ssm 2.3.2 Mamba ({'fast path, causal-conv1d 1.7.0' if fast else 'without causal-conv1d'})"

    def show(row):  # printed as measured, so a run cut short keeps what it measured
        rows.append(row)
        what, shape, t_o, t_p = row
        ratio = f"{t_p / t_o:.2f}x" if t_p else "-"
        print(f"{what:22s} {shape:40s} ours {t_o * 1e3:9.1f} us  peer {t_p * 1e3 if t_p else float('nan'):9.1f} us  "
              f"{ratio}", flush=True)

    def rec(**kw):
        if not a.smoke:
            records.append(record(gpu=gpu, **kw))

    for dm in d_models:
        ours, peer = layer_pair(mft, Peer, dm, bf)
        pc = None
        with torch.no_grad():
            for b, L in prefill:
                h = torch.randn(b, L, dm, device="cuda", dtype=bf)
                t_ours = median_ms(lambda h=h, m=ours: m(h), reps)
                t_peer = median_ms(lambda h=h, m=peer: m(h), reps) if peer is not None else None
                shape = f"d{dm} b{b} L{L}"
                show(("prefill", shape, t_ours, t_peer))
                rec(family="mamba_block", symbol="Mamba prefill", shape=shape, dtype="bf16", ours=t_ours,
                    baseline=t_peer, baseline_name=peer_name, unit="ms", goal=">= 1.1x peer speed",
                    met=bool(t_peer and t_peer / t_ours >= 1.1))
            for b in decode:
                h = torch.randn(b, 1, dm, device="cuda", dtype=bf)
                t_state = {}
                # the default float32 ssm_state, and a bf16 one as the peer's own cache keeps it (half the bytes)
                for ssm_dtype in (torch.float32, bf):
                    oc = mft.InferenceParams(2, b)
                    oc.key_value_memory_dict[0] = ours.allocate_inference_cache(b, 2, dtype=bf, ssm_dtype=ssm_dtype)
                    ours(h, inference_params=oc)
                    oc.seqlen_offset = 1
                    g = capture_graph(lambda h=h, oc=oc, m=ours: m(h, inference_params=oc), 10)
                    t_state[ssm_dtype] = median_ms(g.replay, reps) / 10
                t_ours = t_state[torch.float32]
                t_peer = None
                if peer is not None:
                    from mamba_ssm.utils.generation import InferenceParams as PI

                    try:
                        pc = peer_decode_cache(peer, PI, b)
                        peer(h, inference_params=pc)
                        gp = capture_graph(lambda h=h, pc=pc, m=peer: m(h, inference_params=pc), 10)
                        t_peer = median_ms(gp.replay, reps) / 10
                    except Exception as exc:  # noqa: BLE001 - the peer's decode path failing is a finding, not ours
                        print(f"peer decode at batch {b} failed: {type(exc).__name__}: {exc}")
                        traceback.print_exc(limit=-4)
                        pc = None
                shape = f"d{dm} batch{b}"
                show(("decode (graph)", shape, t_ours, t_peer))
                rec(family="mamba_block", symbol="Mamba decode step", shape=shape, dtype="bf16", ours=t_ours,
                    baseline=t_peer, baseline_name=peer_name + " in CUDA graphs", unit="ms",
                    goal=">= 1.2x peer speed", met=bool(t_peer and t_peer / t_ours >= 1.2))
                t16 = t_state[bf]
                show(("decode, bf16 ssm_state", shape, t16, t_peer))
                rec(family="mamba_block", symbol="Mamba decode step, bf16 ssm_state", shape=shape, dtype="bf16",
                    ours=t16, baseline=t_peer, baseline_name=peer_name + " in CUDA graphs (its bf16 ssm_state)",
                    unit="ms", goal=">= 1.2x peer speed", met=bool(t_peer and t_peer / t16 >= 1.2))
            # host time per call (eager): the mean over many calls at batch 1 decode, GPU drained before
            h = torch.randn(1, 1, dm, device="cuda", dtype=bf)
            oc = mft.InferenceParams(2, 1)
            ours(h, inference_params=oc)
            oc.seqlen_offset = 1
            if pc is not None:  # the peer's own batch-1 cache (the decode loop's last one was for its last batch)
                pc = peer_decode_cache(peer, PI, 1)
            host = {}
            for name, fn in (("ours", lambda h=h, oc=oc, m=ours: m(h, inference_params=oc)),
                             *((("peer", lambda h=h, pc=pc, p=peer: p(h, inference_params=pc)),) if pc is not None else ())):
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
                n = 20 if a.smoke else 200
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                host[name] = (time.perf_counter() - t0) / n * 1e3
                torch.cuda.synchronize()
            show(("host per decode call", f"d{dm} batch1", host["ours"], host.get("peer")))
            rec(family="mamba_block", symbol="Mamba decode host time", shape=f"d{dm} batch1", dtype="bf16",
                ours=host["ours"], baseline=host.get("peer"), baseline_name=peer_name + " (eager, host)",
                unit="ms", goal="<= 1.2x peer host time", met=bool(host.get("peer") and host["ours"] <= 1.2 * host["peer"]))
            # projection GEMMs against cuBLAS, GPU time in CUDA graphs
            Ms = [1, 64] if a.smoke else [1, 4, 16, 64, 256, 2048, 8192, 16384]
            w = ours._weights()
            for proj, key in (("in_proj", "in"), ("x_proj", "x"), ("dt_proj", "dt"), ("out_proj", "out")):
                W = w[key]
                for M in Ms:
                    A = torch.randn(M, W.shape[0], device="cuda", dtype=bf)
                    C = torch.empty(M, W.shape[1], device="cuda", dtype=bf)
                    g1 = capture_graph(lambda A=A, W=W, C=C: kernels.gemm(A, W, C), 10)
                    g2 = capture_graph(lambda A=A, W=W, C=C: torch.matmul(A, W, out=C), 10)
                    t_o, t_c = median_ms(g1.replay, reps) / 10, median_ms(g2.replay, reps) / 10
                    shape = f"d{dm} {proj} M{M} N{W.shape[1]} K{W.shape[0]}"
                    show(("gemm", shape, t_o, t_c))
                    rec(family="mamba_block_gemm", symbol=f"{proj} route", shape=shape, dtype="bf16", ours=t_o,
                        baseline=t_c, baseline_name="cuBLAS (torch.matmul) in CUDA graphs", unit="ms",
                        goal=">= 0.9x cuBLAS", met=t_c / t_o >= 0.9)
        ours = peer = None  # free the GPU memory before the next width
        torch.cuda.empty_cache()
    print(f"peer: {peer_name}{'' if Peer else ' — ' + why}")
    if records:
        append(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
