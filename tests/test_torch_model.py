"""mamba-ssm's language model on our layers (mamba_forge.runtime.torch.MambaLMHeadModel) on the CPU, where torch is
installed: mamba-ssm's names and initialisation, the logits against a float64 transcription of mamba-ssm's model,
generate (greedy decode steps equal to a full prefill bit for bit, teacher forcing, stopping, sampling filters), the
checkpoint files (round trip, and every refusal of a hostile or foreign one), with the kernels stood in for by our
float64 references (tests/torch_standins.py; tests/gpu/test_mamba_lm_gpu.py runs the real kernels)."""

from __future__ import annotations

import json
import math
import os

import pytest

from mamba_forge.runtime.errors import LaunchRefused

torch = pytest.importorskip("torch")
F = torch.nn.functional


@pytest.fixture(scope="module")
def mft():
    from torch_standins import register_cpu

    return register_cpu()


def _config(mft, **kw):
    base = dict(d_model=32, n_layer=2, vocab_size=50, ssm_cfg={"d_state": 8})
    return mft.MambaConfig(**{**base, **kw})


def _model(mft, seed=0, **kw):
    torch.manual_seed(seed)
    m = mft.MambaLMHeadModel(_config(mft, **kw), dtype=torch.float32)
    with torch.no_grad():  # non-trivial norm weights and D, so a wiring error shows
        for layer in m.backbone.layers:
            layer.norm.weight.uniform_(0.5, 1.5)
            layer.mixer.D.uniform_(-1, 1)
        m.backbone.norm_f.weight.uniform_(0.5, 1.5)
    return m.eval()


def _ids(vocab, *shape, seed=1):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# ---- structure --------------------------------------------------------------------------------------------------

def test_names_and_shapes_are_mamba_ssms(mft):
    m = _model(mft, n_layer=2)
    d_inner, r = 64, math.ceil(32 / 16)
    layer = {"mixer.in_proj.weight": (2 * d_inner, 32), "mixer.conv1d.weight": (d_inner, 1, 4),
             "mixer.conv1d.bias": (d_inner,), "mixer.x_proj.weight": (r + 16, d_inner),
             "mixer.dt_proj.weight": (d_inner, r), "mixer.dt_proj.bias": (d_inner,), "mixer.A_log": (d_inner, 8),
             "mixer.D": (d_inner,), "mixer.out_proj.weight": (32, d_inner), "norm.weight": (32,)}
    want = {"backbone.embedding.weight": (56, 32), "backbone.norm_f.weight": (32,), "lm_head.weight": (56, 32),
            **{f"backbone.layers.{i}.{k}": v for i in range(2) for k, v in layer.items()}}
    assert {k: tuple(v.shape) for k, v in m.state_dict().items()} == want  # vocab 50 padded to 56 (multiple 8)
    assert m.lm_head.weight is m.backbone.embedding.weight  # tie_embeddings
    untied = _model(mft, tie_embeddings=False, pad_vocab_size_multiple=1)
    assert untied.lm_head.weight is not untied.backbone.embedding.weight and untied.lm_head.weight.shape[0] == 50
    twin = _model(mft, seed=5)
    twin.load_state_dict(m.state_dict())  # a mamba-ssm checkpoint of this config has exactly these keys


def test_initialisation_is_mamba_ssms(mft):
    torch.manual_seed(0)
    m = mft.MambaLMHeadModel(_config(mft, d_model=64, n_layer=4, vocab_size=512), dtype=torch.float32)
    emb = m.backbone.embedding.weight.detach()
    assert abs(float(emb.std()) - 0.02) < 0.002  # N(0, 0.02)
    bound = 1 / math.sqrt(128) / math.sqrt(4)  # kaiming_uniform(a=sqrt 5) over d_inner inputs, / sqrt(n_layer)
    for layer in m.backbone.layers:
        w = layer.mixer.out_proj.weight.detach()
        assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.9 * bound
        dt = F.softplus(layer.mixer.dt_proj.bias.detach())  # the dt bias keeps its init (_no_reinit)
        assert float(dt.min()) >= 1e-4 - 1e-9 and float(dt.max()) <= 0.1 + 1e-6


# ---- logits against mamba-ssm's model in float64 ---------------------------------------------------------------

