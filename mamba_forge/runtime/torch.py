"""torch integration (imported only when asked: ``import mamba_forge.runtime.torch``): the main families as
``torch.library`` custom ops, so they compose with torch.compile and CUDA graphs.

    import mamba_forge.runtime.torch as mft
    mft.register(load("h200.tar.gz", device=0))
    y = torch.ops.mamba_forge.softplus_forward(x)
    y, rstd = torch.ops.mamba_forge.rms_norm(x, w, 1e-5, torch.bfloat16)   # x f32 [..., dim], w f32 [dim]
    y = torch.ops.mamba_forge.causal_conv1d(x, w, b)       # silu(conv + b): x [batch, d, L], w [d, width] f32
    out, last_state = torch.ops.mamba_forge.selective_scan(u, delta, A_log, B, C, D, z, delta_bias)
    c = torch.ops.mamba_forge.gemm(a, b)                   # kernels.gemm: the route's rung for this M (bias=, layout=)

Each op allocates its outputs with torch (so a CUDA-graph capture takes them from the graph's pool), derives the
grid from the signed contract and launches on torch's current stream of the tensors' device; nothing syncs with
the host. register() loads every kernel the ops may launch up front (every GEMM rung that serves, too), so no
module is loaded during a capture.
Fake (meta) implementations give torch.compile the output shapes and dtypes. The op table is
mamba_forge/runtime/torch_ops.py.

Training: gemm, softplus_forward, rms_norm, causal_conv1d and selective_scan are differentiable (autograd formulas
registered as torch.library.register_autograd does, with a shorter no-grad path (runtime/torch_dispatch.py), each
gradient a qualified backward kernel: runtime/torch_autograd.py); rms_norm_residual is rms_norm_add without the
in-place update, differentiable; the ops that update state in place (conv_tokens, scan_tokens, rms_norm_add) are
not, and the Mamba layer trains through its own op, mamba_mixer (runtime/torch_train.py). A backward kernel the
manifest lacks is a LaunchRefused at the first backward that needs it (an inference-only manifest registers and runs
forwards).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from mamba_forge.runtime.errors import LaunchRefused, SymbolUnavailable
from mamba_forge.runtime.gemm import a_as_read
from mamba_forge.runtime.tensors import torch_dtype
from mamba_forge.runtime.torch_dispatch import autograd_kernel, empty_aware, serve_directly, served_directly
from mamba_forge.runtime.torch_ops import (
    CONV1D_FAMILY,
    CONV_TOKENS_FAMILY,
    CONV_TOKENS_VEC_FAMILY,
    LIBRARY,
    OPTIONAL_SEQUENCE_FAMILIES,
    RMS_NORM_ADD_FAMILY,
    SCAN_FAMILY,
    SCAN_STEP_FAMILY,
    SCAN_STEP_STATE16_FAMILY,
    SCAN_TOKENS_FAMILY,
    SCAN_TOKENS_WS_FAMILY,
    SCHEMAS,
    SEQUENCE_DTYPES,
    STATE16_DTYPES,
    TRAIN_SCHEMAS,
    conv1d_shapes,
    conv_tokens_shapes,
    conv_tokens_vec_serves,
    gemm_shape,
    kernels_used,
    rms_norm_kernel,
    rms_norm_shapes,
    scan_shapes,
    scan_tokens_shapes,
    scan_tokens_ws_serves,
    sequence_kernel,
    serving_gemm_rungs,
    softplus_kernel,
)

_state: dict = {"kernels": None, "functions": {}, "sm_count": 0}
_lib = None
SHAPE_ENTRIES = 256  # eager calls' shape rules remembered (_shapes), least recently used out first
_shape_memo: OrderedDict = OrderedDict()
_shape_lock = threading.Lock()


def _shapes(rule, *shapes):
    """rule(*shapes) for an op's eager implementation (real tensors: torch.Size of ints), remembered per (rule,
    shapes): a torch_ops shape rule is a pure function of them, so a repeat call (a decode step) skips it; a refusal
    is never remembered (it raises again). The fake implementations (symbolic sizes) call the rules themselves."""
    key = (rule, *shapes)
    try:
        hit = _shape_memo.get(key)
    except TypeError:  # a size that does not hash
        return rule(*shapes)
    if hit is None:
        hit = rule(*shapes)
        with _shape_lock:
            _shape_memo[key] = hit
            while len(_shape_memo) > SHAPE_ENTRIES:
                _shape_memo.popitem(last=False)
        return hit
    try:
        _shape_memo.move_to_end(key)
    except KeyError:  # evicted by another thread since
        pass
    return hit


def _kernel(family: str, dtype: str):
    k = _state["functions"].get((family, dtype))
    if k is None:
        if _state["kernels"] is None:
            raise LaunchRefused("mamba_forge torch ops: call mamba_forge.runtime.torch.register(kernels) first")
        k = _state["functions"][(family, dtype)] = _state["kernels"].fn(family, dtype)
    return k


def _softplus_forward(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    _kernel(*softplus_kernel(torch_dtype(x.dtype)))(y=y, x=x)
    return y


def _softplus_forward_fake(x: torch.Tensor) -> torch.Tensor:
    softplus_kernel(torch_dtype(x.dtype))
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _rms_norm_out(x: torch.Tensor, weight: torch.Tensor, out_dtype):
    dt = x.dtype if out_dtype is None else out_dtype
    family, dtype = rms_norm_kernel(torch_dtype(x.dtype), torch_dtype(dt))
    rows, dim = rms_norm_shapes(tuple(x.shape), tuple(weight.shape))
    y = torch.empty(x.shape, dtype=dt, device=x.device)
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    return family, dtype, y, rstd


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype=None):
    family, dtype, y, rstd = _rms_norm_out(x, weight, out_dtype)
    _kernel(family, dtype)(y=y, rstd=rstd, x=x.contiguous(), w=weight.contiguous(), eps=float(eps))
    return y, rstd


def _rms_norm_fake(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype=None):
    _, _, y, rstd = _rms_norm_out(x, weight, out_dtype)
    return y, rstd


def _conv1d_out(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor):
    kernel = sequence_kernel("causal_conv1d", CONV1D_FAMILY, torch_dtype(x.dtype))
    dims = conv1d_shapes(tuple(x.shape), tuple(weight.shape), tuple(bias.shape))
    return kernel, dims, torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    kernel, (batch, _d, length, width), out = _conv1d_out(x, weight, bias)
    _kernel(*kernel)(out=out, x=x.contiguous(), weight=weight.contiguous(), bias=bias.contiguous(), batch=batch,
                     L=length, width=width)
    return out


def _causal_conv1d_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return _conv1d_out(x, weight, bias)[2]


def _scan_out(u, delta, A_log, B, C, D, z, delta_bias):
    kernel = sequence_kernel("selective_scan", SCAN_FAMILY, torch_dtype(u.dtype))
    dims = scan_shapes(*(tuple(t.shape) for t in (u, delta, A_log, B, C, D, z, delta_bias)))
    batch, d, n, _length = dims
    out = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    return kernel, dims, out, torch.empty((batch, d, n), dtype=torch.float32, device=u.device)


def _selective_scan(u, delta, A_log, B, C, D, z, delta_bias):
    kernel, (batch, _d, n, length), out, last = _scan_out(u, delta, A_log, B, C, D, z, delta_bias)
    c = {k: t.contiguous() for k, t in (("u", u), ("delta", delta), ("A_log", A_log), ("Bm", B), ("Cm", C),
                                        ("Dp", D), ("z", z), ("delta_bias", delta_bias))}
    _kernel(*kernel)(out=out, last_state=last, **c, batch=batch, d_state=n, L=length, delta_softplus=1)
    return out, last


def _selective_scan_fake(u, delta, A_log, B, C, D, z, delta_bias):
    _, _, out, last = _scan_out(u, delta, A_log, B, C, D, z, delta_bias)
    return out, last


def _gemm_out(A, B, layout: str):
    m, n = gemm_shape(layout, tuple(A.shape), tuple(B.shape))
    return torch.empty((m, n), dtype=A.dtype, device=A.device)


def _gemm(A, B, bias=None, layout: str = "nn"):
    kernels = _state["kernels"]
    if kernels is None:
        raise LaunchRefused("mamba_forge torch ops: call mamba_forge.runtime.torch.register(kernels) first")
    m, n = _shapes(gemm_shape, layout, A.shape, B.shape)
    out = A.new_empty((m, n))  # _gemm_out's tensor: A's dtype and device
    return kernels.gemm(a_as_read(kernels, A, B, bias=bias, layout=layout), B.contiguous(), out, layout=layout,
                        bias=None if bias is None else bias.contiguous())  # a row-strided A read in place: no copy


def _gemm_fake(A, B, bias=None, layout: str = "nn"):
    return _gemm_out(A, B, layout)


def _dense(t: torch.Tensor, what: str) -> torch.Tensor:
    """The tensor itself when row-major dense; a state argument that is not is refused (a copy would drop the
    update the caller expects in place)."""
    if not t.is_contiguous():
        raise LaunchRefused(f"{what} must be contiguous: it is updated in place")
    return t


def _conv_tokens_out(xz, weight, bias, conv_state):
    kernel = sequence_kernel("conv_tokens", CONV_TOKENS_FAMILY, torch_dtype(xz.dtype))
    dims = conv_tokens_shapes(*(tuple(t.shape) for t in (xz, weight, bias, conv_state)))
    batch, d, length, _ = dims
    return kernel, dims, torch.empty((batch, length, d), dtype=xz.dtype, device=xz.device)


def _conv_tokens(xz, weight, bias, conv_state):
    kernel = sequence_kernel("conv_tokens", CONV_TOKENS_FAMILY, torch_dtype(xz.dtype))  # _conv_tokens_out's steps
    batch, d, length, width = _shapes(conv_tokens_shapes, xz.shape, weight.shape, bias.shape, conv_state.shape)
    out = xz.new_empty((batch, length, d))
    if not (batch and d and length):
        return out  # nothing to convolve; the state stays as it is
    # a few timesteps on a large grid (decode at batch): the vectorised conv where the manifest has it (the same
    # bits, torch_ops.CONV_TOKENS_VEC_FAMILY)
    vec = _state["functions"].get((CONV_TOKENS_VEC_FAMILY, kernel[1]))
    serves = vec is not None and conv_tokens_vec_serves(batch, d, length, _state["sm_count"])
    fn = vec if serves else _kernel(*kernel)
    fn(out=out, conv_state=_dense(conv_state, "conv_state"), xz=xz.contiguous(), weight=weight.contiguous(),
       bias=bias.contiguous(), batch=batch, d=d, L=length, width=width)
    return out


def _conv_tokens_fake(xz, weight, bias, conv_state):
    return _conv_tokens_out(xz, weight, bias, conv_state)[2]


def _scan_tokens_out(u, dt, dt_bias, A_log, x_dbl, D, xz, state):
    kernel = sequence_kernel("scan_tokens", SCAN_TOKENS_FAMILY, torch_dtype(u.dtype))
    dims = scan_tokens_shapes(*(tuple(t.shape) for t in (u, dt, dt_bias, A_log, x_dbl, D, xz, state)))
    return kernel, dims, torch.empty(u.shape, dtype=u.dtype, device=u.device)


def _state16_step(u_dtype: str):
    """The decode step on a 16-bit state of the activations' dtype, or a refusal saying what serves instead."""
    fn = _state["functions"].get((SCAN_STEP_STATE16_FAMILY, u_dtype))
    if fn is None:
        raise LaunchRefused(f"mamba_forge::scan_tokens: a {u_dtype} state needs {SCAN_STEP_STATE16_FAMILY}_{u_dtype}, "
                            "which the registered manifest does not serve: keep the state in float32")
    return fn


