"""mamba-ssm's language model on qualified kernels (``mamba_forge.runtime.torch.MambaLMHeadModel``, ``MixerModel``,
``MambaConfig``): mamba_ssm.models.mixer_seq_simple's classes from the outside (config fields, parameter names, so
a mamba-ssm checkpoint loads unchanged; ``forward(input_ids, position_ids=None, inference_params=None,
num_last_tokens=0)`` returning ``.logits``; ``generate`` with its sampling arguments and ``cg=True``;
``from_pretrained`` / ``save_pretrained``), this package's Block and Mamba inside:

    embedding   h = E[input_ids]                          torch's row gather (an exact copy, no arithmetic)
    n_layer x   h, residual = Block(Mamba)(h, residual)   mamba_forge::rms_norm_add + the Mamba layer's kernels
    norm_f      h = rms_norm(residual + h) * w            mamba_forge::rms_norm_add (f32 residual)
    lm_head     logits = h @ W^T (W tied to E)            mamba_forge::gemm, the batch-invariant route

Every row's bits are independent of the batch and of how the sequence was cut into calls (the layer's property,
and the norms and GEMMs are per row), so ``generate``'s decode steps give the logits a full prefill of the same
tokens gives, bit for bit, eager or replayed from a CUDA graph. What the manifest cannot serve (a dtype, the head's
GEMM route, a layer's kernels) is refused when the model is built; configurations mamba-ssm builds from other
modules (attention layers, Mamba2, an MLP, LayerNorm, an unfused norm) are refused with what to change.

Differences from mamba-ssm, on purpose: the inference cache's ssm_state is float32 by default (Mamba's docstring);
``generate`` refuses ``max_length`` not past the prompt (mamba-ssm returns one token more than asked then), reads
input_ids' range once per call (an index past the vocabulary is an error here, not a device assert), and min_p
filters on probabilities (mamba-ssm compares a logit with min_p times the first logit); ``from_pretrained`` takes
a local folder (config.json + pytorch_model.bin or model.safetensors) or, with huggingface_hub installed, a Hub
name, reads the config under a size bound and the weights with ``torch.load(weights_only=True)`` after checking
their size against the config's parameter count; ``save_pretrained`` writes each file whole or not at all.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections import namedtuple
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from torch import nn

from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.tensors import torch_dtype
from mamba_forge.runtime.torch_block import Block, RMSNorm
from mamba_forge.runtime.torch_checkpoint import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    MambaConfig,
    check_config,
    checkpoint_folder,
    few,
    key_differences,
    load_config,
    load_state_dict,
    padded_vocab,
    write_atomic,
)
from mamba_forge.runtime.torch_derived import DerivedTensors
from mamba_forge.runtime.torch_layer import InferenceParams, Mamba, _ops, _records_grad

CausalLMOutput = namedtuple("CausalLMOutput", ["logits"])


@dataclass
class GenerationOutput:
    """What ``generate(..., return_dict_in_generate=True)`` returns: the fields mamba-ssm fills in transformers'
    GenerateDecoderOnlyOutput (sequences [b, L], and with output_scores one [b, vocab] logits tensor per new token)."""

    sequences: torch.Tensor
    scores: tuple | None = None


def _init_weights(module: nn.Module, n_layer: int, initializer_range: float = 0.02,
                  rescale_prenorm_residual: bool = True, n_residuals_per_layer: int = 1) -> None:
    """mamba-ssm's initialisation (GPT-2's scheme): Linear biases zero unless marked _no_reinit, embeddings
    N(0, initializer_range), out_proj rescaled by 1/sqrt(n_residuals_per_layer * n_layer) after a fresh kaiming draw."""
    if isinstance(module, nn.Linear):
        if module.bias is not None and not getattr(module.bias, "_no_reinit", False):
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=initializer_range)
    if rescale_prenorm_residual:
        for name, p in module.named_parameters():
            if name == "out_proj.weight":
                nn.init.kaiming_uniform_(p, a=math.sqrt(5))
                with torch.no_grad():
                    p /= math.sqrt(n_residuals_per_layer * n_layer)


def create_block(d_model, d_intermediate, ssm_cfg=None, attn_layer_idx=None, attn_cfg=None, norm_epsilon=1e-5,
                 rms_norm=False, residual_in_fp32=False, fused_add_norm=False, layer_idx=None, device=None,
                 dtype=None) -> Block:
    """mamba_ssm.models.mixer_seq_simple.create_block: Block(Mamba(layer_idx, **ssm_cfg)) with an RMSNorm of
    norm_epsilon; what these layers do not build (an MLP, attention, Mamba2, LayerNorm, an unfused norm) is refused
    as check_config refuses it."""
    check_config(MambaConfig(d_model=d_model, n_layer=1, d_intermediate=d_intermediate, vocab_size=1,
                             ssm_cfg=dict(ssm_cfg or {}),
                             attn_layer_idx=[0] if layer_idx is not None and layer_idx in (attn_layer_idx or []) else [],
                             rms_norm=rms_norm, fused_add_norm=fused_add_norm, residual_in_fp32=residual_in_fp32))
    factory = {"device": device, "dtype": dtype}
    mamba_args = {k: v for k, v in copy.deepcopy(dict(ssm_cfg or {})).items() if k != "layer"}
    block = Block(d_model, partial(Mamba, layer_idx=layer_idx, **mamba_args, **factory),
                  norm_cls=partial(RMSNorm, eps=norm_epsilon, **factory))
    block.layer_idx = layer_idx
    return block


class MixerModel(nn.Module):
    """mamba_ssm.models.mixer_seq_simple.MixerModel on Block(Mamba): embedding, layers, norm_f. forward returns the
    final norm's output [b, L, d_model] in the model's dtype."""

    def __init__(self, d_model: int, n_layer: int, d_intermediate: int, vocab_size: int, ssm_cfg=None,
                 attn_layer_idx=None, attn_cfg=None, norm_epsilon: float = 1e-5, rms_norm: bool = False,
                 initializer_cfg=None, fused_add_norm=False, residual_in_fp32=False, device=None, dtype=None):
        super().__init__()
        check_config(MambaConfig(d_model=d_model, n_layer=n_layer, d_intermediate=d_intermediate,
                                 vocab_size=vocab_size, ssm_cfg=dict(ssm_cfg or {}),
                                 attn_layer_idx=list(attn_layer_idx or []), rms_norm=rms_norm,
                                 fused_add_norm=fused_add_norm, residual_in_fp32=residual_in_fp32))
        factory = {"device": device, "dtype": dtype}
        self.residual_in_fp32, self.fused_add_norm = True, True
        self.embedding = nn.Embedding(vocab_size, d_model, **factory)
        self.layers = nn.ModuleList(
            create_block(d_model, 0, ssm_cfg=ssm_cfg, norm_epsilon=norm_epsilon, rms_norm=True, residual_in_fp32=True,
                         fused_add_norm=True, layer_idx=i, **factory) for i in range(n_layer))
        self.norm_f = RMSNorm(d_model, eps=norm_epsilon, **factory)
        self.apply(partial(_init_weights, n_layer=n_layer, **(initializer_cfg or {})))

    def allocate_inference_cache(self, batch_size, max_seqlen, dtype=None, **kwargs):
        return {i: layer.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype, **kwargs)
                for i, layer in enumerate(self.layers)}

    def forward(self, input_ids, inference_params=None, **mixer_kwargs):
        hidden_states = self.embedding(input_ids)
        residual = None
        for i, layer in enumerate(self.layers):
            # after the first layer the residual is this forward's own: each layer adds into it (Block)
            hidden_states, residual = layer(hidden_states, residual, inference_params=inference_params,
                                            _owned_residual=i > 0, **mixer_kwargs)
        return self.final_norm(hidden_states, residual, inference_params)

    def final_norm(self, hidden_states, residual, inference_params=None):
        """norm_f(residual + hidden_states) in the hidden states' dtype (mamba-ssm's layer_norm_fn with
        prenorm=False): the add + RMSNorm kernel; differentiable (rms_norm_residual) where autograd records."""
        ops = torch.ops.mamba_forge
        if inference_params is None and _records_grad(self.norm_f, hidden_states, residual):
            return ops.rms_norm_residual(hidden_states, residual.float(), self.norm_f.weight, self.norm_f.eps)[0]
        # the residual is this forward's own (the last Block's sum): updating it in place loses nothing
        return ops.rms_norm_add(hidden_states, residual.float().contiguous(), self.norm_f.weight_f32(),
                                self.norm_f.eps)


class MambaLMHeadModel(nn.Module):
    """mamba_ssm.models.mixer_seq_simple.MambaLMHeadModel on qualified kernels (see the module docstring).

    check_ids: forward reads input_ids' range on the host (one sync a call; generate checks its prompt once either
    way). An engine that validates ids itself and calls forward per decode step may set it False."""

    check_ids: bool = True

    def __init__(self, config: MambaConfig, initializer_cfg=None, device=None, dtype=None, *, kernels=None):
        super().__init__()
        if kernels is not None:
            from mamba_forge.runtime import torch as mft

            mft.register(kernels)
        _ops()  # no kernels registered: say so before building anything
        check_config(config)
        self.config = config
        vocab = padded_vocab(config)
        self.backbone = MixerModel(d_model=config.d_model, n_layer=config.n_layer, d_intermediate=0,
                                   vocab_size=vocab, ssm_cfg=config.ssm_cfg, rms_norm=True,
                                   initializer_cfg=initializer_cfg, fused_add_norm=True, residual_in_fp32=True,
                                   device=device, dtype=dtype)
        self.lm_head = nn.Linear(config.d_model, vocab, bias=False, device=device, dtype=dtype)
        self.apply(partial(_init_weights, n_layer=config.n_layer, **(initializer_cfg or {})))
        self.tie_weights()
        self._derived = DerivedTensors()  # lm_head.weight's [K, N] transpose
        self._graphs: dict = {}  # batch size -> _DecodeGraph
        self.check_kernels()

    def tie_weights(self) -> None:
        if self.config.tie_embeddings:
            self.lm_head.weight = self.backbone.embedding.weight

    # ---- what the manifest must serve --------------------------------------------------------------------------
    def check_kernels(self) -> None:
        """Refuse now what the registered manifest cannot serve: the layers' kernels (checked as each was built),
        the final norm's and the head's GEMM route (N = padded vocabulary, K = d_model)."""
        from mamba_forge.runtime.torch_ops import RMS_NORM_ADD_FAMILY

        _, kernels = _ops()
        act = torch_dtype(self.lm_head.weight.dtype)
        kernels.fn(RMS_NORM_ADD_FAMILY, act)
        n, k = self.lm_head.weight.shape
        try:
            kernels.gemm_route(1, n, k, act)
        except (LaunchRefused, LookupError) as exc:
            raise LaunchRefused(f"MambaLMHeadModel: no qualified GEMM serves lm_head (N={n}, K={k}, {act}): "
                                f"{exc}") from None

    def check_training_kernels(self) -> None:
        """What the first loss.backward() would refuse: each Block's backward kernels, the final norm's, and the
        head's gradient GEMMs (the gemm op's formula for C = A B with B = W^T [d_model, vocab]: dA = dC B^T, nt with
        N = d_model and K = vocab; dB = A^T dC, tn with M = d_model and N = vocab)."""
        from mamba_forge.runtime.torch_autograd import bwd_kernel
        from mamba_forge.runtime.torch_ops import norm_backward_kernels

        _, kernels = _ops()
        act = torch_dtype(self.lm_head.weight.dtype)
        for layer in self.backbone.layers:
            layer.check_training_kernels()
        for fd in norm_backward_kernels(act):
            bwd_kernel("rms_norm_residual", *fd)
        vocab, d_model = self.lm_head.weight.shape
        for what, layout, (m, n, k) in (("input", "nt", (1, d_model, vocab)), ("weight", "tn", (d_model, vocab, 8))):
            try:
                kernels.gemm_route(m, n, k, act, layout=layout)
            except (LaunchRefused, LookupError) as exc:
                raise LaunchRefused(f"MambaLMHeadModel: no qualified GEMM serves lm_head's {what} gradient "
                                    f"({layout}, N={n}, K={k}, {act}): {exc}") from None

    # ---- the head ------------------------------------------------------------------------------------------------
    def _head_weight_t(self) -> torch.Tensor:
        """lm_head.weight as [d_model, vocab] (the layout whose routes hold the decode tiles), made once per weight
        version: a tied weight's update through the embedding moves the same key."""
        return self._derived.get("lm_head_t", self.lm_head.weight, lambda w: w.t().contiguous())

    def _logits(self, hidden_states: torch.Tensor, inference_params) -> torch.Tensor:
        b, length, d = hidden_states.shape
        h = hidden_states.reshape(b * length, d)
        if inference_params is None and _records_grad(self.lm_head, hidden_states):
            # differentiable: the same route on the same operands (the transpose a copy autograd sees)
            logits = torch.ops.mamba_forge.gemm(h.contiguous(), self.lm_head.weight.t().contiguous())
        else:
            logits = Mamba._gemm(h.contiguous(), self._head_weight_t())
        return logits.view(b, length, -1)

    def prepare(self, refresh: bool = False) -> None:
        """Make every derived tensor now (transposed weights, the norms' float32 weights; before a CUDA-graph
        capture). refresh: drop them and the captured decode graphs first, then make them from the weights as they
        are: after a write torch's version counter does not see (through .data, or a replayed CUDA graph of an
        optimizer step); every other change (an optimizer step, load_state_dict, .to()) is seen by itself."""
        if refresh:
            self._forget_derived()
        for layer in self.backbone.layers:
            layer.mixer.prepare()
            layer.norm.weight_f32()
        self.backbone.norm_f.weight_f32()
        self._head_weight_t()

    def _forget_derived(self) -> None:
        self._derived.clear()
        self._graphs.clear()
        for layer in self.backbone.layers:
            layer.mixer.forget_derived()
            layer.norm._derived.clear()
        self.backbone.norm_f._derived.clear()

    def __getstate__(self):
        # a copy or a pickle carries no derived tensor and no captured graph (a CUDA graph cannot be copied; the
        # copy's weights are other tensors anyway): the copy makes and captures its own
        return {**super().__getstate__(), "_derived": DerivedTensors(), "_graphs": {}}

    def _apply(self, fn, recurse=True):
        # .to() / .cpu() / .half(): the head's transpose and the captured graphs (with their memory pools) are of the
        # old weights; the layers and norms forget theirs in their own _apply
        self._derived.clear()
        self._graphs.clear()
        return super()._apply(fn, recurse)

    def weights_key(self) -> tuple:
        """Storage and version of every parameter the derived tensors come from: a captured decode graph reads the
        derived tensors of the weights it was captured with, so generate() captures again when this moves."""
        return (tuple(layer.mixer._sources_key() for layer in self.backbone.layers),
                tuple((p.data_ptr(), p._version, p.dtype) for p in (self.lm_head.weight, self.backbone.norm_f.weight,
                                                                    self.backbone.embedding.weight)),
                tuple((layer.norm.weight.data_ptr(), layer.norm.weight._version) for layer in self.backbone.layers))

    # ---- forward -------------------------------------------------------------------------------------------------
    def allocate_inference_cache(self, batch_size, max_seqlen, dtype=None, **kwargs):
        return self.backbone.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype, **kwargs)

    def forward(self, input_ids, position_ids=None, inference_params=None, num_last_tokens=0, **mixer_kwargs):
        """input_ids [b, L] (int64 token ids below the padded vocabulary) -> CausalLMOutput(logits [b, L, vocab] or
        [b, num_last_tokens, vocab]). position_ids is taken and ignored, as mamba-ssm does."""
        if self.check_ids:
            check_input_ids(input_ids, self.lm_head.weight.shape[0], self.lm_head.weight.device)
        return CausalLMOutput(logits=self.logits_of(input_ids, inference_params, num_last_tokens, **mixer_kwargs))

    def logits_of(self, input_ids, inference_params=None, num_last_tokens=0, **mixer_kwargs) -> torch.Tensor:
        """forward's logits for ids already checked (generate checks the prompt once, then feeds its own tokens).
        With inference_params no graph is recorded (the cache path has no backward; mamba-ssm differentiates it)."""
        if inference_params is not None and torch.is_grad_enabled():
            with torch.no_grad():
                return self.logits_of(input_ids, inference_params, num_last_tokens, **mixer_kwargs)
        hidden_states = self.backbone(input_ids, inference_params=inference_params, **mixer_kwargs)
        if num_last_tokens > 0:
            hidden_states = hidden_states[:, -num_last_tokens:]
        return self._logits(hidden_states, inference_params)

    # ---- generation --------------------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, input_ids, max_length, top_k=1, top_p=0.0, min_p=0.0, temperature=1.0,
                 return_dict_in_generate=False, output_scores=False, repetition_penalty=1.0, eos_token_id=None,
                 teacher_outputs=None, vocab_size=None, cg=False, streamer=None, ssm_dtype=None,
                 enable_timing=False):
        """mamba-ssm's GenerationMixin.generate: greedy (top_k=1, the default) or sampled tokens until max_length
        tokens in all (prompt included) or every sequence's eos_token_id. cg=True replays each decode step from a
        CUDA graph captured once per batch size (and again after a weight changes); ssm_dtype: the cache's state
        dtype (Mamba.allocate_inference_cache); enable_timing prints the wall time as mamba-ssm does. Returns
        sequences [b, length], or GenerationOutput(sequences, scores) with return_dict_in_generate."""
        from mamba_forge.runtime.torch_generate import decode

        return decode(self, input_ids, max_length, top_k=top_k, top_p=top_p, min_p=min_p, temperature=temperature,
                      return_dict_in_generate=return_dict_in_generate, output_scores=output_scores,
                      repetition_penalty=repetition_penalty, eos_token_id=eos_token_id,
                      teacher_outputs=teacher_outputs, vocab_size=vocab_size, cg=cg, streamer=streamer,
                      ssm_dtype=ssm_dtype, enable_timing=enable_timing)

    # ---- checkpoints -------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name, device=None, dtype=None, *, kernels=None, **kwargs):
        """A mamba-ssm checkpoint: a folder with config.json and pytorch_model.bin (or model.safetensors), or a
        Hugging Face Hub name where huggingface_hub is installed. The config and the weights' size are checked
        before anything is loaded; the weights load with weights_only=True (no code runs from the file)."""
        folder = checkpoint_folder(pretrained_model_name)
        config = load_config(folder / CONFIG_NAME)
        model = cls(config, device=device, dtype=dtype, kernels=kernels, **kwargs)
        state = load_state_dict(folder, model)
        if config.tie_embeddings:  # safetensors keeps one name of a shared tensor (save_file refuses both)
            tied = ("backbone.embedding.weight", "lm_head.weight")
            present = [k for k in tied if k in state]
            if len(present) == 1:
                state[tied[1 - tied.index(present[0])]] = state[present[0]]
        missing, unexpected = key_differences(model, state)
        if missing or unexpected:
            raise ValueError(f"{folder}: the checkpoint's tensors are not this config's model (missing "
                             f"{few(missing)}; unexpected {few(unexpected)})")
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:  # a shape that differs: torch's message, on one line
            raise ValueError(f"{folder}: {' '.join(str(exc).split())[:400]}") from None
        return model

    def save_pretrained(self, save_directory) -> None:
        """config.json and pytorch_model.bin in save_directory (made if missing), each written to a temporary file
        beside it and renamed over the old one: a full disk or an interrupt leaves the previous file whole."""
        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / WEIGHTS_NAME, lambda f: torch.save(self.state_dict(), f))
        text = json.dumps(dataclasses.asdict(self.config), indent=4).encode()
        write_atomic(out / CONFIG_NAME, lambda f: f.write(text))


def check_input_ids(input_ids, vocab: int, device) -> None:
    """input_ids: an integer tensor [b, L] on the model's device with every id in [0, vocab): an id past the
    embedding would be a device-side assert (a lost CUDA context), so it is an error here. Reads the range on the
    host (one sync); skipped while a CUDA graph is being captured (generate checks the prompt before)."""
    if not torch.is_tensor(input_ids) or input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids: an int64 tensor [batch, length] of token ids, got "
                         f"{getattr(input_ids, 'dtype', type(input_ids).__name__)}")
    if input_ids.dim() != 2 or input_ids.shape[1] < 1 or input_ids.shape[0] < 1:
        raise ValueError(f"input_ids: [batch, length] with both at least 1, got {list(input_ids.shape)}")
    if input_ids.device != device:
        raise ValueError(f"input_ids are on {input_ids.device}, the model on {device}: move them with .to()")
    if input_ids.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    if torch.compiler.is_compiling():
        return
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"input_ids: token ids from {lo} to {hi}; the model's vocabulary is [0, {vocab})")


__all__ = ["CausalLMOutput", "GenerationOutput", "InferenceParams", "MambaConfig", "MambaLMHeadModel", "MixerModel",
           "check_input_ids", "create_block"]