def _reference_logits(m, ids):
    """mamba-ssm's MambaLMHeadModel forward (fused add + RMSNorm, residual in f32) in float64."""
    from torch_standins import reference_mamba

    def rms(x, w, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()

    h = m.backbone.embedding.weight.detach().double()[ids]
    residual = torch.zeros_like(h)
    for layer in m.backbone.layers:
        residual = residual + h
        mx = layer.mixer
        p = {k: v.detach().double() for k, v in mx.named_parameters()}
        h = reference_mamba(p, rms(residual, layer.norm.weight.detach(), layer.norm.eps), mx.d_conv, mx.dt_rank,
                            mx.d_state)
    out = rms(residual + h, m.backbone.norm_f.weight.detach(), m.backbone.norm_f.eps)
    return out @ m.lm_head.weight.detach().double().T


def test_logits_match_mamba_ssms_model_in_float64(mft):
    m = _model(mft)
    ids = _ids(56, 2, 9)
    with torch.no_grad():
        got = m(ids).logits
        last = m(ids, num_last_tokens=3).logits
    want = _reference_logits(m, ids)
    assert got.shape == (2, 9, 56) and got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4), float((got.double() - want).abs().max())
    assert torch.equal(last, got[:, -3:])


def test_training_forward_gives_the_inference_bits_and_every_parameter_a_gradient(mft):
    m = _model(mft).train()
    ids = _ids(56, 2, 6)
    logits = m(ids).logits
    with torch.no_grad():
        assert torch.equal(logits.detach(), m(ids).logits)
    F.cross_entropy(logits.reshape(-1, 56), _ids(56, 12, seed=2)).backward()
    assert [n for n, p in m.named_parameters() if p.grad is None] == []
    assert float(m.backbone.embedding.weight.grad.abs().sum()) > 0  # the tied weight: head and embedding both


# ---- generate --------------------------------------------------------------------------------------------------

def test_greedy_decode_steps_give_a_full_prefills_logits_bit_for_bit(mft):
    m = _model(mft)
    ids = _ids(56, 3, 5)
    out = m.generate(ids, 11, return_dict_in_generate=True, output_scores=True)
    assert out.sequences.shape == (3, 11) and len(out.scores) == 6
    assert torch.equal(out.sequences[:, :5], ids)
    with torch.no_grad():
        full = m(out.sequences[:, :-1].clone()).logits
    for i, s in enumerate(out.scores):
        assert torch.equal(s, full[:, 4 + i]), i
        assert torch.equal(out.sequences[:, 5 + i], s.argmax(-1))
    assert torch.equal(m.generate(ids, 11), out.sequences)  # sequences only, by default
    assert m.generate(ids, 11, return_dict_in_generate=True).scores is None


def test_generate_follows_teacher_outputs_stops_at_eos_and_streams(mft):
    m = _model(mft)
    ids = _ids(56, 2, 4)
    teacher = _ids(56, 2, 7, seed=9)
    seq = m.generate(ids, 9, teacher_outputs=teacher)
    assert torch.equal(seq[:, 4:7], teacher[:, 4:7])  # taken from the teacher while it lasts, then sampled

    class Streamer:
        def __init__(self):
            self.parts, self.ended = [], False

        def put(self, t):
            self.parts.append(t.clone())

        def end(self):
            self.ended = True

    greedy = m.generate(ids, 9)
    eos = int(greedy[0, 5])
    forced = teacher.clone()
    forced[:, 5] = eos  # both rows end with eos at step 5: generation stops there
    st = Streamer()
    seq = m.generate(ids, 30, teacher_outputs=forced, eos_token_id=eos, streamer=st)
    assert seq.shape == (2, 6) and bool((seq[:, -1] == eos).all())
    assert st.ended and torch.equal(torch.cat(st.parts, 1), seq)
    assert m.generate(ids, 9, vocab_size=3)[:, 4:].max() < 3  # logits cut to the first vocab_size


def test_sampling_filters_keep_only_what_they_allow(mft):
    from mamba_forge.runtime.torch_generate import penalise_repeats, sample

    torch.manual_seed(3)
    logits = torch.randn(4, 40)
    top5 = logits.topk(5, -1).indices
    for _ in range(20):
        got = sample(logits, top_k=5)
        assert all(int(got[i]) in top5[i].tolist() for i in range(4))
    best = logits.argmax(-1)
    assert torch.equal(sample(logits, top_k=0, top_p=1e-6), best)  # only the most likely token is left
    assert torch.equal(sample(logits, top_k=0, min_p=0.999999), best)
    assert torch.equal(sample(logits, top_k=1), best)
    wide = torch.zeros(1, 8)
    wide[0, 0] = 10.0  # p(0) ~ 0.9997: top_p 0.5 keeps token 0 only, top_p 1.0 keeps all
    assert {int(sample(wide, top_k=0, top_p=0.5)) for _ in range(30)} == {0}
    seen = torch.tensor([[1, 2]])
    row = torch.tensor([[1.0, 2.0, -2.0, 3.0]])
    assert torch.equal(penalise_repeats(row, seen, 2.0), torch.tensor([[1.0, 1.0, -4.0, 3.0]]))


