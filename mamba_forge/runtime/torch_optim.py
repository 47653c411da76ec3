"""torch.optim.AdamW on qualified kernels (``from mamba_forge.runtime.torch_optim import AdamW``), and gradient-norm
clipping in a fixed order (``clip_grad_norm_``): every update is a launch of a kernel of the loaded manifest
(kernels/fixed/optim.toml), never a torch fallback.

    kernels = load("h200.tar.gz", device=0)
    opt = AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, kernels=kernels)   # kernels: default the registered
    loss.backward()
    clip_grad_norm_(model.parameters(), 1.0, kernels=kernels)    # optional: f32 gradients, bits fixed by the contract
    opt.step()

Kernels and what they are used for:

- ``adamw_step_multi_<T>`` (the default path): one launch per parameter group, dtype and step count, over a device
  table of 48-byte descriptors (``pack_descriptors``: little-endian ``{u64 param, u64 grad, u64 exp_avg,
  u64 exp_avg_sq, i64 numel, f32 weight_decay, u32 reserved = 0}``), with the host ``lr`` and 1-based step. The
  table is uploaded only when an address or size changes (the caching allocator usually hands the gradients the
  same addresses every step).
- ``adamw_step_capturable_f32`` (``capturable=True``): one launch per parameter, ``lr`` and the step count read
  from device memory (the kernel increments the step), so a CUDA graph of ``opt.step()`` replays correctly. lr is
  the group's ``lr`` when that is a float32 device tensor of one element (a schedule may write it between
  replays); a Python float is copied into a device buffer at every step (a captured graph keeps the value it saw).
- ``grad_sumsq_partial_f32`` per gradient (512 f64 partials each, the contract's fixed grid) ->
  ``grad_clip_coef_f32`` over all partials in parameter order (one ascending chain) -> ``scale_grads_dev_f32`` per
  gradient with the device coefficient: torch.nn.utils.clip_grad_norm_'s result (coef = min(1, max_norm /
  (norm + eps))) with no host synchronisation and the same bits on every run. clip_grad_norm_ and the kernel
  lookup (registered_kernels, home_device) live in runtime/torch_clip.py; this module re-exports them.

Which parameter dtypes are served is whatever the manifest serves for the family used (the committed H200 manifest:
adamw_step_multi f32, bf16, f16; the capturable and clipping kernels f32 only); anything else is refused when the
optimizer is built (or a group added), with one LaunchRefused line naming the parameter and what to do.

State, per parameter, as torch.optim.AdamW's (same names and shapes, so its state_dict loads either way): ``step``
(a float32 0-dim CPU tensor; capturable: an int32 0-dim tensor on the parameter's device, the kernel's counter),
``exp_avg`` and ``exp_avg_sq`` (float32 always: for a bf16 or f16 parameter they are f32 master state where torch
keeps them in the parameter's dtype; load_state_dict keeps them f32 instead of casting them to the parameter's).
Parameter groups carry torch.optim.AdamW's keys. ``amsgrad``, ``maximize`` and ``differentiable`` must be False (no
kernel implements them); ``foreach`` and ``fused`` are accepted and change nothing (there is one implementation).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable

import torch

from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.tensors import torch_dtype
from mamba_forge.runtime.torch_clip import (  # clip_grad_norm_ and the shared kernel lookup live in torch_clip.py
    CLIP_COEF_FAMILY,
    GRAD_PARTIALS,
    SCALE_DEV_FAMILY,
    SUMSQ_FAMILY,
    _fetch,
    _shape,
    clip_grad_norm_,
    home_device,
    registered_kernels,
)

MULTI_FAMILY = "adamw_step_multi"  # kernels/fixed/optim.toml
CAPTURABLE_FAMILY = "adamw_step_capturable"
DESC_BYTES = 48  # AdamWTensorDesc (kernels/fixed/optim.cu)
_DESC = struct.Struct("<QQQQqfI")  # param, grad, exp_avg, exp_avg_sq, numel, weight_decay, reserved
_UNSUPPORTED_FLAGS = ("amsgrad", "maximize", "differentiable")
_STEP_MAX = 2**31 - 1  # the kernels' step is an i32
_F32_MAX = 3.4028234663852886e38


def pack_descriptors(entries: Iterable[tuple[int, int, int, int, int, float]]) -> bytes:
    """The adamw_step_multi descriptor table: one 48-byte little-endian record per (param address, grad address,
    exp_avg address, exp_avg_sq address, numel, weight_decay); weight_decay is stored as float32, reserved as 0."""
    out = bytearray()
    for i, (p, g, m, v, numel, wd) in enumerate(entries):
        for name, addr in (("param", p), ("grad", g), ("exp_avg", m), ("exp_avg_sq", v)):
            if type(addr) is not int or not 0 < addr < 2**64:
                raise LaunchRefused(f"adamw descriptor {i}: {name} address {addr!r} is not a non-null 64-bit address")
        if type(numel) is not int or not 0 <= numel < 2**63:
            raise LaunchRefused(f"adamw descriptor {i}: numel {numel!r} is not an integer in 0..2^63-1")
        wd = float(wd)
        if not 0 <= wd <= _F32_MAX:  # NaN fails too
            raise LaunchRefused(f"adamw descriptor {i}: weight_decay {wd!r} is not a finite float32 >= 0")
        out += _DESC.pack(p, g, m, v, numel, wd, 0)
    return bytes(out)


def _scalar(v, what: str) -> float:
    if isinstance(v, torch.Tensor):
        if v.numel() != 1:
            raise LaunchRefused(f"AdamW: {what} is a tensor of {v.numel()} elements; it must be one number")
        v = v.item()
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise LaunchRefused(f"AdamW: {what} is {type(v).__name__} {v!r}; it must be a number")
    return float(v)


def _check_hyper(group: dict) -> None:
    """torch.optim.AdamW's value checks, as LaunchRefused (a ValueError) lines; the flags no kernel implements."""
    for flag in _UNSUPPORTED_FLAGS:
        if group.get(flag):
            raise LaunchRefused(f"AdamW: {flag}=True has no qualified kernel (adamw_step_* implement {flag}=False); "
                                f"use {flag}=False, or torch.optim.AdamW for it")
    if group.get("decoupled_weight_decay", True) is not True:
        raise LaunchRefused("AdamW: decoupled_weight_decay=False is Adam's L2 penalty, which the adamw kernels do not "
                            "implement: load an AdamW state dict")
    lr = group["lr"]
    if isinstance(lr, torch.Tensor) and lr.numel() != 1:
        raise LaunchRefused(f"AdamW: lr is a tensor of {lr.numel()} elements; it must hold one")
    lr_v = _scalar(lr, "lr") if not (isinstance(lr, torch.Tensor) and lr.is_cuda) else 0.0  # no sync for a device lr
    betas = group["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise LaunchRefused(f"AdamW: betas {betas!r} must be a pair (beta1, beta2)")
    b1, b2 = (_scalar(b, f"betas[{i}]") for i, b in enumerate(betas))
    eps, wd = _scalar(group["eps"], "eps"), _scalar(group["weight_decay"], "weight_decay")
    for ok, text in ((math.isfinite(lr_v) and lr_v >= 0, f"Invalid learning rate: {lr_v}"),
                     (math.isfinite(eps) and eps >= 0, f"Invalid epsilon value: {eps}"),
                     (0 <= b1 < 1, f"Invalid beta parameter at index 0: {b1}"),
                     (0 <= b2 < 1, f"Invalid beta parameter at index 1: {b2}"),
                     (math.isfinite(wd) and wd >= 0, f"Invalid weight_decay value: {wd}")):
        if not ok:
            raise LaunchRefused(f"AdamW: {text}")


class AdamW(torch.optim.Optimizer):
    """torch.optim.AdamW (amsgrad and maximize off) whose updates are launches of the manifest's qualified kernels;
    see the module docstring. kernels: a loaded Kernels (default: the one registered with
    mamba_forge.runtime.torch.register)."""

    def __init__(self, params, lr: float | torch.Tensor = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, *, maximize: bool = False, foreach=None,
                 capturable: bool = False, differentiable: bool = False, fused=None, kernels=None):
        self.kernels = kernels if kernels is not None else registered_kernels()
        self._home = home_device(self.kernels)
        self._fns: dict[tuple[str, str], object] = {}
        self._descs: dict[tuple, tuple[tuple, torch.Tensor]] = {}  # launch slot -> (descriptor fields, device table)
        self._arrivals: dict[torch.Tensor, torch.Tensor] = {}  # capturable: each parameter's u32 arrival counter
        self._lr_bufs: dict[int, torch.Tensor] = {}  # capturable: a group's lr on the device, when lr is a float
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "amsgrad": amsgrad,
                    "maximize": maximize, "foreach": foreach, "capturable": capturable,
                    "differentiable": differentiable, "fused": fused, "decoupled_weight_decay": True}
        _check_hyper(defaults)
        super().__init__(params, defaults)

    # ---- what the manifest serves, checked when a group is added -------------------------------------------------
    def _family(self, group: dict) -> str:
        return CAPTURABLE_FAMILY if group.get("capturable") else MULTI_FAMILY

    def _kernel(self, family: str, dtype: str, what: str):
        return _fetch(self.kernels, self._fns, family, dtype, what)

    def _check_param(self, p: torch.Tensor, index: int, family: str) -> str:
        what = f"AdamW: parameter {index} {_shape(p)}"
        if p.layout != torch.strided:
            raise LaunchRefused(f"{what} is {p.layout}; the kernels update dense (strided) parameters only")
        if p.device != self._home:
            raise LaunchRefused(f"{what} is on {p.device}; the kernels run on {self._home}: move the model there "
                                "before building the optimizer")
        if not p.is_contiguous():
            raise LaunchRefused(f"{what} is not contiguous; the kernels update a parameter as one dense span: "
                                "make it contiguous (p.data = p.data.contiguous()) before building the optimizer")
        dtype = torch_dtype(p.dtype)
        self._kernel(family, dtype, what)
        return dtype

    def _check_group(self, group: dict, first: int) -> None:
        _check_hyper(group)
        family = self._family(group)
        for i, p in enumerate(group["params"]):
            self._check_param(p, first + i, family)

    def add_param_group(self, param_group: dict) -> None:
        first = sum(len(g["params"]) for g in self.param_groups)
        super().add_param_group(param_group)
        try:
            self._check_group(self.param_groups[-1], first)
        except BaseException:
            self.param_groups.pop()
            raise

    # ---- state ------------------------------------------------------------------------------------------------
    def _check_state(self, p: torch.Tensor, st: dict, index: int, capturable: bool) -> int:
        """Validate (or create) a parameter's state; returns the step count before this update."""
        if not st:
            st["step"] = (torch.zeros((), dtype=torch.int32, device=p.device) if capturable
                          else torch.tensor(0.0, dtype=torch.float32))
            st["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            st["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            return 0
        for key in ("exp_avg", "exp_avg_sq"):
            t = st.get(key)
            if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.shape != p.shape
                    or t.device != p.device or not t.is_contiguous()):
                got = (f"{t.dtype} {_shape(t)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__)
                raise LaunchRefused(f"AdamW: state {key} of parameter {index} {_shape(p)} is {got}; it must be "
                                    f"float32 {_shape(p)} on {p.device}, contiguous: load a state dict made for these "
                                    "parameters")
        step = st.get("step")
        if not isinstance(step, torch.Tensor) or step.numel() != 1:
            raise LaunchRefused(f"AdamW: state step of parameter {index} is {step!r}; it must be a one-element tensor")
        if capturable:
            if step.dtype != torch.int32 or step.device != p.device or step.dim() != 0:
                st["step"] = step = torch.full((), int(step.item()), dtype=torch.int32, device=p.device)
            return -1  # on the device: the kernel reads and increments it
        if step.device.type != "cpu" or step.dtype != torch.float32 or step.dim() != 0:
            st["step"] = step = torch.tensor(float(step.item()), dtype=torch.float32)
        return int(step.item())

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load (either optimizer's state dicts), then exp_avg and exp_avg_sq kept float32 (torch would cast
        them to a 16-bit parameter's dtype) and step in this optimizer's form. Refused before anything changes: a
        group with a flag no kernel implements, a state of another shape than its parameter."""
        saved_groups = state_dict["param_groups"]
        mine = [p for g in self.param_groups for p in g["params"]]
        saved_ids = [i for g in saved_groups for i in g["params"]]
        if len(saved_groups) != len(self.param_groups) or len(saved_ids) != len(mine):
            raise LaunchRefused(f"AdamW.load_state_dict: the state dict has {len(saved_groups)} groups of "
                                f"{len(saved_ids)} parameters; this optimizer has {len(self.param_groups)} of "
                                f"{len(mine)}")
        for g in saved_groups:
            _check_hyper({**self.defaults, **{k: v for k, v in g.items() if k != "params"}})
        saved_state = state_dict["state"]
        for index, (sid, p) in enumerate(zip(saved_ids, mine, strict=True)):
            for key in ("exp_avg", "exp_avg_sq"):
                t = saved_state.get(sid, {}).get(key)
                if t is not None and (not isinstance(t, torch.Tensor) or t.shape != p.shape):
                    raise LaunchRefused(f"AdamW.load_state_dict: {key} of parameter {index} is "
                                        f"{_shape(t) if isinstance(t, torch.Tensor) else type(t).__name__}; the "
                                        f"parameter is {_shape(p)}")
        super().load_state_dict(state_dict)
        for sid, p in zip(saved_ids, mine, strict=True):
            src = saved_state.get(sid)
            if not src:
                continue
            st = self.state[p]
            for key in ("exp_avg", "exp_avg_sq"):
                if key in src:  # from the saved tensor itself: no round trip through a 16-bit parameter dtype
                    st[key] = src[key].detach().to(device=p.device, dtype=torch.float32, copy=True).contiguous()
            if "step" in src:
                st["step"] = torch.tensor(float(src["step"]), dtype=torch.float32)  # the multi path's form;
                # a capturable group converts it to its device int32 counter at its next step
        self._descs.clear()

    # ---- the update -------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW update of every parameter with a gradient. Everything is checked before the first launch, so a
        refusal (a sparse gradient, an unserved dtype, a state of another shape) changes nothing."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        plans = []
        index = 0
        for gi, group in enumerate(self.param_groups):
            _check_hyper(group)
            capturable = bool(group.get("capturable"))
            family = self._family(group)
            members = []
            for p in group["params"]:
                i, index = index, index + 1
                g = p.grad
                if g is None:
                    continue
                dtype = self._check_param(p, i, family)
                if g.layout != torch.strided:
                    raise LaunchRefused(f"AdamW: the gradient of parameter {i} {_shape(p)} is {g.layout}; the "
                                        "kernels take dense gradients (AdamW does not support sparse gradients)")
                if g.dtype != p.dtype or g.shape != p.shape or g.device != p.device:
                    raise LaunchRefused(f"AdamW: the gradient of parameter {i} is {g.dtype} {_shape(g)} on {g.device}; "
                                        f"the parameter is {p.dtype} {_shape(p)} on {p.device}")
                t = self._check_state(p, self.state[p], i, capturable) + 1
                if t > _STEP_MAX:
                    raise LaunchRefused(f"AdamW: step {t} of parameter {i} does not fit the kernels' int32 step")
                members.append((p, g.contiguous(), self.state[p], dtype, t))
            if members:
                if not capturable and self._home.type == "cuda" and torch.cuda.is_current_stream_capturing():
                    raise LaunchRefused(f"AdamW: step() is being captured in a CUDA graph, but group {gi} has "
                                        "capturable=False (a host step count and table): build the optimizer with "
                                        "capturable=True")
                plans.append((gi, group, members))
        for gi, group, members in plans:
            if group.get("capturable"):
                self._step_capturable(gi, group, members)
            else:
                self._step_multi(gi, group, members)
            # The kernels write through raw pointers: count the writes as torch's own in-place steps do, so what is
            # keyed by a parameter's version (the layers' transposed weights, a captured decode graph) is remade.
            # A replay of a captured step moves no version: call the model's prepare(refresh=True) after one.
            torch.autograd.graph.increment_version([t for p, _, st, _, _ in members
                                                    for t in (p, st["exp_avg"], st["exp_avg_sq"])])
        return loss

    def _step_multi(self, gi: int, group: dict, members: list) -> None:
        lr = _scalar(group["lr"], "lr")
        b1, b2 = (_scalar(b, "betas") for b in group["betas"])
        eps, wd = _scalar(group["eps"], "eps"), _scalar(group["weight_decay"], "weight_decay")
        launches: dict[tuple[str, int], list] = {}
        for p, g, st, dtype, t in members:
            launches.setdefault((dtype, t), []).append((p, g, st))
        for slot, ((dtype, t), items) in enumerate(sorted(launches.items(), key=lambda kv: (kv[0][0], -kv[0][1]))):
            live = [(p, g, st) for p, g, st in items if p.numel() > 0]
            if live:
                fields = tuple((p.data_ptr(), g.data_ptr(), st["exp_avg"].data_ptr(), st["exp_avg_sq"].data_ptr(),
                                p.numel(), wd) for p, g, st in live)
                descs = self._table((gi, dtype, slot), fields)
                self._kernel(MULTI_FAMILY, dtype, "AdamW")(descs=descs, num_tensors=len(live), lr=lr, beta1=b1,
                                                           beta2=b2, eps=eps, step=t)
            for _, _, st in items:
                st["step"].fill_(t)

    def _table(self, slot: tuple, fields: tuple) -> torch.Tensor:
        """The device descriptor table for these fields, uploaded only when they changed since this slot's last."""
        got = self._descs.get(slot)
        if got is not None and got[0] == fields:
            return got[1]
        host = torch.frombuffer(bytearray(pack_descriptors(fields)), dtype=torch.uint8)
        if self._home.type == "cuda":  # pinned, so the copy is asynchronous (the host allocator waits for it)
            table = host.pin_memory().to(self._home, non_blocking=True)
        else:
            table = host.to(self._home)
        self._descs[slot] = (fields, table)
        return table

    def _lr_device(self, gi: int, group: dict) -> torch.Tensor:
        lr = group["lr"]
        if (isinstance(lr, torch.Tensor) and lr.dtype == torch.float32 and lr.device == self._home
                and lr.numel() == 1 and lr.is_contiguous()):
            return lr
        buf = self._lr_bufs.get(gi)
        if buf is None:
            buf = self._lr_bufs[gi] = torch.empty(1, dtype=torch.float32, device=self._home)
        if isinstance(lr, torch.Tensor):
            buf.copy_(lr.reshape(1))
        else:
            buf.fill_(float(lr))
        return buf

    def _step_capturable(self, gi: int, group: dict, members: list) -> None:
        lr = self._lr_device(gi, group)
        b1, b2 = (_scalar(b, "betas") for b in group["betas"])
        eps, wd = _scalar(group["eps"], "eps"), _scalar(group["weight_decay"], "weight_decay")
        for p, g, st, dtype, _ in members:
            if p.numel() == 0:
                st["step"].add_(1)
                continue
            arrivals = self._arrivals.get(p)
            if arrivals is None:  # zero before the first launch; every launch leaves it at 0
                arrivals = self._arrivals[p] = torch.zeros((), dtype=torch.int32, device=p.device).view(torch.uint32)
            self._kernel(CAPTURABLE_FAMILY, dtype, "AdamW")(
                p=p, g=g, m=st["exp_avg"], v=st["exp_avg_sq"], n=p.numel(), lr=lr, step=st["step"],
                arrivals=arrivals, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)


__all__ = ["CAPTURABLE_FAMILY", "CLIP_COEF_FAMILY", "DESC_BYTES", "GRAD_PARTIALS", "MULTI_FAMILY", "SCALE_DEV_FAMILY",
           "SUMSQ_FAMILY", "AdamW", "clip_grad_norm_", "home_device", "pack_descriptors", "registered_kernels"]
