"""Train a two-layer Mamba language model on qualified kernels, end to end and bit-reproducibly (issue 24, item 4).

    embedding (one-hot @ E, torch) -> 2 x Block(Mamba)       every launch a kernel of the signed manifest
    -> final RMSNorm, LM head tied to E, cross-entropy    torch, f32 (deterministic: one-hot products, no scatter)
    optimizer: mamba_forge.runtime.torch_optim.AdamW        adamw_step_multi; clipping: grad_sumsq_partial,
                                                            grad_clip_coef, scale_grads_dev (fixed order)

Data: synthetic tokens from a fixed-seed order-2 Markov chain (each pair of tokens has three successors with
probabilities 0.7, 0.2, 0.1: 0.80 nats per token for a model that uses two tokens of context, 3.04 for the best
that uses one (seed 0, vocab 32), ln(vocab) at the start), generated on the CPU, so every machine trains on the
same tokens; step i's batch does not depend on --steps, so a short run's curve is a prefix of a long run's.

    python examples/train_tiny.py --bundle h200.tar.gz                                    # 200 steps
    python examples/train_tiny.py --bundle h200.tar.gz --steps 20 --check-repro --out l.json

The loss curve is written exactly (--out: every step's float32 loss as its bit pattern in hex and as a float, and
the sha256 of the final parameters), so two runs compare bit for bit; --check-repro trains twice in this process
and exits 1 if the curves or the final parameters differ in any bit. torch's own parts run with
torch.use_deterministic_algorithms(True) (CUBLAS_WORKSPACE_CONFIG=:4096:8, TF32 off), so any nondeterministic
torch kernel is an error, not a silent difference.

Exit codes: 0 trained (and with --check-repro, identical twice); 1 the two runs differ; 2 refused, with one line on
stderr saying what to do: no --bundle, a --key that is not one, no torch, no CUDA GPU, a bundle that does not load here, a model
the manifest cannot serve, or a Mamba layer without a backward (its parameters get no gradient).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

BRANCH_PROBS = (0.7, 0.2, 0.1)  # the Markov chain's successor probabilities, per pair of tokens
DTYPES = ("f32", "bf16", "f16")


class Refused(Exception):
    """One line for stderr and exit code 2."""


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} is not a positive integer")
    return v


def _nonneg_float(text: str) -> float:
    v = float(text)
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number >= 0")
    return v


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", help="the signed bundle or manifest to load (required)")
    p.add_argument("--key", help="trusted public key: a .pub file or a folder of them (default: the keys load() "
                                 "trusts, the shipped release keys and your trust folder)")
    p.add_argument("--steps", type=_positive, default=200, help="optimizer steps (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and of the initial weights (default 0)")
    p.add_argument("--out", type=Path, help="write the exact loss curve (JSON) here")
    p.add_argument("--check-repro", action="store_true", help="train twice in-process; exit 1 unless bit-identical")
    p.add_argument("--log-every", type=_positive, default=20, help="print the loss every N steps (default 20)")
    p.add_argument("--dtype", choices=DTYPES, default="f32", help="the blocks' parameter and activation dtype")
    p.add_argument("--d-model", type=_positive, default=128)
    p.add_argument("--d-state", type=_positive, default=16)
    p.add_argument("--vocab", type=_positive, default=32)
    p.add_argument("--seqlen", type=_positive, default=128)
    p.add_argument("--batch", type=_positive, default=16)
    p.add_argument("--lr", type=_nonneg_float, default=3e-3)
    p.add_argument("--weight-decay", type=_nonneg_float, default=0.1)
    p.add_argument("--clip", type=_nonneg_float, default=1.0,
                   help="max gradient norm (0: no clipping; the clipping kernels take f32 gradients: 0 with 16-bit)")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    return parser().parse_args(argv)


# ---- data and the exact curve (plain torch on the CPU; no GPU, no kernels) -------------------------------------

def markov_table(torch, seed: int, vocab: int):
    """The seed's order-2 chain: succ[a, b] = the three successors of the pair (a, b), most likely first."""
    if vocab < len(BRANCH_PROBS):
        raise Refused(f"--vocab {vocab}: the chain needs at least {len(BRANCH_PROBS)} tokens")
    g = torch.Generator().manual_seed(seed)
    k = len(BRANCH_PROBS)
    return torch.stack([torch.randperm(vocab, generator=g)[:k] for _ in range(vocab * vocab)]).view(vocab, vocab, k)


