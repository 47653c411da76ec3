"""The torch custom-op table (mamba_forge/runtime/torch.py registers it): each op's schema, which family and dtype
serve a given input, and the output shapes, in plain Python so it is checked without torch. dtypes are the
catalog's tokens (f32, bf16, f16). Standard library only.
"""

from __future__ import annotations

from mamba_forge.runtime.errors import LaunchRefused

LIBRARY = "mamba_forge"

# op name -> torch.library schema; every op allocates its outputs and launches on torch's current stream
SCHEMAS = {
    "softplus_forward": "softplus_forward(Tensor x) -> Tensor",
    "rms_norm": "rms_norm(Tensor x, Tensor weight, float eps, ScalarType? out_dtype=None) -> (Tensor, Tensor)",
}

SOFTPLUS_DTYPES = ("f32", "bf16", "f16")
RMS_NORM_KERNELS = {  # (x dtype, out dtype) -> (family, dtype): kernels/fixed/norm.toml
    ("f32", "f32"): ("rmsnorm_forward", "f32"),
    ("f32", "bf16"): ("rmsnorm_forward_f32in", "bf16"),  # the residual stream stays f32, the output is half
    ("f32", "f16"): ("rmsnorm_forward_f32in", "f16"),
}


def softplus_kernel(x_dtype: str) -> tuple[str, str]:
    if x_dtype not in SOFTPLUS_DTYPES:
        raise LaunchRefused(f"mamba_forge::softplus_forward: x is {x_dtype}; it takes {', '.join(SOFTPLUS_DTYPES)}")
    return "softplus_forward", x_dtype


def rms_norm_kernel(x_dtype: str, out_dtype: str) -> tuple[str, str]:
    got = RMS_NORM_KERNELS.get((x_dtype, out_dtype))
    if got is None:
        have = ", ".join(f"x {a} -> {b}" for a, b in RMS_NORM_KERNELS)
        raise LaunchRefused(f"mamba_forge::rms_norm: no kernel for x {x_dtype} -> {out_dtype} (has {have})")
    return got


def rms_norm_shapes(x_shape: tuple[int, ...], weight_shape: tuple[int, ...]) -> tuple[int, int]:
    """(rows, dim) of x [..., dim] normalised over its last dimension by a weight of shape [dim]."""
    if not x_shape or len(weight_shape) != 1 or x_shape[-1] != weight_shape[0]:
        raise LaunchRefused(f"mamba_forge::rms_norm: x {list(x_shape)} and weight {list(weight_shape)} do not fit: "
                            "x is [..., dim], weight is [dim]")
    rows = 1
    for n in x_shape[:-1]:
        rows *= n
    return rows, x_shape[-1]


def kernels_used() -> list[tuple[str, str]]:
    """Every (family, dtype) an op may launch: loaded at registration, so a CUDA-graph capture loads no module."""
    return [softplus_kernel(d) for d in SOFTPLUS_DTYPES] + list(RMS_NORM_KERNELS.values())


__all__ = ["LIBRARY", "RMS_NORM_KERNELS", "SCHEMAS", "SOFTPLUS_DTYPES", "kernels_used", "rms_norm_kernel",
           "rms_norm_shapes", "softplus_kernel"]
