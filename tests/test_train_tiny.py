"""examples/train_tiny.py without a GPU: --help and the arguments (with no torch importable at all), the refusals
(exit 2, one line on stderr: no bundle, no key, no torch, no GPU), and its host-side parts (the fixed-seed
Markov-chain data, the exact loss-curve encoding and comparison). The training itself runs on the GPU:
tests/gpu/test_train_tiny_gpu.py."""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "train_tiny.py"


def _module():
    spec = importlib.util.spec_from_file_location("_train_tiny", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(args, tmp_path, *, no_torch=False, timeout=120):
    """The script in a fresh interpreter (cwd: a temporary folder); no_torch puts a torch that cannot be imported
    first on the path."""
    path = [str(ROOT)]
    if no_torch:
        stub = tmp_path / "stub"
        stub.mkdir(exist_ok=True)
        (stub / "torch.py").write_text("raise ImportError('no torch here (test stub)')\n")
        path.insert(0, str(stub))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=timeout)


def _one_line_refusal(res) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("train_tiny: "), res.stderr
    return lines[0]


def test_help_needs_no_torch(tmp_path):
    res = _run(["--help"], tmp_path, no_torch=True)
    assert res.returncode == 0, res.stderr
    for opt in ("--bundle", "--key", "--steps", "--seed", "--out", "--check-repro", "--log-every", "--dtype"):
        assert opt in res.stdout


def test_arguments_and_their_defaults():
    mod = _module()
    a = mod.parse_args(["--bundle", "b.tar.gz", "--key", "k.pub"])
    assert (a.steps, a.seed, a.out, a.check_repro, a.dtype, a.clip, a.log_every) == (200, 0, None, False, "f32", 1.0, 20)
    a = mod.parse_args(["--steps", "20", "--seed", "7", "--out", "l.json", "--check-repro", "--dtype", "bf16",
                        "--clip", "0"])
    assert (a.steps, a.seed, str(a.out), a.check_repro, a.dtype, a.clip) == (20, 7, "l.json", True, "bf16", 0.0)


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--steps", "x"], ["--log-every", "0"], ["--dtype", "f64"],
                                  ["--clip", "-1"], ["--lr", "nan"], ["--batch", "-2"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _module().parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("args, needs, says", [
    ([], [], "--bundle is required"),
    (["--bundle", "missing.tar.gz", "--key", "k.pub"], [], "--bundle missing.tar.gz: no such file"),
    (["--bundle", "b.tar.gz", "--key", "keys"], ["b.tar.gz", "keys/"], "--key keys: no such key file"),
])
def test_refuses_without_a_bundle_or_key(tmp_path, args, needs, says):
    for name in needs:
        (tmp_path / name).mkdir() if name.endswith("/") else (tmp_path / name).write_bytes(b"x")
    line = _one_line_refusal(_run(args, tmp_path, no_torch=True))  # refused before torch is even imported
    assert says in line


def test_the_key_is_optional_the_default_trust_applies(tmp_path):
    """Without --key the bundle is checked against what load() trusts by default (the shipped release keys, the
    user's trust folder): the script goes on to its next requirement (torch, here absent)."""
    (tmp_path / "b.tar.gz").write_bytes(b"x")
    line = _one_line_refusal(_run(["--bundle", "b.tar.gz"], tmp_path, no_torch=True))
    assert "needs torch" in line


def test_refuses_without_torch(tmp_path):
    (tmp_path / "b.tar.gz").write_bytes(b"x")
    (tmp_path / "k.pub").write_text("ed25519 x\n")
    line = _one_line_refusal(_run(["--bundle", "b.tar.gz", "--key", "k.pub"], tmp_path, no_torch=True))
    assert "needs torch" in line


def test_refuses_without_a_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU refusal cannot be seen here")
    (tmp_path / "b.tar.gz").write_bytes(b"x")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "k.pub").write_text("ed25519 x\n")
    line = _one_line_refusal(_run(["--bundle", "b.tar.gz", "--key", "keys", "--steps", "3"], tmp_path))
    assert "needs a CUDA GPU" in line and "torch.cuda.is_available() is False" in line


