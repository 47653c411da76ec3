"""float64 references for kernels/fixed/activation.toml (API: mamba_forge.references)."""

from __future__ import annotations

import numpy as np

SOFTPLUS_THRESHOLD = 20.0  # torch.nn.functional.softplus: identity above beta * x > 20


def softplus(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return np.where(x > SOFTPLUS_THRESHOLD, x, np.log1p(np.exp(np.minimum(x, SOFTPLUS_THRESHOLD))))


def softplus_grad(x: np.ndarray) -> np.ndarray:
    """d softplus / dx with the same threshold: 1 above it, sigmoid(x) below."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        sig = 1.0 / (1.0 + np.exp(-x))
    return np.where(x > SOFTPLUS_THRESHOLD, 1.0, sig)


def softplus_forward(args, dims):
    return {"y": softplus(args["x"])}


def softplus_backward(args, dims):
    return {"dx": np.asarray(args["dy"], dtype=np.float64) * softplus_grad(args["x"])}


def softplus_copy(args, dims):
    x = np.asarray(args["x"], dtype=np.float64)
    return {"y": softplus(x), "x_saved": x.copy()}
