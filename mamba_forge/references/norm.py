"""float64 references for kernels/fixed/norm.toml (API: mamba_forge.references).

RMSNorm in the Mamba-1 convention: rstd = 1/sqrt(mean(x^2) + eps), y = x * rstd * w, x row-major [rows, dim].
"""

from __future__ import annotations

import numpy as np


def _rows(a, rows: int, dim: int) -> np.ndarray:
    return np.asarray(a, dtype=np.float64).reshape(rows, dim)


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(y, rstd) for x [rows, dim], w [dim]."""
    rstd = 1.0 / np.sqrt(np.mean(x * x, axis=1) + eps)
    return x * rstd[:, None] * w[None, :], rstd


def rmsnorm_forward(args, dims):
    rows, dim = int(args["rows"]), int(args["dim"])
    y, rstd = rmsnorm(_rows(args["x"], rows, dim), np.asarray(args["w"], dtype=np.float64), float(args["eps"]))
    return {"y": y.ravel(), "rstd": rstd}


def rmsnorm_forward_resadd(args, dims):
    rows, dim = int(args["rows"]), int(args["dim"])
    h = _rows(args["residual"], rows, dim) + _rows(args["x"], rows, dim)
    y, rstd = rmsnorm(h, np.asarray(args["w"], dtype=np.float64), float(args["eps"]))
    return {"y": y.ravel(), "rstd": rstd, "residual": h.ravel()}


def rmsnorm_backward(args, dims):
    """With the given (saved) rstd r: s = sum_j dy*w*x; dx = r*w*dy - x*r^3*s/dim; dw_rows = dy*x*r per row."""
    rows, dim = int(args["rows"]), int(args["dim"])
    x, dy = _rows(args["x"], rows, dim), _rows(args["dy"], rows, dim)
    w = np.asarray(args["w"], dtype=np.float64)[None, :]
    r = np.asarray(args["rstd"], dtype=np.float64)[:, None]
    s = np.sum(dy * w * x, axis=1, keepdims=True)
    # grouped as the kernel groups them, so Inf/NaN inputs propagate to the same places
    dx = r * (w * dy) - x * ((r * r * r) * (s / dim))
    return {"dx": dx.ravel(), "dw_rows": ((dy * x) * r).ravel()}
