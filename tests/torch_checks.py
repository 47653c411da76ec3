"""Checks shared by the torch layer tests on the CPU (tests/test_torch_autograd.py, stand-in kernels) and on the GPU
(tests/gpu/test_training_gpu.py, the qualified kernels). torch is imported by the caller's module first."""

from __future__ import annotations


def descent_ratio(model, h, target) -> float:
    """The loss drop of one step -eps * grad of `model`'s MSE loss against `target` at input `h`, over its first-order
    prediction eps * |grad|^2 (eps = 1e-3 * loss / |grad|^2): near 1 when the gradient is the forward's own."""
    import torch

    loss0 = torch.nn.functional.mse_loss(model(h), target)
    loss0.backward()
    gn2 = sum(float(p.grad.double().pow(2).sum()) for p in model.parameters())
    eps = 1e-3 * float(loss0.detach()) / gn2
    with torch.no_grad():
        for p in model.parameters():
            p -= eps * p.grad
        loss1 = torch.nn.functional.mse_loss(model(h), target)
    return (float(loss0.detach()) - float(loss1)) / (eps * gn2)