def _check_state_dtype(u, state) -> bool:
    """Whether the state is 16-bit (the activations' dtype); float32 otherwise; anything else is refused."""
    if state.dtype == torch.float32:
        return False
    if state.dtype != u.dtype or torch_dtype(u.dtype) not in STATE16_DTYPES:
        raise LaunchRefused(f"mamba_forge::scan_tokens: state is {state.dtype}; it is float32 or, for 16-bit "
                            f"activations, their dtype ({u.dtype})")
    return True


def _scan_tokens(u, dt, dt_bias, A_log, x_dbl, D, xz, state):
    kernel = sequence_kernel("scan_tokens", SCAN_TOKENS_FAMILY, torch_dtype(u.dtype))  # _scan_tokens_out's steps
    batch, length, d, n, r = _shapes(scan_tokens_shapes, *(t.shape for t in (u, dt, dt_bias, A_log, x_dbl, D, xz,
                                                                              state)))
    state16 = _check_state_dtype(u, state)
    out = u.new_empty(u.shape)
    if not (batch and length and d):
        return out  # no timestep: the state stays as it is
    if length == 1:  # a decode step: the production step kernel, the same bits (torch_ops.SCAN_STEP_FAMILY)
        # z = xz[..., d:] read in place: rows 2d apart from element d of the dense xz (no copy)
        z, z_pad = (xz.reshape(-1)[d:], d) if xz.is_contiguous() else (xz.narrow(2, d, d).contiguous(), 0)
        step = _state16_step(kernel[1]) if state16 else _kernel(SCAN_STEP_FAMILY, kernel[1])
        step(
            out=out, state=_dense(state, "state"), u=u.contiguous(), dt=dt.contiguous(), dt_bias=dt_bias.contiguous(),
            A_log=A_log.contiguous(), x_dbl=x_dbl.contiguous(), Dp=D.contiguous(), z=z, batch=batch, d_inner=d,
            d_state=n, dt_rank=r, x_dbl_stride=r + 2 * n, z_pad=z_pad)
        return out
    # a small grid: the warp-specialised scan where the manifest has it (the same bits, torch_ops.SCAN_TOKENS_WS_FAMILY)
    ws = _state["functions"].get((SCAN_TOKENS_WS_FAMILY, kernel[1]))
    fn = ws if ws is not None and scan_tokens_ws_serves(batch, d, n, _state["sm_count"]) else _kernel(*kernel)
    # a 16-bit state: the token scans keep theirs in f32 (from the cache's values, written back rounded)
    h = _dense(state, "state").float() if state16 else _dense(state, "state")
    fn(out=out, state=h, u=u.contiguous(), dt=dt.contiguous(), dt_bias=dt_bias.contiguous(),
       A_log=A_log.contiguous(), x_dbl=x_dbl.contiguous(), Dp=D.contiguous(), xz=xz.contiguous(), batch=batch,
       d_inner=d, d_state=n, dt_rank=r, L=length)
    if state16:
        state.copy_(h)
    return out


