"""mamba-ssm's language model on our kernels on a real GPU (mamba_forge.runtime.torch.MambaLMHeadModel), from a
signed bundle (MF_RUNTIME_BUNDLE, MF_RUNTIME_KEY) or one built and qualified here (test_runtime_gpu's fixture):

- generate's decode steps give the logits a full prefill of the same tokens gives, bit for bit, eager and replayed
  from CUDA graphs (cg=True), bf16 and f32; sequence 0's logits the same bits at batch 1 and batch 5;
- a weight changed in place after a capture: cg=True captures again and gives the eager bits of the new weights;
- save_pretrained / from_pretrained round trip on the GPU; where mamba-ssm is importable, its MambaLMHeadModel's
  state dict loads unchanged and the logits agree to bf16 rounding, and greedy generation starts the same;
- a training step: the training forward's logits are the inference bits, gradients bit-identical in two runs.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from test_runtime_gpu import bundle, kernels  # noqa: E402,F401  (fixtures: the signed bundle, load())

DT = {"bf16": torch.bfloat16, "f32": torch.float32}


def _same(a, b) -> bool:
    bits = lambda t: t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)  # noqa: E731
    return a.shape == b.shape and bool(torch.equal(bits(a), bits(b)))


@pytest.fixture(scope="module")
def mft(kernels):  # noqa: F811
    import mamba_forge.runtime.torch as mft

    mft.register(kernels)
    return mft


def _model(mft, dtype, seed=0, d_model=256, n_layer=2, vocab=1000):
    torch.manual_seed(seed)
    cfg = mft.MambaConfig(d_model=d_model, n_layer=n_layer, vocab_size=vocab)
    return mft.MambaLMHeadModel(cfg, device="cuda", dtype=dtype).eval()


def _ids(batch, length, vocab=1000, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g, device="cuda")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("cg", [False, True])
def test_decode_steps_give_a_full_prefills_logits_bit_for_bit(mft, dtype, cg):
    m = _model(mft, DT[dtype])
    ids = _ids(3, 37)
    out = m.generate(ids, 53, return_dict_in_generate=True, output_scores=True, cg=cg)
    assert out.sequences.shape == (3, 53)
    with torch.no_grad():
        full = m(out.sequences[:, :-1].clone()).logits
    for i, s in enumerate(out.scores):
        assert _same(s, full[:, 36 + i]), f"step {i}"
    if cg:  # the graphs' sequences are the eager ones
        assert torch.equal(out.sequences, m.generate(ids, 53))


def test_sequence_0_is_the_same_bits_at_batch_1_and_batch_5(mft):
    m = _model(mft, torch.bfloat16)
    ids = _ids(5, 40)
    one = m.generate(ids[:1], 60, return_dict_in_generate=True, output_scores=True, cg=True)
    five = m.generate(ids, 60, return_dict_in_generate=True, output_scores=True, cg=True)
    assert torch.equal(one.sequences[0], five.sequences[0])
    for a, b in zip(one.scores, five.scores, strict=True):
        assert _same(a[0], b[0])


def test_a_weight_changed_after_a_capture_is_captured_again(mft):
    m = _model(mft, torch.bfloat16)
    ids = _ids(2, 16)
    m.generate(ids, 24, cg=True)
    with torch.no_grad():
        m.backbone.layers[1].mixer.out_proj.weight.mul_(-1.5)
        m.backbone.embedding.weight[:, :8].mul_(2)  # the tied head's weight
    got = m.generate(ids, 24, return_dict_in_generate=True, output_scores=True, cg=True)
    want = m.generate(ids, 24, return_dict_in_generate=True, output_scores=True)
    assert torch.equal(got.sequences, want.sequences)
    for a, b in zip(got.scores, want.scores, strict=True):
        assert _same(a, b)


def test_save_and_from_pretrained_on_the_gpu(mft, tmp_path):
    m = _model(mft, torch.bfloat16)
    m.save_pretrained(tmp_path)
    back = mft.MambaLMHeadModel.from_pretrained(tmp_path, device="cuda", dtype=torch.bfloat16).eval()
    ids = _ids(2, 33)
    with torch.no_grad():
        assert _same(back(ids).logits, m(ids).logits)


def test_mamba_ssms_model_loads_and_agrees(mft):
    mixer = pytest.importorskip("mamba_ssm.models.mixer_seq_simple")
    cfg_mod = pytest.importorskip("mamba_ssm.models.config_mamba")
    torch.manual_seed(3)
    peer = mixer.MambaLMHeadModel(cfg_mod.MambaConfig(d_model=512, n_layer=4, vocab_size=1000), device="cuda",
                                  dtype=torch.bfloat16).eval()
    ours = _model(mft, torch.bfloat16, d_model=512, n_layer=4)
    ours.load_state_dict(peer.state_dict())
    ids = _ids(2, 64)
    with torch.no_grad():
        a, b = ours(ids).logits.float(), peer(ids).logits.float()
    assert float((a - b).abs().max() / b.abs().max()) < 3e-2
    ga = ours.generate(ids, 72)
    gb = peer.generate(ids, 72)
    assert torch.equal(ga[:, :66], gb[:, :66])  # greedy: the first two new tokens (later ones may part on a tie)


def test_the_same_seed_gives_mamba_ssms_initial_weights(mft):
    """mamba-ssm's initialisation, draw for draw: after the same seed, the same tensors (same RNG calls in the same
    order: each layer's norm then its mixer, the mixer's own draws, the two _init_weights passes)."""
    mixer = pytest.importorskip("mamba_ssm.models.mixer_seq_simple")
    cfg_mod = pytest.importorskip("mamba_ssm.models.config_mamba")
    torch.manual_seed(11)
    peer = mixer.MambaLMHeadModel(cfg_mod.MambaConfig(d_model=256, n_layer=3, vocab_size=1000), device="cuda",
                                  dtype=torch.bfloat16)
    ours = _model(mft, torch.bfloat16, seed=11, d_model=256, n_layer=3)
    a, b = ours.state_dict(), peer.state_dict()
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


def test_training_step_is_the_inference_forward_and_bit_reproducible(mft):
    def grads():
        m = _model(mft, torch.float32, d_model=128, n_layer=2).train()
        ids = _ids(4, 64)
        logits = m(ids[:, :-1]).logits
        with torch.no_grad():
            assert _same(logits.detach(), m(ids[:, :-1]).logits)
        onehot = torch.nn.functional.one_hot(ids[:, 1:], logits.shape[-1]).float()
        (-(logits.log_softmax(-1) * onehot).sum(-1).mean()).backward()
        return {n: p.grad.clone() for n, p in m.named_parameters()}

    torch.use_deterministic_algorithms(True)
    try:
        a, b = grads(), grads()
    finally:
        torch.use_deterministic_algorithms(False)
    assert a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
