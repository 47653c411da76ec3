"""mamba-ssm's ``RMSNorm`` and ``Block`` (fused residual add + RMSNorm, no MLP) around a mixer, on the add + RMSNorm
kernel (``mamba_forge::rms_norm_add``; ``rms_norm_residual`` where autograd records). Split from torch_layer.py,
whose ``Mamba`` is the usual mixer."""

from __future__ import annotations

import torch
from torch import nn

from mamba_forge.runtime.tensors import torch_dtype
from mamba_forge.runtime.torch_derived import DerivedTensors
from mamba_forge.runtime.torch_layer import _check_casts, _records_grad


class RMSNorm(nn.Module):
    """mamba-ssm's RMSNorm parameters (weight [dim], eps); applied by Block through mamba_forge::rms_norm_add."""

    def __init__(self, hidden_size, eps=1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)
        self._derived = DerivedTensors()

    def __getstate__(self):
        return {**super().__getstate__(), "_derived": DerivedTensors()}  # see Mamba.__getstate__

    def _apply(self, fn, recurse=True):
        self._derived.clear()  # of the old weight (see Mamba._apply)
        return super()._apply(fn, recurse)

    @torch.compiler.disable  # a cache keyed by storage and version: kept out of traced graphs
    def weight_f32(self) -> torch.Tensor:
        """The weight as the kernel takes it (float32, contiguous): a 16-bit weight's copy made once per version
        rather than a cast kernel every call (one launch a layer at decode)."""
        w = self.weight
        if w.dtype == torch.float32 and w.is_contiguous():
            return w
        return self._derived.get("weight_f32", w, lambda v: v.float().contiguous())


class Block(nn.Module):
    """mamba_ssm.modules.block.Block with fused add + RMSNorm (residual in float32), no MLP:
    residual = hidden + residual; hidden = mixer(rms_norm(residual) * norm.weight). Returns (hidden, residual), the
    residual a new tensor as mamba-ssm's (the caller's is copied first), except inside MixerModel, whose layers add
    into one residual tensor of its own forward (the kernel updates it in place: no copy a layer); a forward hook
    that keeps a layer's residual there must clone it."""

    def __init__(self, dim, mixer_cls, mlp_cls=nn.Identity, norm_cls=RMSNorm, fused_add_norm=True,
                 residual_in_fp32=True):
        super().__init__()
        if mlp_cls is not nn.Identity or not fused_add_norm or not residual_in_fp32:
            raise ValueError("Block: the qualified path is fused add + RMSNorm with a float32 residual and no MLP")
        self.residual_in_fp32, self.fused_add_norm = True, True
        self.norm = norm_cls(dim)
        self.mixer = mixer_cls(dim)
        self.mlp = None
        if not isinstance(self.norm, RMSNorm):
            raise ValueError("Block: norm_cls must make an RMSNorm")

    def forward(self, hidden_states, residual=None, inference_params=None, *, _owned_residual=False,
                **mixer_kwargs):
        if inference_params is None and _records_grad(self, hidden_states, residual):
            # differentiable: mamba_forge::rms_norm_residual, the same kernel on a copy of the residual
            residual = (torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
                        if residual is None else residual.float())
            hidden_states, residual, _ = torch.ops.mamba_forge.rms_norm_residual(hidden_states, residual,
                                                                                 self.norm.weight, self.norm.eps)
            return self.mixer(hidden_states, **mixer_kwargs), residual
        if _records_grad(self, hidden_states, residual):  # a float32 norm weight is the parameter itself
            with torch.no_grad():  # the cache path records no graph (see Mamba.forward)
                return self.forward(hidden_states, residual, inference_params, _owned_residual=_owned_residual,
                                    **mixer_kwargs)
        if residual is None:
            residual = torch.zeros(hidden_states.shape, dtype=torch.float32, device=hidden_states.device)
        else:
            given, residual = residual, residual.float().contiguous()
            if residual is given and not _owned_residual:
                residual = residual.clone()  # rms_norm_add adds into it: never into the caller's tensor
        hidden_states = torch.ops.mamba_forge.rms_norm_add(hidden_states, residual, self.norm.weight_f32(),
                                                           self.norm.eps)
        return self.mixer(hidden_states, inference_params=inference_params, **mixer_kwargs), residual

    def allocate_inference_cache(self, batch_size, max_seqlen, dtype=None, **kwargs):
        return self.mixer.allocate_inference_cache(batch_size, max_seqlen, dtype=dtype, **kwargs)

    def check_training_kernels(self) -> None:
        """The mixer's (Mamba.check_training_kernels) and the add + RMSNorm's backward kernels."""
        from mamba_forge.runtime.torch_autograd import bwd_kernel
        from mamba_forge.runtime.torch_ops import norm_backward_kernels

        act = torch_dtype(self.mixer.in_proj.weight.dtype)
        for fd in norm_backward_kernels(act):
            bwd_kernel("rms_norm_residual", *fd)
        _check_casts(act, [self.norm.weight])
        self.mixer.check_training_kernels()


__all__ = ["Block", "RMSNorm"]
