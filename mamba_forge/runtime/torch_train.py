"""The Mamba layer's training path (issue 24): ``mamba_forge::mamba_mixer``, the layer's forward from its
parameters, and ``mamba_forge::mamba_mixer_backward``, registered as its autograd formula.

Forward: the inference forward's kernels in the same order on the same operands (runtime/torch_layer.py
``Mamba._run``): in_proj, conv1d_tokens_silu from a zero conv state, x_proj, dt_proj, ssm_scan_tokens, out_proj,
so its output has the inference forward's bits. The scan is ssm_scan_tokens_save, ssm_scan_tokens' body that also
writes saved[b, d_inner, c, d_state] (the state before timestep 256c), the layout the scan backward kernels replay
from, in one launch over the whole sequence (it ran as 256-step chunks before, each chunk's inputs and output
copied: 48 strided copies per call at L 2048). Saved for the backward: the input, xz, x, x_dbl, dt, y and the saved
states.

Backward, every computation a qualified kernel. The scan backward reads the forward's token-major tensors where
they are (ssm_parallel_scan_bwd_fold_tokens: z, B and C as column slices, dz written into dxz's second half); where
it does not serve (d_state > 16, d_inner % 8 != 0) the channel-major families run on [b, d, L] operands made by
transpose_rows, which also makes the conv backward's (column slices read and dxz's halves written in place; torch's
strided copies of these took 2.7 of the 7.6 ms of a d_model 1024 (b8, L2048) training step):

    out_proj   dy = dout W_out (nn, batch-invariant rows); dW_out = dout^T y (tn); d out_b: reduce_bias
    scan       ssm_parallel_scan_bwd_fold_tokens (else ssm_parallel_scan_bwd_fold, W = 8, or ssm_parallel_scan_bwd,
               W = 4) from the saved states: du, ddelta (w.r.t. raw dt), dz; dB, dC by ssm_reduce_d_BC_groups_tmajor straight into
               x_dbl's [b*L, d_state] column layout; dA_log by ssm_reduce_d_a_log; dD, d dt_bias by ssm_reduce_d_D
    dt_proj    d x_dbl[:, :dt_rank] = ddt W_dt (nn); dW_dt = (x_dbl[:, :dt_rank]^T ddt)^T (tn, transpose_rows)
    x_proj     dx = d x_dbl W_x (nn), + du by residual_add; dW_x = d x_dbl^T x (tn)
    conv       conv1d_burnin_forward_tiled replays pre, conv1d_bwd_tiled gives dx, dweight, dbias
    in_proj    dxz = [dx_conv | dz] (transposed into its halves); dh = dxz W_in (nn); dW_in = dxz^T h (tn);
               d in_b: reduce_bias

The tn products run the route table's tn class where the manifest serves one for the shape, else the nn route on a
transposed copy (torch_autograd.gemm_eager). Weight gradients are folded by the catalog's fixed-order reductions
(no atomics), so they are bit-identical run to run; every input-gradient row comes from per-row kernels and
batch-invariant nn GEMM rows, so sequence i's input gradient does not depend on the batch. Gradients are returned
in their parameters' dtypes (f32 sums narrowed by the catalog's cast kernel).
"""

from __future__ import annotations

import torch

from mamba_forge.runtime import torch_ops as T
from mamba_forge.runtime.errors import LaunchRefused
from mamba_forge.runtime.gemm import a_as_read
from mamba_forge.runtime.tensors import torch_dtype
from mamba_forge.runtime.torch import _conv_tokens, _state
from mamba_forge.runtime.torch_autograd import (
    bwd_kernel,
    cast_to,
    gemm_eager,
    reduce_a_log,
    reduce_batch,
    reduce_bias_eager,
    scan_backward,
    scan_partials,
)

F32 = torch.float32
OP = "mamba_mixer"


def _kernels():
    k = _state["kernels"]
    if k is None:
        raise LaunchRefused("mamba_forge torch ops: call mamba_forge.runtime.torch.register(kernels) first")
    return k


def _dims(hidden, in_w, conv_w, x_w, dt_w, dt_b, A_log, D, out_w):
    return T.mixer_shapes(*(tuple(t.shape) for t in (hidden, in_w, conv_w, x_w, dt_w, dt_b, A_log, D, out_w)))


def _f32(v: torch.Tensor) -> torch.Tensor:
    return v.float().contiguous()  # widening is exact: the inference path's derived vectors (Mamba._weights)


def _t(w: torch.Tensor) -> torch.Tensor:
    """Linear's [N, K] -> [K, N], as Mamba._weights makes it, by transpose_rows: the same elements, moved at about
    4x the rate of torch's strided copy of 16-bit elements (the forward's four weight transposes were most of the
    step's 0.29 ms of torch copies at d_model 2560)."""
    n, k = w.shape
    return _transposer(bwd_kernel(OP, "transpose_rows", torch_dtype(w.dtype)))(w.contiguous(), 1, n, k).view(k, n)


