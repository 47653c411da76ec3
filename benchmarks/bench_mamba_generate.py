"""Text generation end to end: mamba_forge.runtime.torch.MambaLMHeadModel.generate against mamba-ssm's
MambaLMHeadModel.generate with the same weights (random, the published models' widths), both with cg=True (each
decode step replayed from a CUDA graph), greedy, bf16, on one GPU in one run:

- prefill: generate(prompt, max_length = prompt + 1), wall time (the prompt's forward, one sample, host included);
  goal our time <= peer / 1.1 (issue 25's prefill goal);
- decode: (generate to prompt + N) - (generate to prompt + 1), per new token, wall time; goal <= peer / 1.2
  (issue 25's decode goal); the first call of each batch size captures its graphs and is not timed; the same
  without CUDA graphs (cg=False, EAGER_TOKENS new tokens: each step's host time, which graphs take away);
- agreement: the fraction of greedy tokens equal to the peer's (they part at near-ties of bf16 logits; reported,
  not a goal).

Models (d_model, n_layer): mamba-130m (768, 24), mamba-370m (1024, 48), mamba-790m (1536, 48), mamba-1.4b (2048,
48), mamba-2.8b (2560, 64); vocabulary 50277 (padded to 50280). Appends every figure to
benchmarks/results/summary.json.
    python benchmarks/bench_mamba_generate.py --bundle h200.tar.gz --key manifests/keys [--smoke]
Peers: as benchmarks/bench_mamba_block.py (mamba-ssm with causal-conv1d from /tmp/peers; transformers, einops and
Triton from the machine's image).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import bench_parser  # noqa: E402  (benchmarks/common.py)

MODELS = {"mamba-130m": (768, 24), "mamba-370m": (1024, 48), "mamba-790m": (1536, 48), "mamba-1.4b": (2048, 48),
          "mamba-2.8b": (2560, 64)}
VOCAB = 50277
EAGER_TOKENS = 32  # new tokens of the eager (cg=False) decode figure: its steps are host-bound, so fewer suffice


def peer_model_class():
    """(mamba-ssm's MambaLMHeadModel and MambaConfig, or None, None and why)."""
    from bench_mamba_block import peer_module

    _, fast, why = peer_module()  # puts the peers' folders on sys.path
    try:
        from mamba_ssm.models.config_mamba import MambaConfig
        from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel
    except Exception as exc:  # noqa: BLE001 - the benchmark still runs ours
        return None, None, f"mamba-ssm's MambaLMHeadModel not importable: {exc} {why}".strip()
    return MambaLMHeadModel, MambaConfig, "" if fast else "without causal-conv1d"


def wall_ms(fn, reps: int) -> float:
    """Median wall milliseconds of fn() with the GPU drained before and after each call."""
    import torch

    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def parser() -> argparse.ArgumentParser:
    p = bench_parser(__doc__, "mamba-130m, batch 1, 16 new tokens; nothing recorded", signed=True)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated names of " + ", ".join(MODELS))
    p.add_argument("--batches", default="1,16")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    return p


def parse_args(argv=None) -> argparse.Namespace:
    a = parser().parse_args(argv)
    unknown = [m for m in a.models.split(",") if m not in MODELS]
    if unknown:
        parser().error(f"--models: {', '.join(unknown)} not among {', '.join(MODELS)}")
    if a.prompt < 1 or a.new_tokens < 2 or a.reps < 1:
        parser().error("--prompt >= 1, --new-tokens >= 2, --reps >= 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch
    from common import register_signed
    from summary import append, record

    import mamba_forge.runtime.torch as mft

    register_signed(a.bundle, a.key)
    Peer, PeerConfig, why = peer_model_class()
    gpu = torch.cuda.get_device_name()
    models = ["mamba-130m"] if a.smoke else a.models.split(",")
    batches = [1] if a.smoke else [int(b) for b in a.batches.split(",")]
    prompt, new = (64, 16) if a.smoke else (a.prompt, a.new_tokens)
    reps = 2 if a.smoke else a.reps
    peer_name = f"mamba-ssm 2.3.2 MambaLMHeadModel.generate(cg=True){' ' + why if why else ''}"
    records = []

    def show(what, shape, t_o, t_p, extra=""):
        ratio = f"{t_p / t_o:.2f}x" if t_p else "-"
        print(f"{what:8s} {shape:34s} ours {t_o:9.2f} ms  peer {t_p if t_p else float('nan'):9.2f} ms  {ratio} {extra}",
              flush=True)

    for name in models:
        d_model, n_layer = MODELS[name]
        torch.manual_seed(0)
        peer = None
        if Peer is not None:
            peer = Peer(PeerConfig(d_model=d_model, n_layer=n_layer, vocab_size=VOCAB), device="cuda",
                        dtype=torch.bfloat16).eval()
        ours = mft.MambaLMHeadModel(mft.MambaConfig(d_model=d_model, n_layer=n_layer, vocab_size=VOCAB),
                                    device="cuda", dtype=torch.bfloat16).eval()
        if peer is not None:
            ours.load_state_dict(peer.state_dict())
        for b in batches:
            g = torch.Generator(device="cuda").manual_seed(b)
            ids = torch.randint(0, VOCAB, (b, prompt), generator=g, device="cuda")
            t, seqs = {}, {}
            eager_new = min(new, EAGER_TOKENS)
            for who, m in (("ours", ours), ("peer", peer)):
                if m is None:
                    continue
                seqs[who] = m.generate(ids, prompt + new, cg=True)  # captures this batch size's graphs
                first = wall_ms(lambda m=m, ids=ids: m.generate(ids, prompt + 1, cg=True), reps)
                whole = wall_ms(lambda m=m, ids=ids: m.generate(ids, prompt + new, cg=True), reps)
                eager = wall_ms(lambda m=m, ids=ids, n=eager_new: m.generate(ids, prompt + n), reps)
                t[who] = (first, (whole - first) / (new - 1), (eager - first) / (eager_new - 1))
            shape = f"{name} batch{b} prompt{prompt}"
            agree = ""
            if "peer" in seqs:
                same = (seqs["ours"][:, prompt:] == seqs["peer"][:, prompt:]).float().mean()
                agree = f"greedy tokens equal to the peer's: {float(same):.3f}"
            tp = t.get("peer", (None, None, None))
            rows = (("prefill", "MambaLMHeadModel prefill", shape, 0, 1.1, peer_name),
                    ("decode", "MambaLMHeadModel decode per token", shape + f" new{new}", 1, 1.2, peer_name),
                    ("eager", "MambaLMHeadModel decode per token, eager", shape + f" new{eager_new}", 2, 1.2,
                     peer_name.replace("cg=True", "cg=False")))
            for what, symbol, row_shape, i, goal, base in rows:
                show(what, row_shape, t["ours"][i], tp[i], agree if i == 1 else "")
                if not a.smoke:
                    records.append(record(family="mamba_generate", symbol=symbol, shape=row_shape, dtype="bf16",
                                          ours=t["ours"][i], baseline=tp[i], baseline_name=base, unit="ms",
                                          goal=f">= {goal}x peer speed", met=bool(tp[i] and tp[i] / t["ours"][i] >= goal),
                                          gpu=gpu))
        ours = peer = None
        torch.cuda.empty_cache()
    print(f"peer: {peer_name}{'' if Peer else ' — ' + why}")
    if records:
        append(records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
