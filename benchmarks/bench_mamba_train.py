"""One Mamba-1 layer's forward + backward: mamba_forge.runtime.torch.Mamba against mamba-ssm's Mamba with the same
weights (load_state_dict; its fast path when causal-conv1d imports: mamba_inner_fn), bf16, on one GPU in one run
(issue 24):

- GPU time of forward + backward (the input's gradient and every parameter's, from a fixed output gradient) at
  d_model 1024 and 2560, shapes (b8, L2048) and (b4, L4096): goal ours <= 1.0x the peer's time (stretch 0.8x);
- gradient determinism: forward + backward 10 times on the same input and output gradient; the number of gradient
  elements (input and parameters) that differ in any bit from the first run in any later run, for the peer and
  for ours: goal 0 for ours.

Appends every figure to benchmarks/results/summary.json (a peer that fails is recorded as failed, and the run goes
on); --smoke: one small shape, seconds, nothing recorded. Exits 2, with one line, when our layer has no backward
(a parameter or the input gets no gradient): there is nothing to measure.
    python benchmarks/bench_mamba_train.py --bundle h200.tar.gz --key manifests/keys [--smoke]
Peers: as benchmarks/bench_mamba_block.py (benchmarks/peers/build_mamba_ssm.sh; MAMBA_PEER_DIR, default /tmp/peers).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import bench_parser  # noqa: E402  (benchmarks/common.py)

TIME_GOAL = 1.0  # ours / peer GPU time
TIME_STRETCH = 0.8


def _shapes(text: str) -> list[tuple[int, int]]:
    try:
        out = [tuple(int(x) for x in item.lower().split("x")) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: shapes are BxL items, e.g. 8x2048,4x4096") from None
    if not out or any(len(s) != 2 or min(s) < 1 for s in out):
        raise argparse.ArgumentTypeError(f"{text!r}: shapes are BxL items with B, L >= 1, e.g. 8x2048,4x4096")
    return out  # type: ignore[return-value]


def _ints(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of integers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: positive integers")
    return out


def parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "one small shape, seconds; nothing recorded", signed=True)
    p.add_argument("--d-models", type=_ints, default=[1024, 2560])
    p.add_argument("--shapes", type=_shapes, default=[(8, 2048), (4, 4096)], help="BxL items (default 8x2048,4x4096)")
    p.add_argument("--reps", type=int, default=20, help="timed forward+backward calls per figure (median)")
    p.add_argument("--runs", type=int, default=10, help="backward runs compared for gradient determinism")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = parser()
    a = p.parse_args(argv)
    if a.smoke:
        a.d_models, a.shapes, a.reps, a.runs = [256], [(2, 128)], 3, 3
    elif a.reps < 5 or a.runs < 2:
        p.error("--reps must be at least 5 and --runs at least 2")
    return a


def _bits(t):
    import torch

    return t.detach().contiguous().view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def fwd_bwd(model, h, dout):
    """(step, x): step() runs model(x).backward(dout) from cleared gradients (x: h as a leaf requiring grad)."""
    x = h.detach().clone().requires_grad_(True)

    def step():
        model.zero_grad(set_to_none=True)
        x.grad = None
        model(x).backward(dout)

    return step, x


def missing_grads(model, x) -> list[str]:
    """What got no gradient after a backward: the input and the parameters, by name."""
    out = [] if x.grad is not None else ["the input"]
    return out + [n for n, p in model.named_parameters() if p.grad is None]


def gradient_differences(model, h, dout, runs: int) -> tuple[int, int]:
    """(elements differing in any bit from run 1 in any later run, elements compared): the input's gradient and
    every parameter's, over `runs` forward + backward runs on the same input and output gradient."""
    import torch

    step, x = fwd_bwd(model, h, dout)
    ref, masks = None, None
    for _ in range(runs):
        step()
        grads = [x.grad] + [p.grad for _, p in sorted(model.named_parameters()) if p.grad is not None]
        bits = [_bits(g) for g in grads]
        if ref is None:
            ref = [b.clone() for b in bits]
            masks = [torch.zeros(b.shape, dtype=torch.bool, device=b.device) for b in bits]
        else:
            if len(bits) != len(ref):
                raise RuntimeError("a later run produced gradients for other parameters than the first")
            for m, a, b in zip(masks, bits, ref, strict=True):
                m |= a != b
    return sum(int(m.sum()) for m in masks), sum(m.numel() for m in masks)


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    from bench_mamba_block import peer_module
    from common import register_signed
    from summary import append, record
    from timing import median_ms

    import mamba_forge.runtime.torch as mft

    register_signed(a.bundle, a.key)
    Peer, fast, why = peer_module()
    gpu = torch.cuda.get_device_name()
    bf = torch.bfloat16
    peer_name = f"mamba-ssm 2.3.2 Mamba ({'fast path, causal-conv1d 1.7.0' if fast else 'without causal-conv1d'})"
    records = []

    def rec(**kw):
        if not a.smoke:
            records.append(record(gpu=gpu, **kw))

    def failed(exc: BaseException) -> str:
        return f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"

    try:
        for dm in a.d_models:
            torch.manual_seed(0)
            ours = mft.Mamba(dm, layer_idx=0, device="cuda", dtype=bf)
            peer, peer_problem = None, "" if Peer is not None else why
            if Peer is not None:
                try:
                    peer = Peer(dm, layer_idx=0, device="cuda", dtype=bf)
                    ours.load_state_dict(peer.state_dict())
                except Exception as exc:  # noqa: BLE001 - the peer failing is a finding; ours is still measured
                    peer, peer_problem = None, f"construction failed: {failed(exc)}"
                    print(f"peer d{dm}: {peer_problem}", flush=True)
            for b, L in a.shapes:
                shape = f"d{dm} b{b} L{L}"
                g = torch.Generator(device="cuda").manual_seed(1000 * dm + b * L)
                h = torch.randn(b, L, dm, device="cuda", dtype=bf, generator=g)
                dout = torch.randn(b, L, dm, device="cuda", dtype=bf, generator=g)
                step, x = fwd_bwd(ours, h, dout)
                try:
                    step()
                    missing = missing_grads(ours, x)
                except RuntimeError as exc:
                    missing = [f"backward failed: {failed(exc)}"]
                if missing:
                    print(f"bench_mamba_train: our Mamba layer has no backward here ({', '.join(missing[:3])}"
                          f"{', ...' if len(missing) > 3 else ''}): nothing to measure; run it with the autograd "
                          "layer (mamba_forge.runtime.torch_autograd)", file=sys.stderr)
                    return 2
                t_ours = median_ms(step, a.reps)
                t_peer, note = None, peer_problem
                if peer is not None:
                    try:
                        t_peer = median_ms(fwd_bwd(peer, h, dout)[0], a.reps)
                    except Exception as exc:  # noqa: BLE001
                        note = f"failed: {failed(exc)}"
                ratio = f"{t_ours / t_peer:.2f}x the peer's time" if t_peer else f"peer: {note or 'none'}"
                print(f"fwd+bwd {shape:18s} ours {t_ours:8.3f} ms  peer "
                      f"{t_peer if t_peer else float('nan'):8.3f} ms  {ratio}", flush=True)
                rec(family="mamba_train", symbol="Mamba forward+backward", shape=shape, dtype="bf16", ours=t_ours,
                    baseline=t_peer, baseline_name=peer_name + (f" ({note})" if note else ""), unit="ms",
                    goal=f"<= {TIME_GOAL}x peer time (stretch {TIME_STRETCH}x)",
                    met=bool(t_peer and t_ours <= TIME_GOAL * t_peer))
                d_ours, total = gradient_differences(ours, h, dout, a.runs)
                d_peer, det_note = None, peer_problem
                if peer is not None:
                    try:
                        d_peer, _ = gradient_differences(peer, h, dout, a.runs)
                    except Exception as exc:  # noqa: BLE001
                        det_note = f"failed: {failed(exc)}"
                print(f"determinism {shape:14s} differing gradient elements over {a.runs} runs (of {total}): ours "
                      f"{d_ours}  peer {d_peer if d_peer is not None else det_note or 'none'}", flush=True)
                rec(family="mamba_train", symbol="Mamba backward determinism", shape=f"{shape} runs{a.runs}",
                    dtype="bf16", ours=d_ours, baseline=d_peer,
                    baseline_name=f"{peer_name}: gradient elements (of {total}) differing from run 1 in any of "
                                  f"{a.runs} runs" + (f" ({det_note})" if det_note else ""),
                    unit="elements", goal="0 (bit-identical gradients run to run)", met=d_ours == 0)
                del h, dout, step, x
            ours = peer = None  # free the GPU memory before the next width
            torch.cuda.empty_cache()
    finally:
        if records:
            append(records)
    print(f"peer: {peer_name}{'' if Peer else ' — ' + why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
