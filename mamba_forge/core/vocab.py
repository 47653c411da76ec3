"""The words every layer shares, defined once: dtype tokens, GEMM layouts and route key tokens, the compute
capability and the device record. Standard library only (the catalog, the qualifier, the runtime and the driver
layer all import this module)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

# dtype tokens -> (C type, size in bytes, numpy name); a catalog's `variants`, a Param's `dtype`
DTYPES: dict[str, tuple[str, int, str]] = {
    "f32": ("float", 4, "float32"),
    "f64": ("double", 8, "float64"),
    "bf16": ("__nv_bfloat16", 2, "bfloat16"),
    "f16": ("__half", 2, "float16"),
    "i8": ("int8_t", 1, "int8"),
    "u8": ("uint8_t", 1, "uint8"),
    "i32": ("int", 4, "int32"),
    "u32": ("unsigned int", 4, "uint32"),
    "i64": ("long long", 8, "int64"),
    "u64": ("unsigned long long", 8, "uint64"),
}
DTYPE_SIZES: dict[str, int] = {token: size for token, (_, size, _) in DTYPES.items()}
FLOAT_DTYPES = frozenset({"f32", "f64", "bf16", "f16"})

# GEMM layout names (the instance key L of a family, a route's key, the runtime's `layout=`) -> the enumerators of
# kernels/include/mf/layout.cuh
LAYOUT_ENUMS: dict[str, str] = {"nn": "mf::Layout::NN", "tn": "mf::Layout::TN", "nt": "mf::Layout::NT"}
LAYOUTS: tuple[str, ...] = tuple(LAYOUT_ENUMS)

# a GEMM route key's operand tokens: tf32 is f32 storage with TF32 math accepted
GEMM_KEY_DTYPES: tuple[str, ...] = ("f32", "tf32", "bf16", "f16")
STORAGE: dict[str, str] = {"f32": "f32", "tf32": "f32", "bf16": "bf16", "f16": "f16"}  # what a token is stored as
GEMM_STORAGE: tuple[str, ...] = ("bf16", "f16", "f32")  # the dtypes a GEMM operand may be stored in


class ComputeCapability(NamedTuple):
    """(major, minor), as the driver reports it; still a tuple, so ``cc == (9, 0)`` and ordering hold."""

    major: int
    minor: int

    @property
    def text(self) -> str:
        """How manifests record it: "9.0"."""
        return f"{self.major}.{self.minor}"

    @property
    def number(self) -> int:
        """How target names spell it: 90 (sm_90), 121 (sm_121)."""
        return self.major * 10 + self.minor


# Programmatic dependent launch exists from compute capability 9.0: the build holds a pdl_max_blocks symbol to its
# wait there (build/records.py), the runtime and the qualifier launch with it there only (runtime/loader.pdl_blocks,
# qualify/pdl.applies).
PDL_MIN_CC = ComputeCapability(9, 0)


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as the driver layer reads it: what the loader checks a manifest against (ordinal to driver
    version) and what the qualifier records and sizes launches by (the rest)."""

    ordinal: int
    name: str
    cc: ComputeCapability
    sm_count: int
    driver_version: int  # cuDriverGetVersion: 13000 = CUDA 13.0
    optin_smem: int = 0  # MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    smem_per_sm: int = 0
    total_memory: int = 0
    uuid: str = ""

    def __post_init__(self):
        major, minor = self.cc  # a (major, minor) pair of any kind becomes the one type
        object.__setattr__(self, "cc", ComputeCapability(int(major), int(minor)))

    @property
    def cc_text(self) -> str:
        return self.cc.text


__all__ = [
    "DTYPES", "DTYPE_SIZES", "FLOAT_DTYPES", "GEMM_KEY_DTYPES", "GEMM_STORAGE", "LAYOUTS", "LAYOUT_ENUMS", "STORAGE",
    "ComputeCapability", "DeviceInfo",
]
