"""float64 references for kernels/fixed/elementwise.toml (API: mamba_forge.references)."""

from __future__ import annotations

import numpy as np

LOG2E = 1.4426950408889634


def _f(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def sigmoid(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-_f(z)))


def silu(z: np.ndarray) -> np.ndarray:
    return _f(z) * sigmoid(z)


# ---- flat maps ----
def gate_mul_silu(args, dims):
    return {"out": _f(args["y"]) * silu(args["z"])}


def gating_backward(args, dims):
    g, y, z = _f(args["dout"]), _f(args["y"]), _f(args["z"])
    s = sigmoid(z)
    # grouped as the kernel groups them, so Inf/NaN inputs propagate to the same places
    return {"dy": g * (z * s), "dz": (g * y) * (s * (1.0 + z * (1.0 - s)))}


def elementwise_mul(args, dims):
    return {"c": _f(args["a"]) * _f(args["b"])}


def residual_add(args, dims):
    return {"residual": _f(args["residual"]) + _f(args["x"])}


def vec_add_inplace(args, dims):
    return {"a": _f(args["a"]) + _f(args["b"])}


def cast(args, dims):
    return {"out": _f(args["in"]).copy()}


def vec_cast_zplus(args, dims):
    return {"out": _f(args["x"]) + _f(args["z"])}


def exp_negate(args, dims):
    with np.errstate(over="ignore"):
        return {"A": -np.exp(_f(args["A_log"]))}


def exp_negate2(args, dims):
    with np.errstate(over="ignore"):
        a = -np.exp(_f(args["A_log"]))
    return {"A": a, "A_log2e": a * LOG2E}


def bias_broadcast(args, dims):
    rows, cols = int(args["rows"]), int(args["cols"])
    return {"y": (_f(args["y"]).reshape(rows, cols) + _f(args["bias"])[None, :]).ravel()}


# ---- column sums (the kernels' fixed order is an f32 detail; the reference is the exact sum) ----
def _colsum(a, rows: int, cols: int) -> np.ndarray:
    return _f(a).reshape(rows, cols).sum(axis=0)


def reduce_sum_axis0(args, dims):
    return {"out": _colsum(args["in"], int(args["rows"]), int(args["cols"]))}


def colsum_accumulate(args, dims):
    return {"out": _f(args["out"]) + _colsum(args["in"], int(args["rows"]), int(args["cols"]))}


def reduce_bias(args, dims):
    return {"db": _colsum(args["dy"], int(args["rows"]), int(args["cols"]))}


# ---- gathers, scatters, packing (exact copies) ----
def gather_cols(args, dims):
    rows, ncols, ld, col0 = (int(args[k]) for k in ("rows", "ncols", "ld", "col0"))
    return {"out": _f(args["in"]).reshape(rows, ld)[:, col0 : col0 + ncols].ravel()}


def scatter_add_cols(args, dims):
    rows, ncols, ld, col0 = (int(args[k]) for k in ("rows", "ncols", "ld", "col0"))
    dst = _f(args["dst"]).reshape(rows, ld).copy()
    dst[:, col0 : col0 + ncols] += _f(args["src"]).reshape(rows, ncols)
    return {"dst": dst.ravel()}


def _bc(args) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    batch, seqlen, dt_rank, d_state = (int(args[k]) for k in ("batch", "seqlen", "dt_rank", "d_state"))
    x = _f(args["x_dbl"]).reshape(batch, seqlen, dt_rank + 2 * d_state)
    return x[:, :, dt_rank : dt_rank + d_state], x[:, :, dt_rank + d_state :], batch, seqlen, d_state


def gather_bc_cols(args, dims):
    b, c, *_ = _bc(args)
    return {"B": b.ravel(), "C": c.ravel()}


def gather_bc_cols_tmajor(args, dims):
    b, c, *_ = _bc(args)
    return {"B": b.transpose(0, 2, 1).ravel(), "C": c.transpose(0, 2, 1).ravel()}


def transpose_rows(args, dims):
    """out[b, c, r] = src[b, r, c]; out's padding keeps the values it came with (out is inout). src and out may
    hold more than the elements the launch touches (flat views to the end of a wider tensor): only those are read
    and returned."""
    b, rows, cols = int(args["batch"]), int(args["rows"]), int(args["cols"])
    ld_in, ld_out = int(args["ld_in"]), int(args["ld_out"])
    n_in, n_out = (b * rows - 1) * ld_in + cols, (b * cols - 1) * ld_out + rows
    src = np.concatenate([_f(args["src"])[:n_in], np.full(ld_in - cols, np.nan)]).reshape(b, rows, ld_in)[:, :, :cols]
    out = np.concatenate([_f(args["out"])[:n_out], np.full(ld_out - rows, np.nan)])
    out.reshape(b, cols, ld_out)[:, :, :rows] = src.transpose(0, 2, 1)
    return {"out": out[:n_out]}


def gather_last_timestep(args, dims):
    batch, seqlen, dim = (int(args[k]) for k in ("batch", "seqlen", "dim"))
    return {"out": _f(args["in"]).reshape(batch, seqlen, dim)[:, -1, :].ravel()}


def concat_halves(args, dims):
    rows, dim = int(args["rows"]), int(args["dim"])
    a, b = _f(args["a"]).reshape(rows, dim), _f(args["b"]).reshape(rows, dim)
    return {"out": np.concatenate([a, b], axis=1).ravel()}


def pack_xdbl_cols(args, dims):
    rows, dt_rank, d_state = int(args["rows"]), int(args["dt_rank"]), int(args["d_state"])
    parts = [_f(args["dt"]).reshape(rows, dt_rank), _f(args["B"]).reshape(rows, d_state), _f(args["C"]).reshape(rows, d_state)]
    return {"x_dbl": np.concatenate(parts, axis=1).ravel()}