def test_markov_batches_are_fixed_by_the_seed_and_follow_the_chain():
    torch = pytest.importorskip("torch")
    mod = _module()
    a = mod.markov_batches(torch, 3, 4, 16, 50, 16)
    assert a.shape == (4, 16, 50) and a.dtype == torch.int64 and int(a.min()) >= 0 and int(a.max()) < 16
    assert torch.equal(a, mod.markov_batches(torch, 3, 4, 16, 50, 16))  # the same seed, the same tokens
    assert torch.equal(a[:2], mod.markov_batches(torch, 3, 2, 16, 50, 16))  # a shorter run: a prefix
    assert not torch.equal(a, mod.markov_batches(torch, 4, 4, 16, 50, 16))
    assert not torch.equal(a[0], a[1])
    # order 2: each (t-2, t-1) pair has at most three successors, the most frequent about 70% of the time
    big = mod.markov_batches(torch, 3, 20, 100, 40, 8).view(-1, 40)
    follow: dict[tuple[int, int], list[int]] = {}
    for row in big.tolist():
        for x, y, z in zip(row, row[1:], row[2:]):  # noqa: B905
            follow.setdefault((x, y), []).append(z)
    assert len(follow) == 64
    top = []
    for (x, y), succ in follow.items():
        assert set(succ) <= set(mod.markov_table(torch, 3, 8)[x, y].tolist())
        top.append(max(succ.count(s) for s in set(succ)) / len(succ))
    assert abs(sum(top) / len(top) - 0.7) < 0.03
    # one token of context does not tell the next: its successors spread over most of the vocabulary
    assert min(len({z for (x, y), s in follow.items() if y == b for z in s}) for b in range(8)) >= 6
    with pytest.raises(mod.Refused, match="at least 3 tokens"):
        mod.markov_batches(torch, 0, 1, 2, 5, 2)


def test_curves_are_compared_bit_for_bit():
    mod = _module()
    assert mod.f32_hex(1.0) == "3f800000" and mod.f32_hex(-2.5) == "c0200000"
    x = 3.4657359  # ln(32), as a float32
    import struct
    x32 = struct.unpack("<f", struct.pack("<f", x))[0]
    nxt = struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", x32))[0] + 1))[0]
    assert mod.f32_hex(x32) != mod.f32_hex(nxt) and math.isclose(x32, nxt, rel_tol=1e-6)  # one ulp apart: seen
    a = [mod.f32_hex(v) for v in (x32, 2.0, 1.5)]
    assert mod.first_difference(a, list(a)) is None
    assert mod.first_difference(a, [a[0], mod.f32_hex(nxt), a[2]]) == 1
    assert mod.first_difference(a, a[:2]) == 2


def test_the_model_refuses_what_the_manifest_cannot_serve():
    """The tiny LM's Mamba layers are checked against the registered kernels when it is built (the layer's own
    refusal, before any training): a manifest without the token scan refuses it."""
    torch = pytest.importorskip("torch")
    import mamba_forge.runtime.torch as mft
    from mamba_forge.runtime.errors import SymbolUnavailable

    class NoScan:
        def fn(self, family, dtype=None):
            raise SymbolUnavailable(family, f"{family}_{dtype} is not in this manifest")

    mod = _module()
    saved = mft._state["kernels"]
    mft._state["kernels"] = NoScan()
    try:
        with pytest.raises(SymbolUnavailable, match="not in this manifest"):
            mod.build_model(torch, mft, mod.parse_args([]), torch.float32)
    finally:
        mft._state["kernels"] = saved


# ---- the training loop on the CPU: a pure-torch Mamba stands in for the layer, the float64 references for the
# optimizer's kernels (tests/test_torch_optim.py), so none of it depends on the layer's own backward ------------

