"""Compilation targets and their static resource limits.

Figures are the CUDA C Programming Guide's per-compute-capability limits ("Technical Specifications per
Compute Capability"); the opt-in shared memory per block is what cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)
can raise a kernel to (232,448 bytes measured on the H200).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mamba_forge.errors import ForgeError

KIB = 1024
SMEM_RESERVED_BYTES = 1024  # shared memory the system reserves per block on sm_90 and newer


@dataclass(frozen=True)
class Target:
    name: str  # NVRTC arch name, e.g. "sm_90a"
    cc: int  # compute capability as major*10+minor, e.g. 90
    arch_specific: bool  # the "a" suffix: arch-specific instructions (wgmma, tcgen05), runs only on that cc
    family: str  # GPU family name used in reports: "Ampere", "Ada", "Hopper", "Blackwell", ...
    max_threads_per_block: int = 1024
    max_regs_per_thread: int = 255
    regs_per_sm: int = 65536
    max_regs_per_block: int = 65536
    static_smem_per_block: int = 48 * KIB
    optin_smem_per_block: int = 48 * KIB
    smem_per_sm: int = 48 * KIB
    max_blocks_per_sm: int = 32
    max_threads_per_sm: int = 2048

    @property
    def sm(self) -> str:
        """The cubin's machine name without the arch-specific suffix, e.g. sm_90 for sm_90a."""
        return f"sm_{self.cc}"


TARGETS: dict[str, Target] = {
    t.name: t
    for t in [
        Target("sm_80", 80, False, "Ampere", optin_smem_per_block=163 * KIB, smem_per_sm=164 * KIB),
        Target("sm_86", 86, False, "Ampere", optin_smem_per_block=99 * KIB, smem_per_sm=100 * KIB,
               max_blocks_per_sm=16, max_threads_per_sm=1536),
        Target("sm_89", 89, False, "Ada", optin_smem_per_block=99 * KIB, smem_per_sm=100 * KIB,
               max_blocks_per_sm=24, max_threads_per_sm=1536),
        Target("sm_90", 90, False, "Hopper", optin_smem_per_block=227 * KIB, smem_per_sm=228 * KIB),
        Target("sm_90a", 90, True, "Hopper", optin_smem_per_block=227 * KIB, smem_per_sm=228 * KIB),
        Target("sm_100a", 100, True, "Blackwell", optin_smem_per_block=227 * KIB, smem_per_sm=228 * KIB),
        Target("sm_103a", 103, True, "Blackwell", optin_smem_per_block=227 * KIB, smem_per_sm=228 * KIB),
        Target("sm_120", 120, False, "Blackwell-GeForce", optin_smem_per_block=99 * KIB,
               smem_per_sm=100 * KIB, max_blocks_per_sm=24, max_threads_per_sm=1536),
        Target("sm_120a", 120, True, "Blackwell-GeForce", optin_smem_per_block=99 * KIB,
               smem_per_sm=100 * KIB, max_blocks_per_sm=24, max_threads_per_sm=1536),
    ]
}

DEFAULT_TARGETS: tuple[str, ...] = ("sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a")

_GATE = re.compile(r"^sm_(\d+)(a?)(\+?)$")


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise ForgeError(
            f"unknown architecture {name!r}", hint=f"choose from {', '.join(TARGETS)}"
        ) from None


def target_for_cc(major: int, minor: int) -> list[Target]:
    """Targets whose cubins run on a device of compute capability major.minor (arch-specific first)."""
    cc = major * 10 + minor
    return sorted((t for t in TARGETS.values() if t.cc == cc), key=lambda t: not t.arch_specific)


def gate_admits(gate: str, target: Target) -> bool:
    """Does an architecture gate admit a target?

    ``"sm_90a"`` admits exactly that target; ``"sm_80+"`` admits every target of compute capability 8.0 or
    newer (arch-specific ones included, since their code runs the portable instructions too).
    """
    m = _GATE.match(gate)
    if m is None:
        raise ValueError(f"bad architecture gate {gate!r}: write sm_NN, sm_NNa or sm_NN+")
    cc, suffix, plus = int(m.group(1)), m.group(2), m.group(3)
    if plus:
        return target.cc >= cc
    return target.cc == cc and (suffix == "a") == target.arch_specific


def validate_gate(gate: str) -> str:
    m = _GATE.match(gate)
    if m is None or (m.group(2) and m.group(3)):
        raise ValueError(f"bad architecture gate {gate!r}: write sm_NN, sm_NNa or sm_NN+")
    return gate