def _scan_tokens_fake(u, dt, dt_bias, A_log, x_dbl, D, xz, state):
    return _scan_tokens_out(u, dt, dt_bias, A_log, x_dbl, D, xz, state)[2]


def _rms_norm_add_out(x, residual, weight):
    kernel = sequence_kernel("rms_norm_add", RMS_NORM_ADD_FAMILY, torch_dtype(x.dtype))
    rows, dim = rms_norm_shapes(tuple(x.shape), tuple(weight.shape))
    if tuple(residual.shape) != tuple(x.shape) or residual.dtype != torch.float32:
        raise LaunchRefused(f"mamba_forge::rms_norm_add: residual is {residual.dtype} {list(residual.shape)}; it "
                            f"must be float32 {list(x.shape)} (x's shape)")
    return kernel, rows, dim, torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _rms_norm_add(x, residual, weight, eps: float):
    kernel, rows, dim, y = _rms_norm_add_out(x, residual, weight)
    if not rows:
        return y  # no row: nothing to add
    rstd = torch.empty((rows,), dtype=torch.float32, device=x.device)
    _kernel(*kernel)(y=y, rstd=rstd, residual=_dense(residual, "residual"), x=x.contiguous(),
                     w=weight.contiguous(), rows=rows, dim=dim, eps=float(eps))
    return y