def scan_saving(x, dt, dt_b, A_log, x_dbl, D, xz, n: int):
    """y [b, L, d] and saved [b, d, chunks, n] (f32): the state before every 256th timestep, from a zero state, in
    one ssm_scan_tokens_save launch over the whole sequence (ssm_scan_tokens' body, so the inference forward's bits)
    reading the forward's tensors where they are. x, dt [b, L, d], x_dbl [b, L, r + 2n], xz [b, L, 2d]."""
    batch, length, d = x.shape
    act = torch_dtype(x.dtype)
    kernel = bwd_kernel(OP, T.SCAN_TOKENS_SAVE_FAMILY, act)
    nc = -(-length // T.SCAN_SAVE_CHUNK)
    state = torch.zeros((batch, d, n), dtype=F32, device=x.device)
    saved = torch.empty((batch, d, nc, n), dtype=F32, device=x.device)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    kernel(out=y, state=state, saved=saved, u=x.contiguous(), dt=dt.contiguous(), dt_bias=dt_b, A_log=A_log,
           x_dbl=x_dbl.contiguous(), Dp=D, xz=xz.contiguous(), batch=batch, d_inner=d, d_state=n,
           dt_rank=x_dbl.shape[-1] - 2 * n, L=length)
    return y, saved


def _mixer(hidden, in_w, in_b, conv_w, conv_b, x_w, dt_w, dt_b, A_log, D, out_w, out_b):
    batch, length, dm, d, width, r, n = _dims(hidden, in_w, conv_w, x_w, dt_w, dt_b, A_log, D, out_w)
    kernels, tokens = _kernels(), batch * length
    xz = kernels.gemm(hidden.reshape(tokens, dm).contiguous(), _t(in_w), bias=in_b).view(batch, length, 2 * d)
    conv_bf = _f32(conv_b) if conv_b is not None else torch.zeros(d, dtype=F32, device=hidden.device)
    conv_state = torch.zeros((batch, d, width - 1), dtype=hidden.dtype, device=hidden.device)
    x = _conv_tokens(xz, _f32(conv_w.reshape(d, width)), conv_bf, conv_state)
    x_dbl = kernels.gemm(x.view(tokens, d), _t(x_w))
    dt_wt = _t(dt_w)  # the inference path's operands (Mamba._gemm): the column slice in place where read so
    dt = kernels.gemm(a_as_read(kernels, x_dbl[:, :r], dt_wt), dt_wt)
    y, saved = scan_saving(x, dt.view(batch, length, d), _f32(dt_b), _f32(A_log), x_dbl.view(batch, length, -1),
                           _f32(D), xz, n)
    out = kernels.gemm(y.view(tokens, d), _t(out_w), bias=out_b)
    return out.view(batch, length, dm), xz, x, x_dbl, dt, y, saved


def _mixer_fake(hidden, in_w, in_b, conv_w, conv_b, x_w, dt_w, dt_b, A_log, D, out_w, out_b):
    batch, length, dm, d, width, r, n = _dims(hidden, in_w, conv_w, x_w, dt_w, dt_b, A_log, D, out_w)
    e = lambda *s, dtype=hidden.dtype: torch.empty(s, dtype=dtype, device=hidden.device)  # noqa: E731
    tokens, nc = batch * length, -(-length // T.SCAN_SAVE_CHUNK)
    return (e(batch, length, dm), e(batch, length, 2 * d), e(batch, length, d), e(tokens, r + 2 * n), e(tokens, d),
            e(batch, length, d), e(batch, d, nc, n, dtype=F32))


def backward_kernels(dtype: str, d_inner: int, d_state: int) -> dict:
    """The mixer backward's kernels, every one resolved before anything launches (LaunchRefused names a missing
    one): (family, dtype) -> kernel."""
    return {fd: bwd_kernel(OP, *fd) for fd in T.mixer_backward_kernels(dtype, d_inner, d_state)}


def _transposer(kernel):
    """t(src, batch, rows, cols, in_pad=0, out=None, out_pad=0): src's [batch, rows, cols] (rows cols + in_pad apart)
    into [batch, cols, rows] (rows + out_pad apart) by `kernel` (transpose_rows), a flat view of `out` if given, else
    a new dense tensor. src and out may start inside a row (a column slice, a half of wider rows): flat views there."""

    def t(src, batch, rows, cols, in_pad=0, out=None, out_pad=0):
        if out is None:
            out = torch.empty((batch, cols, rows), dtype=src.dtype, device=src.device)
        kernel(out=out.reshape(-1) if out.is_contiguous() else out, src=src.reshape(-1), batch=batch, rows=rows,
               cols=cols, in_pad=in_pad, out_pad=out_pad)
        return out

    return t


def _mixer_backward(dout, hidden, in_w, conv_w, conv_b, x_w, dt_w, dt_b, A_log, D, out_w, xz, x, x_dbl, dt, y,
                    saved, in_bias: bool, out_bias: bool):
    batch, length, dm, d, width, r, n = _dims(hidden, in_w, conv_w, x_w, dt_w, dt_b, A_log, D, out_w)
    T.same_shapes("mamba_mixer_backward", {"dout": (dout.shape, hidden.shape)})
    act = torch_dtype(hidden.dtype)
    k = backward_kernels(act, d, n)
    family, w, token_major = T.mixer_scan_bwd_family(d, n)
    tokens, dev = batch * length, hidden.device
    tr = _transposer(k[("transpose_rows", act)])
    cm = lambda t, c, skip=0, pad=0: tr(t.reshape(-1)[skip:], batch, length, c, pad)  # noqa: E731  [b, L, c] -> [b, c, L]
    tm = lambda t, c: tr(t, batch, c, length).view(tokens, c)  # noqa: E731  [b, c, L] -> [b*L, c]
    g = dout.reshape(tokens, dm).contiguous()
    # out_proj
    dy = gemm_eager(OP, g, out_w)
    d_out_w = gemm_eager(OP, g, y.reshape(tokens, d), "tn")
    d_out_b = reduce_bias_eager(OP, g, out_w.dtype) if out_bias else g.new_empty(0)
    # scan (from the saved states); B, C and z read where they are (columns of x_dbl, the second half of xz)
    A32, dt_b32 = _f32(A_log), _f32(dt_b)
    xw = r + 2 * n
    dxz = torch.empty((tokens, 2 * d), dtype=hidden.dtype, device=dev)  # [dx_conv | dz]
    if token_major:  # du, ddelta [b*L, d]; dz straight into dxz's second half
        du, ddelta = (torch.empty((tokens, d), dtype=hidden.dtype, device=dev) for _ in range(2))
        dB_part, dC_part, dA_part, dD_part, dbias_part = scan_partials(batch, d, w, n, length, dev)
        flat = lambda t, skip=0: t.reshape(-1)[skip:]  # noqa: E731  a column slice: a flat view from its first element
        k[(family, act)](du=du, ddelta=ddelta, dz=flat(dxz, d), dB_part=dB_part, dC_part=dC_part, dA_part=dA_part,
                         dD_part=dD_part, dbias_part=dbias_part, dout=dy, saved=saved, u=x.reshape(tokens, d),
                         delta=dt.reshape(tokens, d), A_log=A32, Bm=flat(x_dbl, r), Cm=flat(x_dbl, r + n),
                         Dp=_f32(D), z=flat(xz, d), delta_bias=dt_b32, batch=batch, d_inner=d, d_state=n, L=length,
                         z_pad=d, bc_pad=xw - n, delta_softplus=1)
        ddt, du_rows = ddelta, du
    else:
        du, ddelta, dz, dB_part, dC_part, dA_part, dD_part, dbias_part = scan_backward(
            OP, k[(family, act)], w, cm(dy, d), saved, cm(x, d), cm(dt, d), A32, cm(x_dbl, n, r, xw - n),
            cm(x_dbl, n, r + n, xw - n), _f32(D), cm(xz, d, d, d), dt_b32)
        ddt, du_rows = tm(ddelta, d), tm(du, d)
        tr(dz, batch, d, length, out=dxz.view(-1)[d:], out_pad=d)
    dx_dbl = torch.empty((tokens, xw), dtype=hidden.dtype, device=dev)
    for col, part in ((r, dB_part), (r + n, dC_part)):  # [b, L, n] sums over the channel groups
        got = torch.empty((batch, length, n), dtype=hidden.dtype, device=dev)
        k[("ssm_reduce_d_BC_groups_tmajor", act)](out=got, part=part, batch=batch, groups=d // w, d_state=n, L=length)
        dx_dbl[:, col:col + n] = got.view(tokens, n)
    # dt_proj (its bias entered the scan: its gradient is the scan's)
    dx_dbl[:, :r] = gemm_eager(OP, ddt, dt_w)
    # dW_dt = ddt^T x_dbl[:, :dt_rank] [d, r], taken as its transpose x_dbl[:, :r]^T ddt [r, d]: M = dt_rank rows run
    # on the tn route's 64-row tiles (32 CTAs over the tokens at d_inner 2048, where [d, r] gave 16 tiles 3/4 empty)
    d_dt_w = tr(gemm_eager(OP, x_dbl[:, :r].contiguous(), ddt, "tn"), 1, r, d).view(d, r)
    # x_proj, then the scan's du joins x's gradient
    dx = gemm_eager(OP, dx_dbl, x_w)
    d_x_w = gemm_eager(OP, dx_dbl, x.reshape(tokens, d), "tn")
    k[("residual_add", act)](residual=dx, x=du_rows, n=tokens * d)
    # conv: pre replayed, then its backward
    x_in = cm(xz, d, 0, d)
    conv_wf = _f32(conv_w.reshape(d, width))
    conv_bf = _f32(conv_b) if conv_b is not None else torch.zeros(d, dtype=F32, device=dev)
    pre, replay, dxc = (torch.empty_like(x_in) for _ in range(3))
    dims = {"batch": batch, "d": d, "L": length, "width": width}
    k[(T.CONV_SAVE_FAMILY, act)](out=replay, pre=pre, x=x_in, weight=conv_wf, bias=conv_bf, **dims)
    dcw = torch.empty((d, width), dtype=F32, device=dev)
    dcb = torch.empty(d, dtype=F32, device=dev)
    k[(T.CONV_BWD_FAMILY, act)](dx=dxc, dweight=dcw, dbias=dcb, x=x_in, weight=conv_wf, pre=pre, dout=cm(dx, d),
                                **dims)
    # in_proj: dxz = [dx_conv | dz], each half written in place (dz by the scan backward or above)
    tr(dxc, batch, d, length, out=dxz.view(-1), out_pad=d)
    dh = gemm_eager(OP, dxz, in_w).view(batch, length, dm)
    d_in_w = gemm_eager(OP, dxz, hidden.reshape(tokens, dm), "tn")
    d_in_b = reduce_bias_eager(OP, dxz, in_w.dtype) if in_bias else g.new_empty(0)
    d_conv_b = cast_to(OP, dcb, conv_b.dtype) if conv_b is not None else g.new_empty(0)
    return (dh, d_in_w, d_in_b, cast_to(OP, dcw, conv_w.dtype).view(conv_w.shape), d_conv_b, d_x_w, d_dt_w,
            cast_to(OP, reduce_batch(OP, dbias_part), dt_b.dtype),
            cast_to(OP, reduce_a_log(OP, dA_part, A32), A_log.dtype), cast_to(OP, reduce_batch(OP, dD_part), D.dtype),
            d_out_w, d_out_b)


def _mixer_backward_fake(dout, hidden, in_w, conv_w, conv_b, x_w, dt_w, dt_b, A_log, D, out_w, xz, x, x_dbl, dt, y,
                         saved, in_bias: bool, out_bias: bool):
    _dims(hidden, in_w, conv_w, x_w, dt_w, dt_b, A_log, D, out_w)
    T.same_shapes("mamba_mixer_backward", {"dout": (dout.shape, hidden.shape)})
    e = lambda t: torch.empty(t.shape, dtype=t.dtype, device=hidden.device)  # noqa: E731
    none = hidden.new_empty(0)
    bias = lambda present, w: torch.empty(w.shape[0], dtype=w.dtype, device=hidden.device) if present else none  # noqa: E731
    return (e(hidden), e(in_w), bias(in_bias, in_w), e(conv_w), none if conv_b is None else e(conv_b), e(x_w),
            e(dt_w), e(dt_b), e(A_log), e(D), e(out_w), bias(out_bias, out_w))


IMPLS = {"mamba_mixer": (_mixer, _mixer_fake), "mamba_mixer_backward": (_mixer_backward, _mixer_backward_fake)}


def _setup(ctx, inputs, output):
    hidden, in_w, in_b, conv_w, conv_b, x_w, dt_w, dt_b, A_log, D, out_w, out_b = inputs
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)  # else autograd fills a zero gradient for each saved output (xz, x, ...: 6 fills)
    ctx.save_for_backward(hidden, in_w, conv_w, conv_b, x_w, dt_w, dt_b, A_log, D, out_w, *output[1:])
    ctx.biases = (in_b is not None, conv_b is not None, out_b is not None)


def _grad(ctx, dout, *_unused):
    in_bias, conv_bias, out_bias = ctx.biases
    if dout is None:  # grads are not materialised (_setup): the output took no part in the loss
        return (None,) * 12
    g = torch.ops.mamba_forge.mamba_mixer_backward(dout, *ctx.saved_tensors, in_bias, out_bias)
    return (g[0], g[1], g[2] if in_bias else None, g[3], g[4] if conv_bias else None, g[5], g[6], g[7], g[8], g[9],
            g[10], g[11] if out_bias else None)


FORMULAS = {"mamba_mixer": (_setup, _grad)}

__all__ = ["FORMULAS", "IMPLS", "backward_kernels", "scan_saving"]
