"""A drop-in Mamba-1 layer on qualified kernels (``mamba_forge.runtime.torch.Mamba``, ``Block``): mamba-ssm's
``Mamba`` and ``Block`` from the outside (constructor arguments, parameter names, so ``load_state_dict`` takes a
mamba-ssm state dict unchanged; ``forward(hidden_states, inference_params=None)``, ``step``,
``allocate_inference_cache``), our kernels inside, launched through the torch ops of ``runtime/torch.py``:

    in_proj   xz [b*L, 2*d_inner]        = hidden @ W_in^T            mamba_forge::gemm (batch-invariant route)
    conv      x  [b, L, d_inner]          = silu(conv(xz[..., :d]))    mamba_forge::conv_tokens (conv_state in place)
    x_proj    x_dbl [b*L, dt_rank + 2N]   = x @ W_x^T                  mamba_forge::gemm
    dt_proj   dt [b*L, d_inner]           = x_dbl[:, :dt_rank] @ W_dt^T  (the bias enters the scan, as mamba-ssm;
                                            A read in place through its row stride where the rung's tensor map
                                            takes one, as mamba-ssm reads these columns, else a dense copy)
    scan      y  [b, L, d_inner]          (z = xz[..., d:], B, C read from x_dbl; ssm_state in place)
    out_proj  out [b*L, d_model]          = y @ W_out^T

Prefill, chunked prefill (``inference_params.seqlen_offset > 0`` with several tokens) and decode (one token) run
the same per-element arithmetic (a one-token scan runs the production decode step ssm_step_forward_fused, which the
token scan follows bit for bit), so a token gets the same bits however its sequence was split (issue 23); every GEMM row's bits
are independent of how many rows were multiplied, so the output of sequence i does not depend on the batch.

Training: with autograd recording (grad mode on, a parameter or the input requiring grad) and no inference_params,
``forward`` runs ``mamba_forge::mamba_mixer`` (runtime/torch_train.py): the same kernels on the same operands
from zero states, so the same output bits, the scan in 256-step chunks whose states it saves, and a registered
backward on the catalog's backward kernels giving the gradients of the input and of every parameter, in fixed
order (bit-identical run to run; sequence i's input gradient independent of the batch). ``Block`` trains through
``mamba_forge::rms_norm_residual`` (the add + RMSNorm kernel on a copy of the residual). Nothing else is needed to
train: ``loss.backward()`` on requires-grad parameters. ``check_training_kernels()`` refuses ahead what the first
backward would (a backward kernel the manifest lacks). torch.no_grad() and inference_params run the inference path.

Differences from mamba-ssm, on purpose: the inference cache holds conv_state [b, d_inner, d_conv-1] in the
activation dtype and ssm_state [b, d_inner, d_state] in float32 by default (the kernels' state: a decode continues a
prefill bit for bit; ``allocate_inference_cache(..., ssm_dtype=torch.bfloat16)`` keeps it in the activations' dtype
as mamba-ssm does, half the bytes a decode step moves, rounded at every step); ``seqlen_offset > 0`` with
more than one token continues the sequence (mamba-ssm asserts one token). Only kernels of the registered manifest
run: a dtype, shape or route the manifest cannot serve is an error when the layer is built, never a fallback.
The GEMMs read transposed weights ([K, N], the layout whose routes hold the decode tiles), made once per weight
version (``prepare()`` makes them ahead, e.g. before a CUDA-graph capture).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.gemm import a_as_read
from mamba_forge.runtime.tensors import torch_dtype
from mamba_forge.runtime.torch_derived import DerivedTensors


@dataclass
class InferenceParams:
    """mamba-ssm's inference cache record (mamba_ssm.utils.generation.InferenceParams), for users without it:
    the layers keep (conv_state, ssm_state) per layer_idx in key_value_memory_dict."""

    max_seqlen: int
    max_batch_size: int
    seqlen_offset: int = 0
    batch_size_offset: int = 0
    key_value_memory_dict: dict = field(default_factory=dict)
    lengths_per_sample: torch.Tensor | None = None

    def reset(self, max_seqlen: int, max_batch_size: int) -> None:
        self.max_seqlen, self.max_batch_size, self.seqlen_offset = max_seqlen, max_batch_size, 0
        if self.lengths_per_sample is not None:
            self.lengths_per_sample.zero_()


_mft = None  # mamba_forge.runtime.torch (which imports this module): taken on the first call, not per call


def _ops():
    global _mft
    mft = _mft
    if mft is None:
        from mamba_forge.runtime import torch as mft

        _mft = mft
    if mft._state["kernels"] is None:
        raise LaunchRefused("mamba_forge layers need loaded kernels: pass kernels=load(...) or call "
                            "mamba_forge.runtime.torch.register(kernels) first")
    return mft, mft._state["kernels"]


class Mamba(nn.Module):
    """mamba_ssm.modules.mamba_simple.Mamba on qualified kernels (see the module docstring)."""

    def __init__(self, d_model, d_state=16, d_conv=4, expand=2, dt_rank="auto", dt_min=0.001, dt_max=0.1,
                 dt_init="random", dt_scale=1.0, dt_init_floor=1e-4, conv_bias=True, bias=False, use_fast_path=True,
                 layer_idx=None, device=None, dtype=None, *, kernels=None):
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__()
        self.d_model, self.d_state, self.d_conv, self.expand = d_model, d_state, d_conv, expand
        self.d_inner = int(self.expand * self.d_model)
        self.dt_rank = math.ceil(self.d_model / 16) if dt_rank == "auto" else dt_rank
        self.use_fast_path = use_fast_path  # kept for mamba-ssm's signature: there is one path here
        self.layer_idx = layer_idx
        if not 2 <= d_conv <= 4:
            raise ValueError(f"d_conv={d_conv}: the conv kernels take widths 2..4")
        self.in_proj = nn.Linear(self.d_model, self.d_inner * 2, bias=bias, **factory_kwargs)
        self.conv1d = nn.Conv1d(in_channels=self.d_inner, out_channels=self.d_inner, bias=conv_bias,
                                kernel_size=d_conv, groups=self.d_inner, padding=d_conv - 1, **factory_kwargs)
        self.activation = "silu"
        self.act = nn.SiLU()
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + self.d_state * 2, bias=False, **factory_kwargs)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True, **factory_kwargs)
        dt_init_std = self.dt_rank ** -0.5 * dt_scale
        if dt_init == "constant":
            nn.init.constant_(self.dt_proj.weight, dt_init_std)
        elif dt_init == "random":
            nn.init.uniform_(self.dt_proj.weight, -dt_init_std, dt_init_std)
        else:
            raise NotImplementedError(f"dt_init={dt_init!r}: 'random' or 'constant'")
        dt = torch.exp(torch.rand(self.d_inner, **factory_kwargs) * (math.log(dt_max) - math.log(dt_min))
                       + math.log(dt_min)).clamp(min=dt_init_floor)
        inv_dt = dt + torch.log(-torch.expm1(-dt))  # inverse of softplus
        with torch.no_grad():
            self.dt_proj.bias.copy_(inv_dt)
        self.dt_proj.bias._no_reinit = True
        A = torch.arange(1, self.d_state + 1, dtype=torch.float32, device=device).repeat(self.d_inner, 1).contiguous()
        self.A_log = nn.Parameter(torch.log(A))
        self.A_log._no_weight_decay = True
        self.D = nn.Parameter(torch.ones(self.d_inner, device=device))
        self.D._no_weight_decay = True
        self.out_proj = nn.Linear(self.d_inner, self.d_model, bias=bias, **factory_kwargs)
        self._derived = DerivedTensors()
        self._weights_memo: tuple | None = None  # (_sources_key(), _make_weights()) of the last call
        if kernels is not None:
            from mamba_forge.runtime import torch as mft

            mft.register(kernels)
        self.check_kernels()

    # ---- what the manifest must serve ---------------------------------------------------------------------------
    def check_kernels(self) -> None:
        """Refuse now what no qualified kernel of the registered manifest serves (dtype, widths, GEMM routes)."""
        _, kernels = _ops()
        act = torch_dtype(self.in_proj.weight.dtype)
        from mamba_forge.runtime.torch_ops import CONV_TOKENS_FAMILY, SCAN_TOKENS_FAMILY, SEQUENCE_DTYPES

        if act not in SEQUENCE_DTYPES:
            raise LaunchRefused(f"Mamba: parameters are {act}; the layer runs f32, bf16 or f16")
        for family in (CONV_TOKENS_FAMILY, SCAN_TOKENS_FAMILY):
            kernels.fn(family, act)
        if self.d_state > kernels.fn(SCAN_TOKENS_FAMILY, act).symbol.state_capacity:
            raise LaunchRefused(f"Mamba: d_state={self.d_state} is over the manifest's state capacity")
        for name, (n, k) in self._gemm_shapes().items():
            try:
                kernels.gemm_route(1, n, k, act)
            except (LaunchRefused, LookupError) as exc:  # LookupError: routes.NoRoute
                raise LaunchRefused(f"Mamba: no qualified GEMM serves {name} (N={n}, K={k}, {act}): {exc}") from None

    def check_training_kernels(self) -> None:
        """Refuse now what the backward would refuse at the first loss.backward(): a backward kernel of the
        registered manifest missing for this layer's dtype and widths, or no nn route for an input gradient's
        GEMM. (Training needs nothing else: the forward is the inference kernels.)"""
        from mamba_forge.runtime.torch_train import backward_kernels

        _, kernels = _ops()
        act = torch_dtype(self.in_proj.weight.dtype)
        backward_kernels(act, self.d_inner, self.d_state)
        for name, (n, k) in self._gemm_shapes().items():  # dX = dY W: N and K swapped
            try:
                kernels.gemm_route(1, k, n, act)
            except (LaunchRefused, LookupError) as exc:
                raise LaunchRefused(f"Mamba: no qualified GEMM serves {name}'s input gradient (N={k}, K={n}, "
                                    f"{act}): {exc}") from None
        _check_casts(act, [self.conv1d.weight, self.conv1d.bias, self.dt_proj.bias, self.A_log, self.D])

    def _gemm_shapes(self) -> dict[str, tuple[int, int]]:
        return {"in_proj": (2 * self.d_inner, self.d_model), "x_proj": (self.dt_rank + 2 * self.d_state, self.d_inner),
                "dt_proj": (self.d_inner, self.dt_rank), "out_proj": (self.d_model, self.d_inner)}

    # ---- derived tensors (transposed weights, f32 vectors; torch_derived.py), remade when a parameter changes ---
    # every parameter a derived tensor comes from: (submodule or None for the layer's own, parameter name), in the
    # order _make_weights takes them, so the key and the derived tensors read the same list
    _SOURCES = (("in_proj", "weight"), ("x_proj", "weight"), ("dt_proj", "weight"), ("out_proj", "weight"),
                ("conv1d", "weight"), ("conv1d", "bias"), ("dt_proj", "bias"), (None, "A_log"), (None, "D"))

    def _source_tensors(self) -> tuple:
        """The _SOURCES parameters, read from the dicts nn.Module keeps them in (each name through
        nn.Module.__getattr__ costs about a microsecond)."""
        mods, own = self._modules, self._parameters
        return tuple([own[name] if m is None else mods[m]._parameters[name] for m, name in self._SOURCES])

    @staticmethod
    def _key(sources) -> tuple:
        """(storage, version, dtype, device) of each source: a replaced submodule or parameter, an in-place update or
        a move changes it."""
        return tuple([None if p is None else (p.data_ptr(), p._version, p.dtype, p.device) for p in sources])

    def _sources_key(self) -> tuple:
        return self._key(self._source_tensors())

    @torch.compiler.disable  # a cache keyed by storage and version: kept out of traced graphs
    def _weights(self):
        """The derived tensors, remade where a source changed; one key over all of them first (a decode step asks
        every call: 56 -> 15 us on the CPU machine), then each tensor's own (DerivedTensors) when that key moved."""
        sources = self._source_tensors()
        key = self._key(sources)
        hit = self._weights_memo
        if hit is not None and hit[0] == key:
            return hit[1]
        w = self._make_weights(*sources)
        self._weights_memo = (key, w)
        return w

    def _make_weights(self, in_w, x_w, dt_w, out_w, conv_w, conv_b, dt_b, A_log, D):
        t = lambda w: w.t().contiguous()  # noqa: E731  Linear's [N, K] -> [K, N]
        f32 = lambda v: v.float().contiguous()  # noqa: E731
        d = self._derived.get
        conv_b = (d("conv_b", conv_b, f32) if conv_b is not None
                  else d("conv_b0", conv_w, lambda w: w.new_zeros(w.shape[0], dtype=torch.float32)))
        return {
            "in": d("in", in_w, t), "x": d("x", x_w, t), "dt": d("dt", dt_w, t), "out": d("out", out_w, t),
            "conv_w": d("conv_w", conv_w, lambda w: w.reshape(w.shape[0], -1).float().contiguous()),
            "conv_b": conv_b, "dt_bias": d("dt_bias", dt_b, f32), "A_log": d("A_log", A_log, f32), "D": d("D", D, f32),
        }

    def prepare(self, refresh: bool = False) -> None:
        """Make the derived tensors now (before a CUDA-graph capture: the capture then allocates none). refresh:
        make them again from the weights as they are: after a write torch's version counter does not see (through
        .data, or a replayed CUDA graph of an optimizer step); every other change is seen by itself."""
        if refresh:
            self.forget_derived()
        self._weights()

    def forget_derived(self) -> None:
        """Drop the derived tensors (and their memory); the next call makes them from the weights."""
        self._derived.clear()
        self._weights_memo = None

    def __getstate__(self):
        # a copy or a pickle (copy.deepcopy, torch.save of the module) carries the weights, not what was made from
        # them: the copy makes its own at its first call
        return {**super().__getstate__(), "_derived": DerivedTensors(), "_weights_memo": None}

    def _apply(self, fn, recurse=True):
        # .to() / .cpu() / .half(): the derived tensors are of the old weights (and would keep their memory on
        # the old device); a moved parameter may also land at a freed address with its version unchanged
        self.forget_derived()
        return super()._apply(fn, recurse)

    # ---- inference cache ----------------------------------------------------------------------------------------
    def allocate_inference_cache(self, batch_size, max_seqlen, dtype=None, ssm_dtype=None, **kwargs):
        """(conv_state, ssm_state). ssm_dtype: float32 by default (a decode continues a prefill bit for bit);
        the activations' 16-bit dtype (mamba-ssm's default) halves the state's bytes at every decode step, which
        then rounds the state each step (no longer the prefill's bits)."""
        device = self.out_proj.weight.device
        conv_dtype = self.in_proj.weight.dtype if dtype is None else dtype
        ssm_dtype = torch.float32 if ssm_dtype is None else ssm_dtype
        if ssm_dtype not in (torch.float32, conv_dtype):
            raise ValueError(f"Mamba.allocate_inference_cache: ssm_dtype {ssm_dtype} is neither float32 nor the "
                             f"cache's activation dtype {conv_dtype}")
        conv_state = torch.zeros(batch_size, self.d_inner, self.d_conv - 1, device=device, dtype=conv_dtype)
        ssm_state = torch.zeros(batch_size, self.d_inner, self.d_state, device=device, dtype=ssm_dtype)
        return conv_state, ssm_state

    def _get_states_from_cache(self, inference_params, batch_size, initialize_states=False):
        if self.layer_idx is None:
            raise ValueError("Mamba: an inference cache needs layer_idx (the key of its states)")
        cache = inference_params.key_value_memory_dict
        if self.layer_idx not in cache:
            cache[self.layer_idx] = self.allocate_inference_cache(batch_size, inference_params.max_seqlen)
        conv_state, ssm_state = cache[self.layer_idx]
        if initialize_states:
            conv_state.zero_()
            ssm_state.zero_()
        return conv_state, ssm_state

    # ---- forward --------------------------------------------------------------------------------------------------
    def forward(self, hidden_states, inference_params=None):
        """hidden_states [b, L, d_model] -> [b, L, d_model]. With inference_params: seqlen_offset == 0 starts the
        sequence from zero states; > 0 continues it (one token: a decode step; more: a chunk of prefill). With
        autograd recording and no inference_params: the training op (the same kernels and bits, differentiable)."""
        if inference_params is None and _records_grad(self, hidden_states):
            return self._train(hidden_states)
        if _records_grad(self, hidden_states):
            with torch.no_grad():  # the cache path records no graph (its ops have no backward): no grad_fn at all
                return self.forward(hidden_states, inference_params)
        batch, seqlen, _ = hidden_states.shape
        if inference_params is not None:
            conv_state, ssm_state = self._get_states_from_cache(
                inference_params, batch, initialize_states=inference_params.seqlen_offset == 0)
            if (tuple(conv_state.shape) != (batch, self.d_inner, self.d_conv - 1)
                    or ssm_state.dtype not in (torch.float32, hidden_states.dtype)):
                raise LaunchRefused("Mamba: the cache's states are not this layer's (conv_state [b, d_inner, "
                                    "d_conv-1], ssm_state [b, d_inner, d_state] float32 or the activations' dtype): "
                                    "allocate them with allocate_inference_cache")
        else:
            conv_state, ssm_state = self.allocate_inference_cache(batch, seqlen, dtype=hidden_states.dtype)
        return self._run(hidden_states, conv_state, ssm_state)

    def step(self, hidden_states, conv_state, ssm_state):
        """One token [b, 1, d_model] from the given states (updated in place): (out, conv_state, ssm_state)."""
        if hidden_states.shape[1] != 1:
            raise ValueError(f"Mamba.step decodes one token at a time; got {hidden_states.shape[1]}")
        return self._run(hidden_states, conv_state, ssm_state), conv_state, ssm_state

    @staticmethod
    def _gemm(A, B, bias=None):
        """kernels.gemm eagerly (the lighter host path); the mamba_forge::gemm op, the same call, where torch.compile
        traces (the op has a fake implementation). A row-strided A (dt_proj's x_dbl[:, :dt_rank]) is read in place
        where the serving rung reads A through a tensor map, else copied to a dense one here (the same bits)."""
        if torch.compiler.is_compiling():
            return torch.ops.mamba_forge.gemm(A, B, bias)
        kernels = _ops()[1]
        return kernels.gemm(a_as_read(kernels, A, B, bias=bias), B, bias=bias)

    def _train(self, hidden_states):
        """mamba_forge::mamba_mixer (runtime/torch_train.py): the inference forward's kernels from zero states,
        saving what its registered backward reads."""
        p = (self.in_proj.weight, self.in_proj.bias, self.conv1d.weight, self.conv1d.bias, self.x_proj.weight,
             self.dt_proj.weight, self.dt_proj.bias, self.A_log, self.D, self.out_proj.weight, self.out_proj.bias)
        return torch.ops.mamba_forge.mamba_mixer(hidden_states, *p)[0]

    def _run(self, hidden_states, conv_state, ssm_state):
        ops = torch.ops.mamba_forge
        batch, seqlen, _ = hidden_states.shape
        w = self._weights()
        tokens = batch * seqlen
        h = hidden_states.reshape(tokens, self.d_model).contiguous()
        xz = self._gemm(h, w["in"], self.in_proj.bias).view(batch, seqlen, 2 * self.d_inner)
        x = ops.conv_tokens(xz, w["conv_w"], w["conv_b"], conv_state)
        x_dbl = self._gemm(x.view(tokens, self.d_inner), w["x"])
        dt = self._gemm(x_dbl[:, :self.dt_rank], w["dt"])  # a view: no column copy where the rung reads it so
        y = ops.scan_tokens(x, dt.view(batch, seqlen, self.d_inner), w["dt_bias"], w["A_log"],
                            x_dbl.view(batch, seqlen, -1), w["D"], xz, ssm_state)
        out = self._gemm(y.view(tokens, self.d_inner), w["out"], self.out_proj.bias)
        return out.view(batch, seqlen, self.d_model)


def _records_grad(module: nn.Module, *tensors) -> bool:
    """Whether autograd records this call: grad mode on and a parameter or an input that requires grad."""
    if not torch.is_grad_enabled():
        return False
    return (any(t is not None and t.requires_grad for t in tensors)
            or any(p.requires_grad for p in module.parameters()))


def _check_casts(act: str, params) -> None:
    """The cast kernels that narrow f32 gradient sums to these parameters' dtypes (and the activations')."""
    from mamba_forge.runtime.torch_autograd import cast_kernel

    for dt in ({torch_dtype(p.dtype) for p in params if p is not None} | {act}) - {"f32"}:
        cast_kernel("training", "f32", dt)


__all__ = ["InferenceParams", "Mamba"]