def _rms_norm_add_fake(x, residual, weight, eps: float):
    return _rms_norm_add_out(x, residual, weight)[3]


_IMPLS = {"conv_tokens": (_conv_tokens, _conv_tokens_fake), "scan_tokens": (_scan_tokens, _scan_tokens_fake),
          "rms_norm_add": (_rms_norm_add, _rms_norm_add_fake),
          "softplus_forward": (_softplus_forward, _softplus_forward_fake), "rms_norm": (_rms_norm, _rms_norm_fake),
          "causal_conv1d": (_causal_conv1d, _causal_conv1d_fake),
          "selective_scan": (_selective_scan, _selective_scan_fake), "gemm": (_gemm, _gemm_fake)}


def _register_fake(qualname: str, fn) -> None:
    register_fake = getattr(torch.library, "register_fake", None)  # torch >= 2.4
    if register_fake is None:
        torch.library.impl_abstract(qualname)(fn)
    else:
        register_fake(qualname)(fn)


def op_impls() -> dict:
    """Every op's (implementation, fake implementation): the forward ops above, the training ops of
    runtime/torch_autograd.py and runtime/torch_train.py."""
    from mamba_forge.runtime import torch_autograd, torch_train

    impls = {**_IMPLS, **torch_autograd.IMPLS, **torch_train.IMPLS}
    # an empty input launches nothing; gemm (kernels.gemm) and the decode path's ops (on the shapes they read anyway)
    # decide that themselves
    self_deciding = ("gemm", "conv_tokens", "scan_tokens", "rms_norm_add")
    return {name: (f if name in self_deciding else empty_aware(f, fake), fake) for name, (f, fake) in impls.items()}


