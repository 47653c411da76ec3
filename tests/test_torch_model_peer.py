"""Our MambaLMHeadModel against mamba-ssm's own model code on the CPU: mamba-ssm 2.3.2's Python modules (from its
sdist: MAMBA_SSM_SDIST, else ../shared/peers/ or .peers/ beside this checkout) imported with stubs for its CUDA
extension, transformers and huggingface_hub, its CUDA and Triton functions swapped for its own references
(selective_scan_ref, rms_norm_ref). Needs torch, einops and triton importable (skips otherwise; CI has no torch).

- the same seed gives the same state dict, key for key and bit for bit (mamba-ssm's initialisation, draw for draw);
- its model in float64 is the reference for ours (the kernels stood in for by our float64 references): logits of
  prefill and of every greedy decode step agree to float32 rounding.
"""

from __future__ import annotations

import os
import sys
import tarfile
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("einops")
pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent
SDIST = "mamba_ssm-2.3.2.post1.tar.gz"


def _sdist() -> Path | None:
    env = os.environ.get("MAMBA_SSM_SDIST")
    for p in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "peers" / SDIST, ROOT / ".peers" / SDIST]:
        if p.is_file():
            return p
    return None


def _stub_modules() -> dict:
    """What mamba-ssm imports at module level and these tests never call."""
    gen = types.ModuleType("transformers.generation")
    gen.GenerateDecoderOnlyOutput = gen.TextStreamer = object
    utils = types.ModuleType("transformers.utils")
    utils.WEIGHTS_NAME, utils.CONFIG_NAME = "pytorch_model.bin", "config.json"
    hub = types.ModuleType("transformers.utils.hub")
    hub.cached_file = None
    tr = types.ModuleType("transformers")
    tr.generation, tr.utils = gen, utils
    hf = types.ModuleType("huggingface_hub")
    hf.PyTorchModelHubMixin = type("PyTorchModelHubMixin", (), {"__init_subclass__": classmethod(lambda c, **k: None)})
    return {"selective_scan_cuda": types.ModuleType("selective_scan_cuda"), "transformers": tr,
            "transformers.generation": gen, "transformers.utils": utils, "transformers.utils.hub": hub,
            "huggingface_hub": hf}


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    """mamba-ssm's mixer_seq_simple and config_mamba modules, their fast functions replaced by references."""
    sdist = _sdist()
    if sdist is None:
        pytest.skip(f"no {SDIST} (set MAMBA_SSM_SDIST)")
    out = tmp_path_factory.mktemp("mamba_ssm")
    with tarfile.open(sdist) as tf:
        members = [m for m in tf.getmembers() if m.isfile() and "/mamba_ssm/" in m.name and m.name.endswith(".py")]
        tf.extractall(out, members=members, filter="data")
    (src,) = out.iterdir()
    saved = {k: v for k, v in sys.modules.items() if k == "mamba_ssm" or k.startswith("mamba_ssm.")}
    stubs = _stub_modules()
    added = [k for k in stubs if k not in sys.modules]
    sys.modules.update({k: v for k, v in stubs.items() if k in added})
    sys.path.insert(0, str(src))
    try:
        from mamba_ssm.models import config_mamba, mixer_seq_simple
        from mamba_ssm.modules import block, mamba_simple
        from mamba_ssm.ops.selective_scan_interface import selective_scan_ref
        from mamba_ssm.ops.triton.layer_norm import rms_norm_ref

        def layer_norm_ref_fn(x, weight, bias, residual=None, prenorm=False, residual_in_fp32=False, eps=1e-6,
                              is_rms_norm=False, **_):
            assert is_rms_norm
            return rms_norm_ref(x, weight, bias, residual=residual, eps=eps, prenorm=prenorm)

        mamba_simple.selective_scan_fn = selective_scan_ref
        block.layer_norm_fn = mixer_seq_simple.layer_norm_fn = layer_norm_ref_fn
        yield types.SimpleNamespace(model=mixer_seq_simple.MambaLMHeadModel, config=config_mamba.MambaConfig)
    finally:
        sys.path.remove(str(src))
        for k in [k for k in sys.modules if k == "mamba_ssm" or k.startswith("mamba_ssm.")]:
            del sys.modules[k]
        sys.modules.update(saved)
        for k in added:
            sys.modules.pop(k, None)


@pytest.fixture(scope="module")
def mft():
    from torch_standins import register_cpu

    return register_cpu()


CFG = dict(d_model=64, n_layer=3, vocab_size=100, ssm_cfg={"d_state": 8})


def test_the_same_seed_gives_mamba_ssms_model_bit_for_bit(peer, mft):
    torch.manual_seed(11)
    theirs = peer.model(peer.config(**CFG), dtype=torch.float32).state_dict()
    torch.manual_seed(11)
    ours = mft.MambaLMHeadModel(mft.MambaConfig(**CFG), dtype=torch.float32).state_dict()
    assert list(ours) == list(theirs)
    assert [k for k in ours if not torch.equal(ours[k], theirs[k])] == []
    torch.manual_seed(12)  # the check can fail: another seed's weights differ
    other = mft.MambaLMHeadModel(mft.MambaConfig(**CFG), dtype=torch.float32).state_dict()
    assert not torch.equal(other["lm_head.weight"], theirs["lm_head.weight"])


def test_logits_and_greedy_decode_match_mamba_ssms_model_in_float64(peer, mft):
    torch.manual_seed(5)
    ours = mft.MambaLMHeadModel(mft.MambaConfig(**CFG), dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in ours.backbone.layers:  # away from the init's ones and zeros, so a misplaced term shows
            layer.norm.weight.uniform_(0.5, 1.5)
            layer.mixer.D.uniform_(-1, 1)
            layer.mixer.conv1d.bias.uniform_(-0.5, 0.5)
        ours.backbone.norm_f.weight.uniform_(0.5, 1.5)
    theirs = peer.model(peer.config(**{**CFG, "ssm_cfg": {"d_state": 8, "use_fast_path": False}}),
                        dtype=torch.float32)
    theirs.load_state_dict(ours.state_dict())
    theirs = theirs.double().eval()
    ids = torch.randint(0, 100, (2, 7), generator=torch.Generator().manual_seed(3))
    out = ours.generate(ids, 12, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        want = theirs(out.sequences[:, :-1].clone()).logits
        got = ours(ids).logits
    assert torch.allclose(got.double(), want[:, :7], rtol=1e-4, atol=1e-4), float((got.double() - want[:, :7]).abs().max())
    for i, s in enumerate(out.scores):
        assert torch.allclose(s.double(), want[:, 6 + i], rtol=1e-4, atol=1e-4), i
        assert torch.equal(out.sequences[:, 7 + i], want[:, 6 + i].argmax(-1)), i
