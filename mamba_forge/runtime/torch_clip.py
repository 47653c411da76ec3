"""Gradient-norm clipping on qualified kernels, in a fixed order (``clip_grad_norm_``), and the kernel lookup it shares
with the optimizer (runtime/torch_optim.py): the registered Kernels, their torch device, and fetching a family's
kernel for a dtype with one LaunchRefused line when the manifest does not serve it.

    clip_grad_norm_(model.parameters(), 1.0, kernels=kernels)    # f32 gradients, bits fixed by the contract

``grad_sumsq_partial_f32`` per gradient (512 f64 partials each, the contract's fixed grid) -> ``grad_clip_coef_f32``
over all partials in parameter order (one ascending chain) -> ``scale_grads_dev_f32`` per gradient with the device
coefficient: torch.nn.utils.clip_grad_norm_'s result (coef = min(1, max_norm / (norm + eps))) with no host
synchronisation and the same bits on every run. ``from mamba_forge.runtime.torch_optim import clip_grad_norm_`` and
``mamba_forge.runtime.torch.clip_grad_norm_`` are this function.
"""

from __future__ import annotations

import math

import torch

from mamba_forge.runtime.errors import LaunchRefused, LoadError
from mamba_forge.runtime.tensors import torch_dtype

SUMSQ_FAMILY = "grad_sumsq_partial"  # kernels/fixed/optim.toml
CLIP_COEF_FAMILY = "grad_clip_coef"
SCALE_DEV_FAMILY = "scale_grads_dev"
GRAD_PARTIALS = 512  # grad_sumsq_partial's fixed grid of f64 partials (kernels/fixed/optim.cu: GRAD_PARTIALS)


def _line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def registered_kernels():
    """The Kernels registered with mamba_forge.runtime.torch.register (what the layers use)."""
    from mamba_forge.runtime import torch as mft

    k = mft._state["kernels"]
    if k is None:
        raise LaunchRefused("mamba_forge optimizers need loaded kernels: pass kernels=load(...) or call "
                            "mamba_forge.runtime.torch.register(kernels) first")
    return k


def home_device(kernels) -> torch.device:
    """The torch device the kernels launch on: cuda:<ordinal> of a loaded Kernels (kernels.device is its
    DeviceInfo); a stand-in whose ``device`` is a torch.device (the CPU tests' float64 references) runs there."""
    dev = getattr(kernels, "device", None)
    if isinstance(dev, torch.device):
        return dev
    ordinal = getattr(dev, "ordinal", None)
    if type(ordinal) is not int:
        raise LaunchRefused(f"{type(kernels).__name__} says no device: pass the Kernels that load() returned")
    return torch.device("cuda", ordinal)


def _shape(t: torch.Tensor) -> str:
    return str(list(t.shape))


def _fetch(kernels, cache: dict, family: str, dtype: str, what: str):
    """kernels.fn(family, dtype), or one LaunchRefused line saying what is not served and what to do."""
    k = cache.get((family, dtype))
    if k is not None:
        return k
    try:
        k = kernels.fn(family, dtype)
    except LoadError as exc:
        served = ""
        summary = getattr(kernels, "summary", None)
        if callable(summary):
            try:
                have = summary().available.get(family, ())
                served = f"; it serves {', '.join(have) if have else 'no dtype of it'}"
            except Exception:  # noqa: BLE001 - the summary only decorates the refusal
                served = ""
        raise LaunchRefused(f"{what} is {dtype}, which this manifest's {family} kernels do not serve ({_line(exc)})"
                            f"{served}: convert it to a served dtype or load a manifest that qualifies "
                            f"{family}_{dtype}") from None
    cache[(family, dtype)] = k
    return k


@torch.no_grad()
def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach=None, *, eps: float = 1e-6, kernels=None) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ on qualified kernels, in a fixed order: the 2-norm of all gradients (f64
    partials per gradient in parameter order, one ascending fold), then every gradient scaled in place by
    min(1, max_norm / (norm + eps)), all on the device (no host synchronisation). Returns the pre-clip norm (a
    float32 0-dim device tensor). A non-finite norm propagates into the gradients as torch's does with
    error_if_nonfinite=False. Refused: another norm_type, error_if_nonfinite=True (it needs a host read: check
    the returned norm), a gradient dtype the manifest's clipping kernels do not serve (f32 on the H200 manifest),
    sparse or non-contiguous gradients (they are scaled in place)."""
    kernels = kernels if kernels is not None else registered_kernels()
    home = home_device(kernels)
    if float(norm_type) != 2.0:
        raise LaunchRefused(f"clip_grad_norm_: norm_type {norm_type!r}; the clipping kernels compute the 2-norm")
    if error_if_nonfinite:
        raise LaunchRefused("clip_grad_norm_: error_if_nonfinite=True needs a host read of the norm; pass False and "
                            "check the returned norm (torch.isfinite) where a synchronisation is acceptable")
    max_norm, eps = float(max_norm), float(eps)
    if not (math.isfinite(max_norm) and max_norm >= 0 and math.isfinite(eps) and eps >= 0):
        raise LaunchRefused(f"clip_grad_norm_: max_norm {max_norm!r} and eps {eps!r} must be finite and >= 0")
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    cache: dict = {}
    grads = []
    for i, p in enumerate(parameters):
        g = p.grad
        if g is None:
            continue
        what = f"clip_grad_norm_: the gradient of parameter {i} {_shape(p)}"
        if g.layout != torch.strided:
            raise LaunchRefused(f"{what} is {g.layout}; the clipping kernels take dense gradients")
        if g.device != home:
            raise LaunchRefused(f"{what} is on {g.device}; the kernels run on {home}")
        if not g.is_contiguous():
            raise LaunchRefused(f"{what} is not contiguous; it is scaled in place as one dense span")
        dtype = torch_dtype(g.dtype)
        for family in (SUMSQ_FAMILY, SCALE_DEV_FAMILY):
            _fetch(kernels, cache, family, dtype, what)
        if g.numel() > 0:
            grads.append((g, dtype))
    coef_fn = _fetch(kernels, cache, CLIP_COEF_FAMILY, "f32", "clip_grad_norm_: the clip coefficient")
    partials = torch.empty(GRAD_PARTIALS * max(len(grads), 1), dtype=torch.float64, device=home)
    if not grads:
        partials.zero_()
    for j, (g, dtype) in enumerate(grads):
        _fetch(kernels, cache, SUMSQ_FAMILY, dtype, "")(partials=partials[j * GRAD_PARTIALS:(j + 1) * GRAD_PARTIALS],
                                                        g=g, n=g.numel())
    coef = torch.empty(1, dtype=torch.float32, device=home)
    norm = torch.empty(1, dtype=torch.float32, device=home)
    coef_fn(coef=coef, norm=norm, partials=partials, num_partials=partials.numel(), max_norm=max_norm, eps=eps)
    for g, dtype in grads:
        _fetch(kernels, cache, SCALE_DEV_FAMILY, dtype, "")(g=g, n=g.numel(), scale=coef)
    torch.autograd.graph.increment_version([g for g, _ in grads])  # scaled in place through raw pointers
    return norm.view(())

__all__ = ["CLIP_COEF_FAMILY", "GRAD_PARTIALS", "SCALE_DEV_FAMILY", "SUMSQ_FAMILY", "clip_grad_norm_", "home_device",
           "registered_kernels"]