def implement_for(dispatch_key: str) -> None:
    """Register every op's Python implementation for `dispatch_key` ("CUDA" at the first register(); the tests add
    "CPU", where the kernels are stood in for), whose calls the differentiable ops' Autograd kernel then makes
    directly (torch_dispatch.serve_directly)."""
    if _lib is None:
        raise LaunchRefused("mamba_forge torch ops: call mamba_forge.runtime.torch.register(kernels) first")
    key = getattr(torch._C.DispatchKey, dispatch_key)
    if key in served_directly():
        return
    for name, (impl, _) in op_impls().items():
        _lib.impl(name, impl, dispatch_key)
    serve_directly(key)


def register(kernels) -> list[str]:
    """Point the ops at a loaded Kernels (the first call defines them and their autograd formulas); loads every
    kernel the forward ops may launch now (a backward's kernels load at the first backward that needs them, so an
    inference-only manifest registers). Returns the ops' qualified names. Raises SymbolUnavailable when the
    manifest lacks a forward op's kernel."""
    global _lib
    functions = {fd: kernels.fn(*fd) for fd in kernels_used()}  # refuse before anything is changed
    for rung in serving_gemm_rungs(kernels):  # their modules load now, not inside a capture
        kernels.function(rung, follow_fallback=False)
    # optional families, absent from some manifests: the plain sequence family serves every call instead; without the
    # 16-bit-state step, scan_tokens refuses a 16-bit state (_state16_step)
    optional = [(f, d) for f in OPTIONAL_SEQUENCE_FAMILIES for d in SEQUENCE_DTYPES]
    for family, d in optional + [(SCAN_STEP_STATE16_FAMILY, d) for d in STATE16_DTYPES]:
        try:
            functions[(family, d)] = kernels.fn(family, d)
        except SymbolUnavailable:
            pass
    _state["kernels"], _state["functions"] = kernels, functions
    _state["sm_count"] = kernels.device.sm_count
    if _lib is None:
        from mamba_forge.runtime import torch_autograd, torch_train

        lib = torch.library.Library(LIBRARY, "DEF")
        impls = op_impls()
        for name, schema in {**SCHEMAS, **TRAIN_SCHEMAS}.items():
            lib.define(schema)
            _register_fake(f"{LIBRARY}::{name}", impls[name][1])
        _lib = lib
        implement_for("CUDA")
        for name, (setup, grad) in {**torch_autograd.FORMULAS, **torch_train.FORMULAS}.items():
            # register_autograd's kernel with a shorter no-grad path (runtime/torch_dispatch.py)
            op = getattr(getattr(torch.ops, LIBRARY), name).default
            lib.impl(name, autograd_kernel(op, impls[name][0], setup, grad), "Autograd", with_keyset=True)
    return [f"{LIBRARY}::{n}" for n in {**SCHEMAS, **TRAIN_SCHEMAS}]


from mamba_forge.runtime.torch_block import Block, RMSNorm  # noqa: E402  (uses the ops above)
from mamba_forge.runtime.torch_clip import clip_grad_norm_  # noqa: E402
from mamba_forge.runtime.torch_layer import InferenceParams, Mamba  # noqa: E402
from mamba_forge.runtime.torch_model import MambaConfig, MambaLMHeadModel, MixerModel  # noqa: E402
from mamba_forge.runtime.torch_optim import AdamW  # noqa: E402

__all__ = ["AdamW", "Block", "InferenceParams", "Mamba", "MambaConfig", "MambaLMHeadModel", "MixerModel", "RMSNorm",
           "clip_grad_norm_", "register"]
