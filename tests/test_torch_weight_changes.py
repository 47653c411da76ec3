"""What the torch layers derive from their weights (transposed weights, float32 copies, captured decode graphs) follows
every change of the weights that torch counts, and is dropped where it cannot: our AdamW counts the writes its
kernels make through raw pointers; .to() / .half() / .cpu() drop what was derived (and its memory); a write torch does
not count (through .data) is seen after prepare(refresh=True). And the inference path is mamba-ssm's from the
outside: a Block never adds into the caller's residual, a forward through the inference cache records no graph, a
tied checkpoint holding one name of the shared tensor loads. Kernels stood in for by the float64 references on CPU
(tests/torch_standins.py)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def mft():
    from torch_standins import register_cpu

    return register_cpu()


def _layer(mft, seed=0):
    torch.manual_seed(seed)
    return mft.Mamba(16, d_state=8, layer_idx=0, dtype=torch.float32)


def _same_as_fresh(mft, m, h) -> bool:
    fresh = mft.Mamba(16, d_state=8, layer_idx=0, dtype=torch.float32)
    fresh.load_state_dict(m.state_dict())
    with torch.no_grad():
        return torch.equal(m(h), fresh(h))


# ---- the optimizer's writes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("capturable", [False, True])
def test_an_adamw_step_is_seen_by_the_layer(mft, capturable):
    """The AdamW kernels write parameters through raw pointers (the stand-in writes through .data as they do, so
    torch counts nothing by itself); step() counts them, so the next inference call of a layer remakes its
    transposed weights: it equals a fresh layer with the stepped weights."""
    from test_torch_optim import _RefKernels

    from mamba_forge.runtime import torch_optim as mo

    m = _layer(mft)
    h = torch.randn(2, 5, 16)
    with torch.no_grad():
        before = m(h)
    params = list(m.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, lr=0.05, capturable=capturable, kernels=kern))
    versions = [p._version for p in params]
    opt.step()
    assert kern.calls, "the stand-in AdamW ran"
    assert all(p._version > v for p, v in zip(params, versions, strict=True))
    st = opt.state[params[0]]
    assert st["exp_avg"]._version > 0 and st["exp_avg_sq"]._version > 0
    assert _same_as_fresh(mft, m, h)
    with torch.no_grad():
        assert not torch.equal(m(h), before)  # the step moved the weights, and the layer saw it


def test_the_stand_in_adamw_writes_as_the_kernels_do_uncounted(mft):
    """The negative of the test above: without step()'s count, the stand-in's writes move no version, and the layer
    would serve its transposes of the old weights (so the test above can fail)."""
    from test_torch_optim import _RefKernels

    from mamba_forge.runtime import torch_optim as mo

    m = _layer(mft)
    h = torch.randn(2, 5, 16)
    with torch.no_grad():
        m(h)
    params = list(m.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    kern = _RefKernels()
    opt = kern.watch(mo.AdamW(params, lr=0.05, kernels=kern))
    versions = [p._version for p in params]
    real = torch.autograd.graph.increment_version
    torch.autograd.graph.increment_version = lambda tensors: None
    try:
        opt.step()
    finally:
        torch.autograd.graph.increment_version = real
    assert [p._version for p in params] == versions
    assert not _same_as_fresh(mft, m, h)


# ---- moves and writes torch does not count ----------------------------------------------------------------------

def test_a_move_drops_what_was_derived_and_the_layer_follows_it(mft):
    """.half() / .float() (nn.Module._apply) assign param.data, keeping the version counter, and the moved weight may
    land at the address just freed: the layer drops its derived tensors on every move (their memory with them)."""
    m = _layer(mft)
    h = torch.randn(2, 5, 16)
    with torch.no_grad():
        m(h)
    assert m._derived._got and m._weights_memo is not None
    m.double()
    assert not m._derived._got and m._weights_memo is None  # nothing of the old weights kept
    m.float()
    assert _same_as_fresh(mft, m, h)

    norm = mft.RMSNorm(16, dtype=torch.bfloat16)
    norm.weight_f32()
    assert norm._derived._got
    norm.float()
    assert not norm._derived._got


def test_a_write_through_data_is_seen_after_prepare_refresh(mft):
    """A write through .data moves no version (torch's rule): the layer keeps its transposes of the old weight until
    prepare(refresh=True), then equals a fresh layer again."""
    m = _layer(mft)
    h = torch.randn(2, 5, 16)
    with torch.no_grad():
        old = m(h)
        m.out_proj.weight.data.mul_(2.0)
        assert torch.equal(m(h), old)  # stale by design: nothing torch counts moved
    m.prepare(refresh=True)
    assert _same_as_fresh(mft, m, h)


def test_the_models_refresh_and_moves_drop_the_head_norms_and_graphs(mft):
    torch.manual_seed(0)
    model = mft.MambaLMHeadModel(mft.MambaConfig(d_model=32, n_layer=2, vocab_size=50, ssm_cfg={"d_state": 8}),
                                 dtype=torch.float32).eval()
    ids = torch.randint(0, 50, (2, 5))
    with torch.no_grad():
        before = model(ids).logits
        model.prepare()
        model._graphs[1] = "a captured graph"
        model.backbone.layers[0].mixer.out_proj.weight.data.mul_(2.0)  # uncounted: the layer keeps its transpose
        assert torch.equal(model(ids).logits, before)
        model.prepare(refresh=True)
        assert not model._graphs
        after = model(ids).logits
    assert not torch.equal(after, before)
    fresh = mft.MambaLMHeadModel(model.config, dtype=torch.float32).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, after)
    model._graphs[1] = "a captured graph"
    model.double()
    assert not model._graphs and not model._derived._got
    assert all(not layer.mixer._derived._got for layer in model.backbone.layers)


# ---- the inference path from the outside -------------------------------------------------------------------------

def test_a_block_never_adds_into_the_callers_residual(mft):
    """mamba-ssm's Block returns a new residual: ours copies the caller's before the in-place add, so a second
    identical call gives the same result; inside MixerModel the layers add into the forward's own residual."""
    torch.manual_seed(1)
    blk = mft.Block(16, lambda dim: mft.Mamba(dim, d_state=8, layer_idx=0, dtype=torch.float32))
    h, res = torch.randn(1, 5, 16), torch.randn(1, 5, 16)
    keep = res.clone()
    with torch.no_grad():
        out1, r1 = blk(h, res)
        out2, r2 = blk(h, res)
    assert torch.equal(res, keep) and r1 is not res
    assert torch.equal(out1, out2) and torch.equal(r1, r2) and torch.equal(r1, keep + h)
    with torch.no_grad():
        blk(h, res, _owned_residual=True)  # MixerModel's own residual: added into in place
    assert torch.equal(res, keep + h)

    model = mft.MambaLMHeadModel(mft.MambaConfig(d_model=16, n_layer=3, vocab_size=40, ssm_cfg={"d_state": 8}),
                                 dtype=torch.float32).eval()
    seen = []
    for layer in model.backbone.layers:
        layer.register_forward_hook(lambda mod, args, out: seen.append(out[1].data_ptr()))
    with torch.no_grad():
        model(torch.randint(0, 40, (1, 4)))
    assert len(seen) == 3 and len(set(seen)) == 1  # one residual tensor for the whole forward (no copy a layer)


def test_a_forward_through_the_cache_records_no_graph(mft):
    """The cache path's ops have no backward: with grad mode on and parameters requiring grad, a forward with
    inference_params gives outputs without grad_fn (and without torch's 'autograd kernel was not registered'
    warning) rather than a graph whose backward would give no gradients."""
    torch.manual_seed(2)
    model = mft.MambaLMHeadModel(mft.MambaConfig(d_model=16, n_layer=2, vocab_size=40, ssm_cfg={"d_state": 8}),
                                 dtype=torch.float32)
    cache = mft.InferenceParams(max_seqlen=8, max_batch_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logits = model(torch.randint(0, 40, (1, 4)), inference_params=cache).logits
    assert logits.grad_fn is None and not logits.requires_grad
    m = _layer(mft)
    h = torch.randn(1, 4, 16, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = m(h, inference_params=mft.InferenceParams(max_seqlen=8, max_batch_size=1))
    assert out.grad_fn is None
    blk = mft.Block(16, lambda dim: mft.Mamba(dim, d_state=8, layer_idx=0, dtype=torch.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hid, res = blk(h, None, inference_params=mft.InferenceParams(max_seqlen=8, max_batch_size=1))
    assert hid.grad_fn is None and res.grad_fn is None


def test_a_tied_checkpoint_with_one_name_of_the_shared_tensor_loads(mft, tmp_path):
    """safetensors stores a shared tensor once (save_file refuses both names): with tie_embeddings, either name alone
    fills the other; an untied model still refuses a missing head."""
    torch.manual_seed(3)
    config = mft.MambaConfig(d_model=16, n_layer=2, vocab_size=40, ssm_cfg={"d_state": 8})
    model = mft.MambaLMHeadModel(config, dtype=torch.float32).eval()
    ids = torch.randint(0, 40, (1, 4))
    with torch.no_grad():
        want = model(ids).logits
    for keep in ("backbone.embedding.weight", "lm_head.weight"):
        folder = tmp_path / keep
        model.save_pretrained(folder)
        state = {k: v for k, v in model.state_dict().items()
                 if k not in ("backbone.embedding.weight", "lm_head.weight") or k == keep}
        torch.save(state, folder / "pytorch_model.bin")
        back = mft.MambaLMHeadModel.from_pretrained(folder, dtype=torch.float32).eval()
        with torch.no_grad():
            assert torch.equal(back(ids).logits, want)
        assert back.lm_head.weight is back.backbone.embedding.weight
    untied = mft.MambaConfig(d_model=16, n_layer=2, vocab_size=40, ssm_cfg={"d_state": 8}, tie_embeddings=False)
    other = mft.MambaLMHeadModel(untied, dtype=torch.float32)
    folder = tmp_path / "untied"
    other.save_pretrained(folder)
    torch.save({k: v for k, v in other.state_dict().items() if k != "lm_head.weight"}, folder / "pytorch_model.bin")
    with pytest.raises(ValueError, match="missing lm_head.weight"):
        mft.MambaLMHeadModel.from_pretrained(folder, dtype=torch.float32)


def test_a_copy_or_pickle_carries_the_weights_not_what_was_made_from_them(mft):
    """copy.deepcopy / pickle of a model that has run (and captured: a CUDA graph cannot be copied, stood in for by
    an object that refuses to be) carries the weights only; the copy makes its own derived tensors and equals the
    original."""
    import copy
    import pickle

    class Uncopyable:
        def __reduce__(self):
            raise TypeError("a CUDA graph cannot be pickled")

    torch.manual_seed(4)
    model = mft.MambaLMHeadModel(mft.MambaConfig(d_model=16, n_layer=2, vocab_size=40, ssm_cfg={"d_state": 8}),
                                 dtype=torch.float32).eval()
    ids = torch.randint(0, 40, (1, 4))
    with torch.no_grad():
        want = model(ids).logits
    model.prepare()
    model._graphs[1] = Uncopyable()
    with pytest.raises(TypeError):
        pickle.dumps(Uncopyable())
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert not twin._graphs and not twin._derived._got
        assert all(not layer.mixer._derived._got and layer.mixer._weights_memo is None
                   and not layer.norm._derived._got for layer in twin.backbone.layers)
        with torch.no_grad():
            assert torch.equal(twin(ids).logits, want)
    assert model._graphs and model.backbone.layers[0].mixer._derived._got  # the original keeps its own