@pytest.mark.parametrize("kw,match", [
    ({"max_length": 4}, "past the prompt"),
    ({"top_k": -1}, "top_k"),
    ({"top_p": 1.5}, "top_p"),
    ({"min_p": 1.0}, "min_p"),
    ({"temperature": 0.0}, "temperature"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"vocab_size": 57}, "vocab_size"),
    ({"cg": True}, "CUDA graphs"),
])
def test_generate_refuses_bad_arguments(mft, kw, match):
    m = _model(mft)
    args = {"max_length": 8, **kw}
    with pytest.raises(ValueError, match=match):
        m.generate(_ids(56, 1, 4), args.pop("max_length"), **args)


@pytest.mark.parametrize("ids,match", [
    (torch.tensor([[1, 56]]), "from 1 to 56"),
    (torch.tensor([[-1, 3]]), "from -1 to 3"),
    (torch.tensor([[1.0, 2.0]]), "int64"),
    (torch.tensor([1, 2]), r"\[batch, length\]"),
    (torch.zeros((1, 0), dtype=torch.int64), "at least 1"),
])
def test_forward_refuses_ids_the_embedding_cannot_take(mft, ids, match):
    m = _model(mft)
    with pytest.raises(ValueError, match=match):
        m(ids)
    with pytest.raises(ValueError, match=match):
        m.generate(ids, 5)
    m.check_ids = False  # an engine's own validation: forward no longer reads the range, generate still does
    with pytest.raises(ValueError, match=match):
        m.generate(ids, 5)


# ---- configurations and kernels ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kw,match", [
    ({"d_intermediate": 128}, "no MLP"),
    ({"attn_layer_idx": [1]}, "attention"),
    ({"ssm_cfg": {"layer": "Mamba2"}}, "Mamba1"),
    ({"ssm_cfg": {"d_state": 8, "headdim": 64}}, "headdim"),
    ({"ssm_cfg": {"d_state": "8"}}, "d_state='8': a positive integer"),
    ({"ssm_cfg": {"dt_init": "xavier"}}, "dt_init"),
    ({"rms_norm": False}, "rms_norm"),
    ({"fused_add_norm": False}, "fused_add_norm"),
    ({"residual_in_fp32": False}, "residual_in_fp32"),
    ({"n_layer": 0}, "n_layer"),
    ({"vocab_size": True}, "vocab_size"),
])
def test_configurations_mamba_ssm_builds_from_other_modules_are_refused(mft, kw, match):
    with pytest.raises(ValueError, match=match):
        mft.MambaLMHeadModel(_config(mft, **kw), dtype=torch.float32)


def test_construction_refuses_a_head_no_qualified_gemm_serves(mft):
    from torch_standins import RefKernels

    from mamba_forge.runtime.routes import NoRoute

    class NoHead(RefKernels):
        def gemm_route(self, m, n, k, *a, **kw):
            if n == 56:
                raise NoRoute(f"no admitted GEMM symbol serves N={n}")
            return super().gemm_route(m, n, k, *a, **kw)

    try:
        with pytest.raises(LaunchRefused, match="lm_head"):
            mft.MambaLMHeadModel(_config(mft), dtype=torch.float32, kernels=NoHead())
        m = mft.MambaLMHeadModel(_config(mft, pad_vocab_size_multiple=16), dtype=torch.float32,
                                 kernels=NoHead())  # 64 rows: served
        m.check_training_kernels()
        with pytest.raises(LaunchRefused, match="lm_head's input gradient"):
            mft.MambaLMHeadModel(_config(mft, pad_vocab_size_multiple=16), dtype=torch.float32,
                                 kernels=RefKernels(layouts=("nn", "tn"))).check_training_kernels()
    finally:
        mft.register(RefKernels())


def test_a_weight_change_moves_the_key_decode_graphs_are_kept_with(mft):
    m = _model(mft)
    key = m.weights_key()
    assert m.weights_key() == key
    with torch.no_grad():
        m.backbone.embedding.weight[0, 0] += 1  # the tied head's weight, through the embedding
    assert m.weights_key() != key
    key = m.weights_key()
    with torch.no_grad():
        m.backbone.layers[1].mixer.x_proj.weight.mul_(2)
    assert m.weights_key() != key
    key = m.weights_key()
    m.backbone.layers[0].norm.weight = torch.nn.Parameter(m.backbone.layers[0].norm.weight.detach().clone())
    assert m.weights_key() != key