def markov_batches(torch, seed: int, steps: int, batch: int, length: int, vocab: int):
    """[steps, batch, length] tokens (int64, CPU) from the seed's chain: per sequence the first two tokens uniform,
    then token t drawn from the successors of (token t-2, token t-1) with BRANCH_PROBS. Step i's batch comes from
    its own generator (seeded by the seed and i), so a shorter run trains on a prefix of a longer run's data."""
    succ = markov_table(torch, seed, vocab)
    cdf = torch.tensor(BRANCH_PROBS, dtype=torch.float64).cumsum(0)[:-1]
    starts, draws = [], []
    for i in range(steps):
        g = torch.Generator().manual_seed((seed * 1_000_003 + i + 1) % 2**63)
        starts.append(torch.randint(vocab, (batch, 2), generator=g))
        draws.append(torch.rand(batch, length, generator=g, dtype=torch.float64))
    seq = torch.empty(steps * batch, length, dtype=torch.int64)
    seq[:, :2] = torch.cat(starts)[:, : min(2, length)]
    u = torch.cat(draws)
    for t in range(2, length):
        branch = (u[:, t, None] >= cdf).sum(-1)
        seq[:, t] = succ[seq[:, t - 2], seq[:, t - 1], branch]
    return seq.view(steps, batch, length)


def f32_hex(v: float) -> str:
    """The float32 bit pattern of v (exact for a float32 value), as 8 hex digits."""
    return struct.pack(">f", v).hex()


