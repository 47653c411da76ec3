"""float64 references for the token-major sequence kernels (kernels/fixed/tokens.{cu,toml}): the Mamba-1 layer's
scan and conv over [batch, L, channels] rows, from a given state, returning the final state.

    ssm_scan_tokens:    u, dt, out [b, L, d]; xz [b, L, 2d] (z = xz[..., d:]); x_dbl [b, L, r + 2n]
                        (B = x_dbl[..., r:r+n], C = x_dbl[..., r+n:]); state [b, d, n] in and out
    ssm_scan_tokens_save: the same, and saved [b, d, ceil(L/256), n]: the state before timestep 256c
    conv1d_tokens_silu: xz [b, L, 2d] (x = xz[..., :d]); conv_state [b, d, w-1] (oldest first) in and out

Both are the channel-major references (scan.scan_forward, conv1d.conv1d_step) applied to the transposed views, so
one semantics is written once. The entry points named by the catalog take ``(args, dims)``.
"""

from __future__ import annotations

import numpy as np

from mamba_forge.references.conv1d import conv1d_step
from mamba_forge.references.scan import saved_states, scan_forward


def scan_tokens(state, u, dt, dt_bias, A_log, x_dbl, D, xz, dt_rank: int, with_states: bool = False):
    """(out [b, L, d], final state [b, d, n]) in float64; with_states: (out, states [b, d, n, L] after each step,
    final state)."""
    u = np.asarray(u, dtype=np.float64)
    b, L, d = u.shape
    n = np.asarray(A_log).shape[1]
    x_dbl = np.asarray(x_dbl, dtype=np.float64)
    z = np.asarray(xz, dtype=np.float64)[:, :, d:]
    cm = lambda a: np.ascontiguousarray(np.transpose(a, (0, 2, 1)))  # noqa: E731  [b, L, c] -> [b, c, L]
    out, states, last = scan_forward(
        cm(u), cm(np.asarray(dt, dtype=np.float64)), np.asarray(A_log, dtype=np.float64),
        cm(x_dbl[:, :, dt_rank:dt_rank + n]), cm(x_dbl[:, :, dt_rank + n:dt_rank + 2 * n]),
        D=np.asarray(D, dtype=np.float64), z=cm(z), delta_bias=np.asarray(dt_bias, dtype=np.float64), softplus=True,
        h0=np.asarray(state, dtype=np.float64).reshape(b, d, n),
    )
    if with_states:
        return np.transpose(out, (0, 2, 1)), states, last
    return np.transpose(out, (0, 2, 1)), last


def conv_tokens(conv_state, xz, weight, bias, width: int):
    """(out [b, L, d], final conv_state [b, d, width-1]) in float64: the decode step walked over L."""
    xz = np.asarray(xz, dtype=np.float64)
    b, L, two_d = xz.shape
    d = two_d // 2
    state = np.asarray(conv_state, dtype=np.float64).reshape(b, d, width - 1)
    out = np.empty((b, L, d))
    for t in range(L):
        out[:, t, :], state = conv1d_step(state, xz[:, t, :d], weight, bias, width)
    return out, state


def ssm_scan_tokens(args, dims):
    b, d, n, r, L = dims["batch"], dims["d_inner"], dims["d_state"], dims["dt_rank"], dims["L"]
    a = lambda k, *shape: np.asarray(args[k], dtype=np.float64).reshape(shape)  # noqa: E731
    out, last = scan_tokens(a("state", b, d, n), a("u", b, L, d), a("dt", b, L, d), a("dt_bias", d), a("A_log", d, n),
                            a("x_dbl", b, L, r + 2 * n), a("Dp", d), a("xz", b, L, 2 * d), r)
    return {"out": out.ravel(), "state": last.ravel()}


def ssm_scan_tokens_save(args, dims):
    b, d, n, r, L = dims["batch"], dims["d_inner"], dims["d_state"], dims["dt_rank"], dims["L"]
    a = lambda k, *shape: np.asarray(args[k], dtype=np.float64).reshape(shape)  # noqa: E731
    h0 = a("state", b, d, n)
    out, states, last = scan_tokens(h0, a("u", b, L, d), a("dt", b, L, d), a("dt_bias", d), a("A_log", d, n),
                                    a("x_dbl", b, L, r + 2 * n), a("Dp", d), a("xz", b, L, 2 * d), r, with_states=True)
    return {"out": out.ravel(), "state": last.ravel(), "saved": saved_states(states, h0).ravel()}


def conv1d_tokens_silu(args, dims):
    b, d, L, w = int(args["batch"]), int(args["d"]), int(args["L"]), int(args["width"])
    out, state = conv_tokens(args["conv_state"], np.asarray(args["xz"]).reshape(b, L, 2 * d), args["weight"],
                             args["bias"], w)
    return {"out": out.ravel(), "conv_state": state.ravel()}
