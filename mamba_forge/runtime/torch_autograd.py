"""Autograd for the torch custom ops (issue 24): every differentiable ``torch.ops.mamba_forge`` op has a formula
registered with ``torch.library.register_autograd`` (so it composes with torch.compile: the formulas call only
other custom ops, whose fake implementations give shapes, and torch views and copies), and every gradient is
computed by a qualified backward kernel of the registered manifest:

    gemm              dA, dB: the gemm op at the layouts the gradient needs (nn: dA = dC B^T is nt, dB = A^T dC
                      is tn; nt and tn likewise), through the route table; where the manifest serves no route of
                      that layout for the shape, the nn route on a transposed copy; dbias: reduce_bias
    softplus_forward  softplus_backward
    rms_norm          rmsnorm_backward (f32 out) / rmsnorm_backward_f32in (16-bit out), dweight folded over rows
                      by reduce_sum_axis0 (rstd is not differentiable)
    rms_norm_residual the functional rms_norm_add (rms_norm_add itself updates its residual in place and has no
                      formula): the same backward kernels, the residual output's gradient added by vec_add_inplace,
                      dx cast to x's dtype by the catalog's cast kernel
    causal_conv1d     conv1d_burnin_forward_tiled (replays the forward for pre) + conv1d_bwd_tiled
    selective_scan    ssm_parallel_scan_fwd (replays the forward for the states saved every 256 steps) +
                      ssm_parallel_scan_bwd_fold (W = 8; ssm_parallel_scan_bwd where d_inner % 8 != 0), partials
                      folded by ssm_reduce_d_BC_groups, ssm_reduce_d_a_log, ssm_reduce_d_D (last_state is not
                      differentiable)

conv_tokens, scan_tokens and rms_norm_add update state in place; they are differentiated through the Mamba layer's
training op (runtime/torch_train.py) and rms_norm_residual. Every reduction is one of the catalog's fixed-order
kernels (no atomics), so gradients are bit-identical run to run. A backward kernel the manifest does not serve is
a LaunchRefused naming it at the first backward that needs it, never a fallback to torch arithmetic.
"""

from __future__ import annotations

import torch

from mamba_forge.runtime import torch_ops as T
from mamba_forge.runtime.errors import LaunchRefused, SymbolUnavailable
from mamba_forge.runtime.gemm import gemm_dims
from mamba_forge.runtime.tensors import torch_dtype
from mamba_forge.runtime.torch import _kernel, _rms_norm_add_out, _state

F32 = torch.float32


def bwd_kernel(op: str, family: str, dtype: str):
    """A kernel a backward launches: the manifest's, or a LaunchRefused that says training needs it."""
    try:
        return _kernel(family, dtype)
    except SymbolUnavailable as exc:
        raise LaunchRefused(f"mamba_forge::{op} backward needs {family} {dtype or '(no dtype)'}, which the registered "
                            f"manifest does not serve ({exc}); training needs a manifest qualified with the backward "
                            "families, and nothing falls back to another implementation") from None


def cast_kernel(op: str, src: str, dst: str):
    """The catalog's cast kernel src -> dst (family cast, tile "<src>_to_<dst>")."""
    key = ("cast", f"{src}_to_{dst}")
    k = _state["functions"].get(key)
    if k is None:
        if _state["kernels"] is None:
            raise LaunchRefused("mamba_forge torch ops: call mamba_forge.runtime.torch.register(kernels) first")
        try:
            k = _state["kernels"].fn("cast", "", tile=f"{src}_to_{dst}")
        except SymbolUnavailable as exc:
            raise LaunchRefused(f"mamba_forge::{op} backward needs cast_{src}_to_{dst}, which the registered "
                                f"manifest does not serve ({exc})") from None
        _state["functions"][key] = k
    return k