def first_difference(a: list[str], b: list[str]) -> int | None:
    """The first index where two curves of hex patterns differ (a length difference counts); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):  # noqa: B905 - lengths compared below
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ---- the model -------------------------------------------------------------------------------------------------

def build_model(torch, mft, a, dtype):
    """The tiny LM on the CPU, initialised from the seed (torch's CPU generator: the same weights on any machine);
    the caller moves it to the GPU. The Mamba layers refuse here what the registered manifest cannot serve."""
    import functools
    import math

    nn, F = torch.nn, torch.nn.functional

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.vocab, self.dtype = a.vocab, dtype
            self.embedding = nn.Embedding(a.vocab, a.d_model, dtype=dtype)
            self.layers = nn.ModuleList(
                mft.Block(a.d_model, functools.partial(mft.Mamba, d_state=a.d_state, layer_idx=i, dtype=dtype),
                          norm_cls=functools.partial(mft.RMSNorm, eps=1e-5))
                for i in range(2))
            self.norm_f = mft.RMSNorm(a.d_model)
            with torch.no_grad():  # mamba-ssm's _init_weights: embedding N(0, 0.02), out_proj / sqrt(n_layer)
                nn.init.normal_(self.embedding.weight, std=0.02)
                for layer in self.layers:
                    layer.mixer.out_proj.weight /= math.sqrt(len(self.layers))

        def forward(self, tokens):
            h = F.one_hot(tokens, self.vocab).to(self.dtype) @ self.embedding.weight  # embedding rows, exactly
            residual = None
            for layer in self.layers:
                h, residual = layer(h, residual)
            r = residual + h.float()
            y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + self.norm_f.eps) * self.norm_f.weight.float()
            return (y.to(self.dtype) @ self.embedding.weight.t()).float()  # tied head

    return TinyLM()


def loss_of(torch, logits, targets, vocab: int):
    """Mean cross-entropy through a one-hot product (no gather/scatter: deterministic by construction)."""
    onehot = torch.nn.functional.one_hot(targets, vocab).to(torch.float32)
    return -(torch.log_softmax(logits, -1) * onehot).sum(-1).mean()


def param_groups(model, weight_decay: float):
    """Weight decay on matrices only (not on norms, biases, A_log and D: mamba-ssm's _no_weight_decay)."""
    decay, rest = [], []
    for _, p in model.named_parameters():
        (rest if p.dim() < 2 or getattr(p, "_no_weight_decay", False) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def train(torch, mft, kernels, a, data, dtype, device, log=print) -> dict:
    """One training run from the seed; returns the exact curve and the final parameters' digest."""
    from mamba_forge.runtime.torch_optim import AdamW, clip_grad_norm_

    torch.manual_seed(a.seed)
    model = build_model(torch, mft, a, dtype).to(device)
    opt = AdamW(param_groups(model, a.weight_decay), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, kernels=kernels)
    params = [p for p in model.parameters()]
    losses = torch.empty(a.steps, dtype=torch.float32, device=device)
    model.train()
    for i in range(a.steps):
        batch = data[i]
        loss = loss_of(torch, model(batch[:, :-1]), batch[:, 1:], a.vocab)
        opt.zero_grad(set_to_none=True)
        if i == 0:
            try:
                loss.backward()
            except RuntimeError as exc:
                raise Refused(f"the first backward failed: {' '.join(str(exc).split())[:300]}") from None
            missing = [n for n, p in model.named_parameters() if p.grad is None]
            if missing:
                raise Refused(f"{len(missing)} parameters got no gradient ({', '.join(missing[:3])}, ...): the Mamba "
                              "layer has no backward on these kernels; train with a mamba_forge that has the autograd "
                              "layer (mamba_forge.runtime.torch_autograd)")
        else:
            loss.backward()
        if a.clip > 0:
            clip_grad_norm_(params, a.clip, kernels=kernels)
        opt.step()
        losses[i] = loss.detach()
        if (i + 1) % a.log_every == 0 or i == 0 or i + 1 == a.steps:
            log(f"step {i + 1:5d}/{a.steps}  loss {losses[i].item():.4f}")
    curve = [float(x) for x in losses.cpu().tolist()]
    digest = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        digest.update(name.encode())
        digest.update(p.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    del model, opt
    return {"loss": curve, "loss_f32_hex": [f32_hex(x) for x in curve], "params_sha256": digest.hexdigest()}


def _keys(path: Path) -> list[Path]:
    return sorted(path.glob("*.pub")) if path.is_dir() else [path]


def run(a) -> int:
    if not a.bundle:
        raise Refused("--bundle is required: the signed bundle or manifest to load (mamba-forge bundle makes one)")
    if not Path(a.bundle).exists():
        raise Refused(f"--bundle {a.bundle}: no such file or folder")
    if a.key and (not Path(a.key).exists() or not _keys(Path(a.key))):
        raise Refused(f"--key {a.key}: no such key file (or no *.pub in that folder)")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
    try:
        import torch
    except ImportError:
        raise Refused("needs torch (pip install torch, a CUDA build)") from None
    if not torch.cuda.is_available():
        raise Refused(f"needs a CUDA GPU, and torch {torch.__version__} sees none (torch.cuda.is_available() is "
                      "False): run it on the GPU the bundle was qualified for")
    import mamba_forge.runtime.torch as mft
    from mamba_forge.runtime import LoadError, load

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        kernels = load(a.bundle, device=a.device, trusted_keys=_keys(Path(a.key)) if a.key else None)
    except LoadError as exc:
        raise Refused(f"{a.bundle} does not load here: {' '.join(str(exc).split())}") from None
    mft.register(kernels)
    device = torch.device("cuda", a.device)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[a.dtype]
    data = markov_batches(torch, a.seed, a.steps, a.batch, a.seqlen + 1, a.vocab).to(device)
    gpu = torch.cuda.get_device_name(device)
    print(f"train_tiny: {gpu}, 2 x Mamba d_model {a.d_model} d_state {a.d_state} {a.dtype}, vocab {a.vocab}, "
          f"{a.steps} steps of {a.batch} x {a.seqlen} tokens, seed {a.seed}", flush=True)
    try:
        first = train(torch, mft, kernels, a, data, dtype, device, log=lambda s: print(s, flush=True))
        second = None
        if a.check_repro:
            print("train_tiny: --check-repro: the second run", flush=True)
            second = train(torch, mft, kernels, a, data, dtype, device, log=lambda s: None)
    except LoadError as exc:  # LaunchRefused and SymbolUnavailable: what the manifest cannot serve
        raise Refused(" ".join(str(exc).split())) from None
    n = min(10, a.steps)
    print(f"train_tiny: loss {sum(first['loss'][:n]) / n:.4f} -> {sum(first['loss'][-n:]) / n:.4f} (mean of the "
          f"first and last {n} steps); final parameters sha256 {first['params_sha256'][:16]}")
    same = None
    if second is not None:
        at = first_difference(first["loss_f32_hex"], second["loss_f32_hex"])
        same = at is None and first["params_sha256"] == second["params_sha256"]
        if same:
            print(f"train_tiny: repro: two runs gave the same {a.steps} losses and final parameters, bit for bit")
        elif at is not None:
            print(f"train_tiny: repro FAILED: the loss curves first differ at step {at + 1}: "
                  f"{first['loss_f32_hex'][at]} ({first['loss'][at]!r}) vs {second['loss_f32_hex'][at]} "
                  f"({second['loss'][at]!r})")
        else:
            print("train_tiny: repro FAILED: the loss curves agree but the final parameters differ")
    if a.out:
        config = {k: getattr(a, k) for k in ("steps", "seed", "dtype", "d_model", "d_state", "vocab", "seqlen",
                                             "batch", "lr", "weight_decay", "clip")}
        doc = {"example": "train_tiny", "gpu": gpu, "bundle": str(a.bundle), "config": config, **first,
               "repro": same}
        a.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"train_tiny: wrote {a.out}")
    return 1 if same is False else 0


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        return run(a)
    except Refused as exc:
        print(f"train_tiny: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