# ---- checkpoints ----------------------------------------------------------------------------------------------

def test_save_and_from_pretrained_round_trip(mft, tmp_path):
    m = _model(mft)
    m.save_pretrained(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "pytorch_model.bin"]
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["ssm_cfg"] == {"d_state": 8}
    back = mft.MambaLMHeadModel.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()
    ids = _ids(56, 2, 5)
    with torch.no_grad():
        assert torch.equal(back(ids).logits, m(ids).logits)
    assert back.lm_head.weight is back.backbone.embedding.weight


def test_save_pretrained_leaves_the_old_file_whole_when_a_write_fails(mft, tmp_path, monkeypatch):
    m = _model(mft)
    m.save_pretrained(tmp_path)
    before = (tmp_path / "pytorch_model.bin").read_bytes()

    def full_disk(obj, f, *a, **kw):
        f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(OSError, match="No space"):
        _model(mft, seed=7).save_pretrained(tmp_path)
    assert (tmp_path / "pytorch_model.bin").read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["config.json", "pytorch_model.bin"]  # no temporary file left


def _checkpoint(mft, tmp_path, config=None, state=None):
    m = _model(mft)
    m.save_pretrained(tmp_path)
    if config is not None:
        (tmp_path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if state is not None:
        torch.save(state, tmp_path / "pytorch_model.bin")
    return m


def test_from_pretrained_refuses_foreign_and_hostile_checkpoints(mft, tmp_path):
    load = lambda p: mft.MambaLMHeadModel.from_pretrained(p, dtype=torch.float32)  # noqa: E731
    cfg = {"d_model": 32, "n_layer": 2, "vocab_size": 50, "ssm_cfg": {"d_state": 8}}
    cases = []
    cases.append(("missing", None, "no such folder"))
    cases.append(("../x", None, "no such folder"))
    d = tmp_path / "hf"
    d.mkdir()
    _checkpoint(mft, d, config={**cfg, "hidden_size": 32, "intermediate_size": 64})
    cases.append((d, None, "transformers-format"))
    d = tmp_path / "big"
    d.mkdir()
    _checkpoint(mft, d, config=" " * (1 << 20) + json.dumps(cfg))
    cases.append((d, None, "over 1048576 bytes"))
    d = tmp_path / "notjson"
    d.mkdir()
    _checkpoint(mft, d, config="{")
    cases.append((d, None, "not JSON"))
    d = tmp_path / "attn"
    d.mkdir()
    _checkpoint(mft, d, config={**cfg, "attn_layer_idx": [0]})
    cases.append((d, None, "attention"))
    d = tmp_path / "short"
    d.mkdir()
    state = _model(mft).state_dict()
    del state["backbone.norm_f.weight"]
    _checkpoint(mft, d, state=state)
    cases.append((d, None, "missing backbone.norm_f.weight"))
    d = tmp_path / "shape"
    d.mkdir()
    state = _model(mft).state_dict()
    state["backbone.norm_f.weight"] = torch.ones(33)
    _checkpoint(mft, d, state=state)
    cases.append((d, None, "size mismatch"))
    d = tmp_path / "code"
    d.mkdir()
    _checkpoint(mft, d, state={"x": _Evil()})
    cases.append((d, None, "not a checkpoint these loaders read"))
    d = tmp_path / "huge"
    d.mkdir()
    _checkpoint(mft, d)
    with open(d / "pytorch_model.bin", "r+b") as f:
        f.truncate(1 << 30)  # sparse: 1 GiB claimed by a config of ~60k parameters
    cases.append((d, None, "more than a checkpoint of this config can hold"))
    d = tmp_path / "noweights"
    d.mkdir()
    _checkpoint(mft, d)
    os.unlink(d / "pytorch_model.bin")
    cases.append((d, None, "neither pytorch_model.bin"))
    for path, _, match in cases:
        with pytest.raises(ValueError, match=match):
            load(path)
    assert not os.path.exists("pwned-by-checkpoint")  # the pickled object's code never ran


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-checkpoint",))


def test_a_hub_name_without_huggingface_hub_says_what_to_install(mft, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_hub(name, *a, **kw):
        if name.startswith("huggingface_hub"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_hub)
    with pytest.raises(ValueError, match="pip install huggingface_hub"):
        mft.MambaLMHeadModel.from_pretrained("state-spaces/mamba-130m")


def test_generate_takes_mamba_ssms_state_dtype_and_timing_arguments(mft, capsys):
    torch.manual_seed(0)
    m = mft.MambaLMHeadModel(_config(mft), dtype=torch.bfloat16).eval()
    ids = _ids(56, 2, 5)
    out = m.generate(ids, 9, ssm_dtype=torch.bfloat16, enable_timing=True)  # mamba-ssm's own cache dtype
    assert out.shape == (2, 9) and torch.equal(out[:, :5], ids)
    assert capsys.readouterr().out.startswith("Prompt processing + decoding time: ")
    with pytest.raises(ValueError, match="neither float32 nor"):
        _model(mft).generate(ids, 9, ssm_dtype=torch.bfloat16)  # an f32 model: its state is f32


def test_model_forward_traces_under_torch_compile(mft):
    m = _model(mft)
    ids = _ids(56, 2, 6)
    with torch.no_grad():
        want = m(ids).logits
        got = torch.compile(m, backend="aot_eager")(ids).logits
    assert torch.equal(got, want)


def test_cg_path_captures_once_per_batch_and_again_after_a_weight_change(mft, monkeypatch):
    """generate(cg=True)'s bookkeeping on the CPU, the CUDA graph stood in for by a replay that runs the captured
    step again into the captured output (what a graph replay does): the same sequences and logits as eager, one
    capture per batch size, a new one after a weight changed, the old graph's output never read after that."""
    from mamba_forge.runtime import torch_generate as tg

    captures = []

    class Replay:
        def __init__(self, fn, out):
            self.fn, self.out = fn, out

        def replay(self):
            self.out.copy_(self.fn())

    def fake_capture(fn, device):
        for _ in range(tg.WARMUP_STEPS):
            fn()
        out = fn()
        captures.append(out)
        return Replay(fn, out), out

    monkeypatch.setattr(tg, "capture", fake_capture)
    monkeypatch.setattr(tg, "check_capture_device", lambda device: None)
    m = _model(mft)
    ids = _ids(56, 2, 5)
    eager = m.generate(ids, 11, return_dict_in_generate=True, output_scores=True)
    got = m.generate(ids, 11, return_dict_in_generate=True, output_scores=True, cg=True)
    assert torch.equal(got.sequences, eager.sequences)
    assert all(torch.equal(a, b) for a, b in zip(got.scores, eager.scores, strict=True))
    assert len(captures) == 1
    assert torch.equal(m.generate(ids, 11, cg=True), eager.sequences) and len(captures) == 1  # kept
    m.generate(ids[:1], 9, cg=True)
    assert len(captures) == 2 and sorted(m._graphs) == [1, 2]  # one per batch size
    with torch.no_grad():
        m.backbone.layers[0].mixer.out_proj.weight.mul_(-2)  # read through its derived transpose
    eager2 = m.generate(ids, 11, return_dict_in_generate=True, output_scores=True)
    got2 = m.generate(ids, 11, return_dict_in_generate=True, output_scores=True, cg=True)
    assert len(captures) == 3 and not torch.equal(eager2.scores[-1], eager.scores[-1])
    assert all(torch.equal(a, b) for a, b in zip(got2.scores, eager2.scores, strict=True))


def test_create_block_is_mamba_ssms_and_refuses_what_it_does_not_build(mft):
    from mamba_forge.runtime.torch_model import create_block

    blk = create_block(32, 0, ssm_cfg={"d_state": 8}, norm_epsilon=1e-6, rms_norm=True, residual_in_fp32=True,
                       fused_add_norm=True, layer_idx=4, dtype=torch.float32)
    assert blk.layer_idx == 4 and blk.mixer.layer_idx == 4 and blk.norm.eps == 1e-6 and blk.mixer.d_state == 8
    ok = dict(rms_norm=True, residual_in_fp32=True, fused_add_norm=True, layer_idx=1)
    for kw, match in (({"d_intermediate": 64}, "no MLP"), ({"attn_layer_idx": [1]}, "attention"),
                      ({"rms_norm": False}, "rms_norm")):
        args = {**ok, **kw}
        with pytest.raises(ValueError, match=match):
            create_block(32, args.pop("d_intermediate", 0), **args)
    create_block(32, 0, attn_layer_idx=[0], **ok)  # attention elsewhere: this layer is a Mamba one


def test_a_hub_name_the_hub_cannot_give_is_one_line(mft, monkeypatch):
    import sys
    import types

    hub = types.ModuleType("huggingface_hub")

    def snapshot_download(name, **kw):
        raise OSError("Network is unreachable")

    hub.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", hub)
    with pytest.raises(ValueError, match="did not give it .OSError: Network is unreachable"):
        mft.MambaLMHeadModel.from_pretrained("state-spaces/mamba-130m")
