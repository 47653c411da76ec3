"""float64 references for the causal depthwise conv1d family (kernels/fixed/conv1d.{cu,toml}).

Semantics (Mamba-1's conv1d, as causal-conv1d): x [batch, d, L], weight [d, width], bias [d], width 1..4,

    pre[b, c, t] = bias[c] + sum_k weight[c, k] * x[b, c, t - (width-1) + k]      (x at t < 0 is 0)
    out = silu(pre)

summed with k ascending after the bias. Padded positions enter as products with 0 (so an infinite weight
meets a padded 0 as NaN, as in the padded convolution). The backward of out = silu(pre):

    dpre = dout * silu'(pre);   dx[s] = sum_k weight[k] * dpre[s + (width-1) - k]  (dpre past L is 0)
    dweight[c, k] = sum_{b,t} dpre[b,c,t] * x[b,c,t-(width-1)+k];   dbias[c] = sum_{b,t} dpre[b,c,t]

The entry points named by the catalog take ``(args, dims)`` (see mamba_forge.references).
"""

from __future__ import annotations

import numpy as np

MAX_WIDTH = 4


def _check_width(width: int) -> int:
    width = int(width)
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"conv1d width must be in 1..{MAX_WIDTH}, got {width}")
    return width


def silu(z: np.ndarray) -> np.ndarray:
    """z * sigmoid(z) with the kernels' formula (so infinities give the same NaNs)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return z * (1.0 / (1.0 + np.exp(-z)))


def silu_grad(g: np.ndarray, z: np.ndarray) -> np.ndarray:
    """g * d silu(z)/dz = g * s * (1 + z * (1 - s)), s = sigmoid(z)."""
    with np.errstate(over="ignore", invalid="ignore"):
        s = 1.0 / (1.0 + np.exp(-z))
        return g * (s * (1.0 + z * (1.0 - s)))


def conv1d_pre(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, width: int) -> np.ndarray:
    """The pre-activation [batch, d, L] in float64 (bias first, then k ascending)."""
    width = _check_width(width)
    x = np.asarray(x, dtype=np.float64)
    batch, d, L = x.shape
    w = np.asarray(weight, dtype=np.float64).reshape(d, width)
    xp = np.concatenate([np.zeros((batch, d, width - 1)), x], axis=2)
    acc = np.broadcast_to(np.asarray(bias, dtype=np.float64).reshape(1, d, 1), x.shape).copy()
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(width):
            acc = acc + w[None, :, k, None] * xp[:, :, k : k + L]
    return acc


def conv1d_pre_kernel_walk(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, width: int) -> np.ndarray:
    """The kernels' arithmetic, emulated exactly: float32 inputs, a float64 accumulator starting at the bias,
    k ascending (float32 x float32 products are exact in float64, each sum rounds once), then one rounding to
    float32. The tiled forward, the nosave forward and the decode step must match this bit for bit."""
    width = _check_width(width)
    x = np.asarray(x, dtype=np.float32)
    batch, d, L = x.shape
    w = np.asarray(weight, dtype=np.float32).reshape(d, width).astype(np.float64)
    xp = np.concatenate([np.zeros((batch, d, width - 1)), x.astype(np.float64)], axis=2)
    acc = np.broadcast_to(np.asarray(bias, dtype=np.float32).astype(np.float64).reshape(1, d, 1), x.shape).copy()
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(width):
            acc = acc + w[None, :, k, None] * xp[:, :, k : k + L]
    return acc.astype(np.float32)


def conv1d_backward(x, weight, pre, dout, width):
    """(dx, dweight, dbias) in float64 for out = silu(pre)."""
    width = _check_width(width)
    x = np.asarray(x, dtype=np.float64)
    batch, d, L = x.shape
    w = np.asarray(weight, dtype=np.float64).reshape(d, width)
    dpre = silu_grad(np.asarray(dout, dtype=np.float64), np.asarray(pre, dtype=np.float64))
    dpp = np.concatenate([dpre, np.zeros((batch, d, width - 1))], axis=2)
    xp = np.concatenate([np.zeros((batch, d, width - 1)), x], axis=2)
    dx = np.zeros_like(x)
    dw = np.zeros((d, width))
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(width):
            dx = dx + w[None, :, k, None] * dpp[:, :, width - 1 - k : width - 1 - k + L]
            dw[:, k] = (dpre * xp[:, :, k : k + L]).sum(axis=(0, 2))
        db = dpre.sum(axis=(0, 2))
    return dx, dw, db


def conv1d_step(state, x, weight, bias, width):
    """One decode step: (out [batch, d], new state [batch, d, width-1]) in float64."""
    width = _check_width(width)
    x = np.asarray(x, dtype=np.float64)
    batch, d = x.shape
    window = np.concatenate([np.asarray(state, dtype=np.float64).reshape(batch, d, width - 1), x[:, :, None]], axis=2)
    w = np.asarray(weight, dtype=np.float64).reshape(d, width)
    acc = np.broadcast_to(np.asarray(bias, dtype=np.float64).reshape(1, d), x.shape).copy()
    with np.errstate(invalid="ignore", over="ignore"):
        for k in range(width):
            acc = acc + w[None, :, k] * window[:, :, k]
    return silu(acc), window[:, :, 1:]


# ---- catalog entry points: fn(args, dims) -> {output name: flat float64 array} ----


def _shape3(args, dims):
    return int(args["batch"]), int(args["d"]), int(args["L"])


def forward_tiled(args, dims):
    b, d, L = _shape3(args, dims)
    pre = conv1d_pre(np.asarray(args["x"]).reshape(b, d, L), args["weight"], args["bias"], args["width"])
    return {"out": silu(pre).ravel(), "pre": pre.ravel()}


def forward_nosave_tiled(args, dims):
    return {"out": forward_tiled(args, dims)["out"]}


def backward(args, dims):
    b, d, L = _shape3(args, dims)
    shape = (b, d, L)
    dx, dw, db = conv1d_backward(
        np.asarray(args["x"]).reshape(shape), args["weight"], np.asarray(args["pre"]).reshape(shape),
        np.asarray(args["dout"]).reshape(shape), args["width"],
    )
    return {"dx": dx.ravel(), "dweight": dw.ravel(), "dbias": db.ravel()}


def step_silu(args, dims):
    b, d = int(args["batch"]), int(args["d"])
    out, state = conv1d_step(args["conv_state"], np.asarray(args["x"]).reshape(b, d), args["weight"], args["bias"],
                             args["width"])
    return {"out": out.ravel(), "conv_state": state.ravel()}