def _torch_mamba_namespace(torch, detach=False):
    """Block, Mamba, RMSNorm with mamba_forge.runtime.torch's constructors, computed by plain differentiable torch
    (mamba-ssm's slow path); detach=True: a mixer whose output carries no gradient (a layer without a backward)."""
    nn, F = torch.nn, torch.nn.functional

    class Mamba(nn.Module):
        def __init__(self, d_model, d_state=16, layer_idx=None, dtype=None):
            super().__init__()
            self.d_inner, self.d_state, self.dt_rank = 2 * d_model, d_state, math.ceil(d_model / 16)
            self.in_proj = nn.Linear(d_model, 2 * self.d_inner, bias=False, dtype=dtype)
            self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, 4, groups=self.d_inner, padding=3, dtype=dtype)
            self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False, dtype=dtype)
            self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, dtype=dtype)
            self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0).repeat(self.d_inner, 1)))
            self.A_log._no_weight_decay = True
            self.D = nn.Parameter(torch.ones(self.d_inner))
            self.out_proj = nn.Linear(self.d_inner, d_model, bias=False, dtype=dtype)

        def forward(self, h):
            b, L, _ = h.shape
            x, z = (h @ self.in_proj.weight.T).transpose(1, 2).chunk(2, 1)
            x = F.silu(self.conv1d(x)[..., :L])
            dt, B, C = torch.split(x.transpose(1, 2) @ self.x_proj.weight.T, [self.dt_rank, self.d_state, self.d_state], -1)
            dt = F.softplus(dt @ self.dt_proj.weight.T + self.dt_proj.bias).transpose(1, 2)
            dA = torch.exp(dt[..., None] * -torch.exp(self.A_log)[None, :, None, :])
            dBx = (dt * x)[..., None] * B[:, None, :, :]
            s, ys = torch.zeros(b, self.d_inner, self.d_state), []
            for t in range(L):
                s = dA[:, :, t] * s + dBx[:, :, t]
                ys.append((s * C[:, None, t, :]).sum(-1))
            y = ((torch.stack(ys, -1) + self.D[None, :, None] * x) * F.silu(z)).transpose(1, 2) @ self.out_proj.weight.T
            return y.detach() if detach else y

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-5):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    class Block(nn.Module):
        def __init__(self, dim, mixer_cls, norm_cls=RMSNorm):
            super().__init__()
            self.mixer, self.norm = mixer_cls(dim), norm_cls(dim)

        def forward(self, h, residual=None):
            residual = h.float() if residual is None else residual + h.float()
            n = residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + self.norm.eps) * self.norm.weight
            return self.mixer(n.to(h.dtype)), residual

    from types import SimpleNamespace
    return SimpleNamespace(Block=Block, Mamba=Mamba, RMSNorm=RMSNorm)


def _tiny_args(mod):
    return mod.parse_args(["--steps", "6", "--d-model", "16", "--d-state", "4", "--vocab", "8", "--seqlen", "12",
                           "--batch", "4", "--lr", "1e-2", "--log-every", "2"])


def test_the_training_loop_is_reproducible_on_cpu_stand_ins():
    torch = pytest.importorskip("torch")
    from test_torch_optim import _RefKernels

    mod = _module()
    a = _tiny_args(mod)
    data = mod.markov_batches(torch, a.seed, a.steps, a.batch, a.seqlen + 1, a.vocab)
    ns = _torch_mamba_namespace(torch)
    runs, logs = [], []
    for _ in range(2):
        kern = _RefKernels()
        runs.append(mod.train(torch, ns, kern, a, data, torch.float32, torch.device("cpu"), log=logs.append))
        families = {c[0] for c in kern.calls}
        assert families == {"adamw_step_multi", "grad_sumsq_partial", "grad_clip_coef", "scale_grads_dev"}
        assert sum(c[0] == "adamw_step_multi" for c in kern.calls) == 2 * a.steps  # two groups (decay, no decay)
    first, second = runs
    assert first == second  # curves (floats and float32 bit patterns) and the final parameters' digest
    assert len(first["loss_f32_hex"]) == a.steps and all(math.isfinite(x) for x in first["loss"])
    assert abs(first["loss"][0] - math.log(a.vocab)) < 0.2 and first["loss"][-1] < first["loss"][0]
    assert [line.split()[1] for line in logs[:4]] == ["1/6", "2/6", "4/6", "6/6"]
    a.seed = 1
    other = mod.train(torch, ns, _RefKernels(), a, data, torch.float32, torch.device("cpu"), log=lambda s: None)
    assert other["params_sha256"] != first["params_sha256"]  # another seed: other initial weights


def test_a_layer_without_a_backward_is_refused_on_the_first_step():
    torch = pytest.importorskip("torch")
    from test_torch_optim import _RefKernels

    mod = _module()
    a = _tiny_args(mod)
    data = mod.markov_batches(torch, a.seed, a.steps, a.batch, a.seqlen + 1, a.vocab)
    kern = _RefKernels()
    with pytest.raises(mod.Refused, match="parameters got no gradient .*layers.0.mixer.*no backward"):
        mod.train(torch, _torch_mamba_namespace(torch, detach=True), kern, a, data, torch.float32,
                  torch.device("cpu"), log=lambda s: None)
    assert kern.calls == []  # refused before the optimizer ran