def cast_to(op: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t in `dtype` through the catalog's cast kernel (round to nearest even); t itself when it already is."""
    if t.dtype == dtype:
        return t
    k = cast_kernel(op, torch_dtype(t.dtype), torch_dtype(dtype))
    t = t.contiguous()
    out = torch.empty(t.shape, dtype=dtype, device=t.device)
    k(out=out, **{"in": t}, n=t.numel())
    return out


# ---- GEMMs of gradients --------------------------------------------------------------------------------------------

def layout_served(layout: str, m: int, n: int, k: int, dtype: str) -> bool:
    """Whether the manifest's route table serves this layout at (M, N, K) (nn is the inference layout: always
    asked for, and refused by kernels.gemm when absent)."""
    if layout == "nn":
        return True
    try:
        _state["kernels"].gemm_route(m, n, k, dtype, dtype, dtype, layout)
    except (LaunchRefused, LookupError):
        return False
    return True


def _nn_form(layout: str, A, B, m: int, n: int, k: int, dtype: str):
    """(A, B, layout) to launch: the layout itself where a route serves it, else nn on transposed copies."""
    if layout_served(layout, m, n, k, dtype):
        return A, B, layout
    return (A.t(), B, "nn") if layout == "tn" else (A, B.t(), "nn")


def gemm_eager(op: str, A: torch.Tensor, B: torch.Tensor, layout: str = "nn") -> torch.Tensor:
    """kernels.gemm for a backward (inside an op's implementation); a missing route is a LaunchRefused."""
    m, n, k = gemm_dims(layout, tuple(A.shape), tuple(B.shape))
    A, B, layout = _nn_form(layout, A, B, m, n, k, torch_dtype(A.dtype))
    try:
        return _state["kernels"].gemm(A.contiguous(), B.contiguous(), layout=layout)
    except LookupError as exc:  # routes.NoRoute
        raise LaunchRefused(f"mamba_forge::{op} backward: {exc}") from None


def gemm_traced(A: torch.Tensor, B: torch.Tensor, layout: str) -> torch.Tensor:
    """The gemm op for a formula torch.compile traces (the same layout choice as gemm_eager)."""
    m, n, k = gemm_dims(layout, tuple(A.shape), tuple(B.shape))
    A, B, layout = _nn_form(layout, A, B, int(m), int(n), int(k), torch_dtype(A.dtype))
    return torch.ops.mamba_forge.gemm(A, B, None, layout)


def colsum(op: str, rows_by_cols: torch.Tensor) -> torch.Tensor:
    """f32 column sums of an f32 [rows, cols] matrix by reduce_sum_axis0 (fixed row order)."""
    rows, cols = rows_by_cols.shape
    out = torch.empty(cols, dtype=F32, device=rows_by_cols.device)
    bwd_kernel(op, *T.REDUCE["rows"])(out=out, **{"in": rows_by_cols.contiguous()}, rows=rows, cols=cols)
    return out


def reduce_bias_eager(op: str, dy2: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Column sums of dy [rows, cols] (in its dtype) in f32 by reduce_bias, cast to `dtype` when given."""
    rows, cols = dy2.shape
    db = torch.empty(cols, dtype=F32, device=dy2.device)
    bwd_kernel(op, "reduce_bias", torch_dtype(dy2.dtype))(db=db, dy=dy2.contiguous(), rows=rows, cols=cols)
    return db if dtype is None else cast_to(op, db, dtype)


# ---- the scan backward, shared by selective_scan and the Mamba layer -----------------------------------------------

def scan_partials(batch: int, d: int, w: int, n: int, length: int, device):
    """The scan backward kernels' f32 partials: dB_part, dC_part [b, d // w, n, L] (per channel group),
    dA_part [b, d, n], dD_part and dbias_part [b, d]."""
    dB_part, dC_part = (torch.empty((batch, d // w, n, length), dtype=F32, device=device) for _ in range(2))
    dA_part = torch.empty((batch, d, n), dtype=F32, device=device)
    dD_part, dbias_part = (torch.empty((batch, d), dtype=F32, device=device) for _ in range(2))
    return dB_part, dC_part, dA_part, dD_part, dbias_part


def scan_backward(op: str, kernel, w: int, dout, saved, u, delta, A_log, Bm, Cm, Dp, z, delta_bias):
    """The scan backward kernel over channel-major [b, d, L] operands (contiguous): (du, ddelta, dz, dB_part,
    dC_part, dA_part, dD_part, dbias_part), the partials per (b, d // w) group and per (b, d)."""
    batch, d, length = u.shape
    n = A_log.shape[1]
    du, ddelta, dz = (torch.empty_like(u) for _ in range(3))
    dB_part, dC_part, dA_part, dD_part, dbias_part = scan_partials(batch, d, w, n, length, u.device)
    kernel(du=du, ddelta=ddelta, dz=dz, dB_part=dB_part, dC_part=dC_part, dA_part=dA_part, dD_part=dD_part,
           dbias_part=dbias_part, dout=dout, saved=saved, u=u, delta=delta, A_log=A_log, Bm=Bm, Cm=Cm, Dp=Dp, z=z,
           delta_bias=delta_bias, batch=batch, d_inner=d, d_state=n, L=length, delta_softplus=1)
    return du, ddelta, dz, dB_part, dC_part, dA_part, dD_part, dbias_part


def reduce_batch(op: str, part: torch.Tensor) -> torch.Tensor:
    """out[d] = sum over b (ascending) of part [b, d] by ssm_reduce_d_D."""
    batch, d = part.shape
    out = torch.empty(d, dtype=F32, device=part.device)
    bwd_kernel(op, *T.REDUCE["batch"])(out=out, part=part, batch=batch, d_inner=d)
    return out


def reduce_a_log(op: str, part: torch.Tensor, A_log: torch.Tensor) -> torch.Tensor:
    """dA_log [d, n] f32 = -exp(A_log) * the batch sum of dA partials [b, d, n] (ssm_reduce_d_a_log)."""
    batch, d, n = part.shape
    out = torch.empty((d, n), dtype=F32, device=part.device)
    bwd_kernel(op, *T.REDUCE["dA_log"])(out=out, part=part, A_log=A_log, batch=batch, dn=d * n)
    return out


# ---- backward ops (implementations launch; fakes give shapes) ------------------------------------------------------

def _softplus_backward(dy, x):
    T.same_shapes("softplus_backward", {"dy": (dy.shape, x.shape)})
    x = x.contiguous()
    dx = torch.empty_like(x)
    bwd_kernel("softplus_forward", "softplus_backward", torch_dtype(x.dtype))(dx=dx, dy=dy.contiguous(), x=x,
                                                                               n=x.numel())
    return dx


def _softplus_backward_fake(dy, x):
    T.same_shapes("softplus_backward", {"dy": (dy.shape, x.shape)})
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _rms_norm_backward(dy, x, weight, rstd):
    rows, dim = T.rms_norm_shapes(tuple(x.shape), tuple(weight.shape))
    T.same_shapes("rms_norm_backward", {"dy": (dy.shape, x.shape), "rstd": (rstd.shape, x.shape[:-1])})
    kernel = bwd_kernel("rms_norm", *T.rms_norm_bwd_kernel(torch_dtype(dy.dtype)))
    dx = torch.empty(x.shape, dtype=F32, device=x.device)
    dw_rows = torch.empty((rows, dim), dtype=F32, device=x.device)
    kernel(dx=dx, dw_rows=dw_rows, dy=dy.contiguous(), x=x.contiguous(), w=weight.contiguous(), rstd=rstd.contiguous(),
           rows=rows, dim=dim)
    return dx, colsum("rms_norm", dw_rows)


def _rms_norm_backward_fake(dy, x, weight, rstd):
    T.same_shapes("rms_norm_backward", {"dy": (dy.shape, x.shape), "rstd": (rstd.shape, x.shape[:-1])})
    return torch.empty(x.shape, dtype=F32, device=x.device), torch.empty(weight.shape, dtype=F32, device=x.device)


def _rms_norm_residual(x, residual, weight, eps: float):
    kernel, rows, dim, y = _rms_norm_add_out(x, residual, weight)
    res = residual.clone(memory_format=torch.contiguous_format)
    rstd = torch.empty(x.shape[:-1], dtype=F32, device=x.device)
    _kernel(*kernel)(y=y, rstd=rstd, residual=res, x=x.contiguous(), w=weight.float().contiguous(), rows=rows,
                     dim=dim, eps=float(eps))  # the kernel's weight is f32: a 16-bit one is widened (exact)
    return y, res, rstd


def _rms_norm_residual_fake(x, residual, weight, eps: float):
    _, _, _, y = _rms_norm_add_out(x, residual, weight)
    return y, torch.empty(x.shape, dtype=F32, device=x.device), torch.empty(x.shape[:-1], dtype=F32, device=x.device)


def _rms_norm_residual_backward(dy, dresidual, residual, weight, rstd):
    op = "rms_norm_residual"
    rows, dim = T.rms_norm_shapes(tuple(residual.shape), tuple(weight.shape))
    T.same_shapes(op, {"dy": (dy.shape, residual.shape), "dresidual": (dresidual.shape, residual.shape),
                       "rstd": (rstd.shape, residual.shape[:-1])})
    kernel = bwd_kernel(op, *T.rms_norm_bwd_kernel(torch_dtype(dy.dtype)))
    add = bwd_kernel(op, *T.REDUCE["add_f32"])
    dh = torch.empty(residual.shape, dtype=F32, device=residual.device)
    dw_rows = torch.empty((rows, dim), dtype=F32, device=residual.device)
    kernel(dx=dh, dw_rows=dw_rows, dy=dy.contiguous(), x=residual.contiguous(), w=weight.float().contiguous(),
           rstd=rstd.contiguous(), rows=rows, dim=dim)
    add(a=dh, b=dresidual.contiguous(), n=dh.numel())  # the residual output's own gradient joins
    dx = dh.clone() if dy.dtype == F32 else cast_to(op, dh, dy.dtype)  # outputs never alias
    return dx, dh, cast_to(op, colsum(op, dw_rows), weight.dtype)


def _rms_norm_residual_backward_fake(dy, dresidual, residual, weight, rstd):
    T.same_shapes("rms_norm_residual", {"dy": (dy.shape, residual.shape), "dresidual": (dresidual.shape,
                                                                                         residual.shape)})
    return (torch.empty(residual.shape, dtype=dy.dtype, device=dy.device),
            torch.empty(residual.shape, dtype=F32, device=dy.device),
            torch.empty(weight.shape, dtype=weight.dtype, device=dy.device))


def _conv1d_backward(dout, x, weight, bias):
    op = "causal_conv1d"
    batch, d, length, width = T.conv1d_shapes(tuple(x.shape), tuple(weight.shape), tuple(bias.shape))
    T.same_shapes("causal_conv1d_backward", {"dout": (dout.shape, x.shape)})
    dt = torch_dtype(x.dtype)
    save, bwd = bwd_kernel(op, T.CONV_SAVE_FAMILY, dt), bwd_kernel(op, T.CONV_BWD_FAMILY, dt)
    x, weight, bias = x.contiguous(), weight.contiguous(), bias.contiguous()
    pre, replay, dx = (torch.empty_like(x) for _ in range(3))
    dims = {"batch": batch, "d": d, "L": length, "width": width}
    save(out=replay, pre=pre, x=x, weight=weight, bias=bias, **dims)
    dw = torch.empty((d, width), dtype=F32, device=x.device)
    db = torch.empty(d, dtype=F32, device=x.device)
    bwd(dx=dx, dweight=dw, dbias=db, x=x, weight=weight, pre=pre, dout=dout.contiguous(), **dims)
    return dx, dw, db


def _conv1d_backward_fake(dout, x, weight, bias):
    T.conv1d_shapes(tuple(x.shape), tuple(weight.shape), tuple(bias.shape))
    T.same_shapes("causal_conv1d_backward", {"dout": (dout.shape, x.shape)})
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device), torch.empty(weight.shape, dtype=F32, device=x.device),
            torch.empty(bias.shape, dtype=F32, device=x.device))


def _scan_backward(dout, u, delta, A_log, B, C, D, z, delta_bias):
    op = "selective_scan"
    batch, d, n, length = T.scan_shapes(*(tuple(t.shape) for t in (u, delta, A_log, B, C, D, z, delta_bias)))
    T.same_shapes("selective_scan_backward", {"dout": (dout.shape, u.shape)})
    dt = torch_dtype(u.dtype)
    family, w = T.scan_bwd_family(op, d)
    save, bwd = bwd_kernel(op, T.SCAN_SAVE_FAMILY, dt), bwd_kernel(op, family, dt)
    red_bc = bwd_kernel(op, "ssm_reduce_d_BC_groups", dt)
    c = {k: t.contiguous() for k, t in (("u", u), ("delta", delta), ("A_log", A_log), ("Bm", B), ("Cm", C),
                                        ("Dp", D), ("z", z), ("delta_bias", delta_bias))}
    nc = -(-length // T.SCAN_SAVE_CHUNK)
    saved = torch.empty((batch, d, nc, n), dtype=F32, device=u.device)
    save(out=torch.empty_like(c["u"]), last_state=torch.empty((batch, d, n), dtype=F32, device=u.device), saved=saved,
         **c, batch=batch, d_inner=d, d_state=n, L=length, delta_softplus=1)
    du, ddelta, dz, dB_part, dC_part, dA_part, dD_part, dbias_part = scan_backward(
        op, bwd, w, dout.contiguous(), saved, c["u"], c["delta"], c["A_log"], c["Bm"], c["Cm"], c["Dp"], c["z"],
        c["delta_bias"])
    dB, dC = torch.empty_like(c["Bm"]), torch.empty_like(c["Cm"])
    for out, part in ((dB, dB_part), (dC, dC_part)):
        red_bc(out=out, part=part, batch=batch, groups=d // w, d_state=n, L=length)
    return (du, ddelta, reduce_a_log(op, dA_part, c["A_log"]), dB, dC, reduce_batch(op, dD_part), dz,
            reduce_batch(op, dbias_part))


def _scan_backward_fake(dout, u, delta, A_log, B, C, D, z, delta_bias):
    T.scan_shapes(*(tuple(t.shape) for t in (u, delta, A_log, B, C, D, z, delta_bias)))
    T.same_shapes("selective_scan_backward", {"dout": (dout.shape, u.shape)})
    e = lambda t, dtype=None: torch.empty(t.shape, dtype=dtype or t.dtype, device=u.device)  # noqa: E731
    return e(u), e(delta), e(A_log, F32), e(B), e(C), e(D, F32), e(z), e(delta_bias, F32)


def _reduce_bias(dy, out_dtype=None):
    return reduce_bias_eager("gemm", dy.reshape(-1, dy.shape[-1]), out_dtype)


def _reduce_bias_fake(dy, out_dtype=None):
    return torch.empty(dy.shape[-1], dtype=out_dtype or F32, device=dy.device)


IMPLS = {"softplus_backward": (_softplus_backward, _softplus_backward_fake),
         "rms_norm_backward": (_rms_norm_backward, _rms_norm_backward_fake),
         "rms_norm_residual": (_rms_norm_residual, _rms_norm_residual_fake),
         "rms_norm_residual_backward": (_rms_norm_residual_backward, _rms_norm_residual_backward_fake),
         "causal_conv1d_backward": (_conv1d_backward, _conv1d_backward_fake),
         "selective_scan_backward": (_scan_backward, _scan_backward_fake),
         "reduce_bias": (_reduce_bias, _reduce_bias_fake)}


# ---- the formulas (traced by torch.compile: custom ops, views and copies only) --------------------------------------

def _grad(g, like):
    return torch.zeros_like(like) if g is None else g


def _gemm_setup(ctx, inputs, output):
    A, B, bias, layout = inputs
    ctx.save_for_backward(A, B)
    ctx.layout, ctx.bias_dtype = layout, None if bias is None else bias.dtype


def _gemm_grad(ctx, dC):
    A, B = ctx.saved_tensors
    need_a, need_b, need_bias = ctx.needs_input_grad[:3]
    layout = ctx.layout
    dA = dB = dbias = None
    if need_a:  # nn: dC B^T; nt: dC B; tn: B dC^T (A stored [K, M])
        dA = {"nn": lambda: gemm_traced(dC, B, "nt"), "nt": lambda: gemm_traced(dC, B, "nn"),
              "tn": lambda: gemm_traced(B, dC, "nt")}[layout]()
    if need_b:  # nn: A^T dC; nt: dC^T A (B stored [N, K]); tn: A dC
        dB = {"nn": lambda: gemm_traced(A, dC, "tn"), "nt": lambda: gemm_traced(dC, A, "tn"),
              "tn": lambda: gemm_traced(A, dC, "nn")}[layout]()
    if need_bias and ctx.bias_dtype is not None:  # the bias is C's dtype: the f32 sum rounded once
        dbias = torch.ops.mamba_forge.reduce_bias(dC, ctx.bias_dtype)
    return dA, dB, dbias, None


def _softplus_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _softplus_grad(ctx, dy):
    (x,) = ctx.saved_tensors
    return torch.ops.mamba_forge.softplus_backward(dy, x)


def _rms_norm_setup(ctx, inputs, output):
    x, weight = inputs[0], inputs[1]
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, weight, output[1])


def _rms_norm_grad(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = torch.ops.mamba_forge.rms_norm_backward(dy, x, weight, rstd)
    return dx, dw, None, None


def _residual_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output[2])
    ctx.save_for_backward(output[1], inputs[2], output[2])
    ctx.y_dtype = output[0].dtype


def _residual_grad(ctx, dy, dres, _drstd):
    res, weight, rstd = ctx.saved_tensors
    dy = torch.zeros(res.shape, dtype=ctx.y_dtype, device=res.device) if dy is None else dy
    dx, dres_in, dw = torch.ops.mamba_forge.rms_norm_residual_backward(dy, _grad(dres, res), res, weight, rstd)
    return dx, dres_in, dw, None


def _conv_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _conv_grad(ctx, dout):
    return torch.ops.mamba_forge.causal_conv1d_backward(dout, *ctx.saved_tensors)


def _scan_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(*inputs)


def _scan_grad(ctx, dout, _dlast):
    return torch.ops.mamba_forge.selective_scan_backward(dout, *ctx.saved_tensors)


FORMULAS = {"gemm": (_gemm_setup, _gemm_grad), "softplus_forward": (_softplus_setup, _softplus_grad),
            "rms_norm": (_rms_norm_setup, _rms_norm_grad), "rms_norm_residual": (_residual_setup, _residual_grad),
            "causal_conv1d": (_conv_setup, _conv_grad), "selective_scan": (_scan_setup, _scan_grad)}

__all__ = ["FORMULAS", "IMPLS", "bwd_kernel", "cast_kernel", "cast_to", "colsum", "gemm_eager", "gemm_traced", "layout_served",
           "reduce_a_log", "reduce_batch", "reduce_bias_eager", "scan_backward", "scan_partials"]
