"""Compilation targets and their static resource limits.

Figures are the CUDA C Programming Guide's per-compute-capability limits ("Technical Specifications per
Compute Capability"); the opt-in shared memory per block is what cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)
can raise a kernel to (232,448 bytes measured on the H200).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mamba_forge.core.errors import ForgeError

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
        # Thor (CUDA 13 renamed sm_101 to sm_110; NVRTC 13.0 refuses sm_101a): the datacenter Blackwell limits
        Target("sm_110a", 110, True, "Blackwell-Thor", optin_smem_per_block=227 * KIB, smem_per_sm=228 * KIB),
        Target("sm_120", 120, False, "Blackwell-GeForce", optin_smem_per_block=99 * KIB,
               smem_per_sm=100 * KIB, max_blocks_per_sm=24, max_threads_per_sm=1536),
        Target("sm_120a", 120, True, "Blackwell-GeForce", optin_smem_per_block=99 * KIB,
               smem_per_sm=100 * KIB, max_blocks_per_sm=24, max_threads_per_sm=1536),
        # GB10 (DGX Spark): CC 12.1, the CC 12.x limits
        Target("sm_121", 121, False, "Blackwell-GB10", optin_smem_per_block=99 * KIB,
               smem_per_sm=100 * KIB, max_blocks_per_sm=24, max_threads_per_sm=1536),
        Target("sm_121a", 121, True, "Blackwell-GB10", optin_smem_per_block=99 * KIB,
               smem_per_sm=100 * KIB, max_blocks_per_sm=24, max_threads_per_sm=1536),
    ]
}

# NVRTC 13.0 (cuda-bindings 13) accepts every target above; it refuses sm_101a (docs/targets.md).
DEFAULT_TARGETS: tuple[str, ...] = ("sm_80", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_110a", "sm_120a", "sm_121a")

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


# --- choosing targets: --arch, MAMBA_FORGE_ARCH, TORCH_CUDA_ARCH_LIST -------------------------------------------

ARCH_ENV = "MAMBA_FORGE_ARCH"
TORCH_ARCH_ENV = "TORCH_CUDA_ARCH_LIST"  # honoured like FlashInfer does, after ours; `build` says when it used it
ALL = "all"  # every target mamba-forge knows
NATIVE = "native"  # the attached GPUs' architectures
_OURS = re.compile(r"^sm_\d{2,3}a?$", re.ASCII)
_TORCH = re.compile(r"^(\d{1,2})\.(\d)(a?)(\+PTX)?$", re.IGNORECASE | re.ASCII)  # 8.0, 9.0a, 12.0, 8.6+PTX
_SEPARATORS = re.compile(r"[\s,;]+")
_SHOWN = 40  # characters of a hostile token echoed back


@dataclass(frozen=True)
class ArchSelection:
    names: tuple[str, ...]  # target names, in the order given, without repeats
    source: str  # "--arch", ARCH_ENV, TORCH_ARCH_ENV or "default"
    notes: tuple[str, ...] = ()


def _shown(token: str) -> str:
    return repr(token if len(token) <= _SHOWN else token[:_SHOWN] + "…")


def _native_ccs() -> list[tuple[int, int]]:
    from mamba_forge.gpu.probe import attached_ccs

    return attached_ccs()


def parse_arch_list(text: str, source: str, native=_native_ccs, *, skip_unbuilt: bool = False) -> ArchSelection:
    """Target names from one spelling list: ours (sm_90a,sm_80) or TORCH_CUDA_ARCH_LIST's (`8.0 9.0a 12.0`,
    `8.0;9.0`, `9.0+PTX`: the PTX part is ignored with a note), `all` or `native`; separated by spaces, commas
    or semicolons. Raises ForgeError (bad input) naming `source` and the token. `skip_unbuilt` (torch's own
    list, which names architectures from 5.0 on): a torch-spelled architecture mamba-forge does not build is
    left out with a note, and only a list with none left is refused."""
    tokens = [t for t in _SEPARATORS.split(text) if t]
    if not tokens:
        raise ForgeError(f"{source} {text!r} names no architecture",
                         hint=f"e.g. sm_90a, sm_80,sm_90a, 9.0a or all; known: {', '.join(TARGETS)}")
    names: list[str] = []
    notes: list[str] = []
    skipped: dict[str, str] = {}  # token -> the target name it spells, which mamba-forge does not build
    for token in tokens:
        if token.lower() == ALL:
            names.extend(TARGETS)
        elif token.lower() == NATIVE:
            names.extend(_native_names(native, source))
        elif _OURS.match(token):
            names.append(get_target(token).name)
        elif m := _TORCH.match(token):
            name = f"sm_{int(m.group(1))}{m.group(2)}{m.group(3).lower()}"
            if name not in TARGETS:
                if not skip_unbuilt:
                    raise ForgeError(f"{source}: {token!r} is {name}, which mamba-forge does not build",
                                     hint=f"known: {', '.join(TARGETS)}")
                skipped.setdefault(token, name)
                continue
            if m.group(4):
                notes.append(f"{source}: {token} builds {name} cubins; the +PTX part is ignored "
                             "(mamba-forge ships cubins qualified on the GPU they run on)")
            names.append(name)
        else:
            raise ForgeError(f"{source}: {_shown(token)} is not an architecture",
                             hint=f"write sm_90a, 9.0a, all or native; known: {', '.join(TARGETS)}")
    if skipped:
        choose = f"set {ARCH_ENV} or pass --arch to choose the targets; known: {', '.join(TARGETS)}"
        if not names and len(skipped) == 1:
            (token, name), = skipped.items()
            raise ForgeError(f"{source}: {token!r} is {name}, which mamba-forge does not build", hint=choose)
        spelled = ", ".join(f"{t} ({n})" for t, n in skipped.items())
        if not names:
            raise ForgeError(f"{source} names only architectures mamba-forge does not build: {spelled}", hint=choose)
        notes.append(f"{source}: skipped {spelled}, which mamba-forge does not build; {choose}")
    return ArchSelection(tuple(dict.fromkeys(names)), source, tuple(notes))


def _native_names(native, source: str) -> list[str]:
    ccs = native()
    if not ccs:
        raise ForgeError(f"{source}: native needs an attached NVIDIA GPU, and none is visible",
                         hint="name the architectures instead, e.g. sm_90a")
    out = []
    for major, minor in ccs:
        found = target_for_cc(major, minor)
        if not found:
            raise ForgeError(f"{source}: native: the attached GPU is compute capability {major}.{minor}, "
                             "which mamba-forge does not build", hint=f"known: {', '.join(TARGETS)}")
        out.append(found[0].name)  # arch-specific first: what qualifies there
    return out


def select_targets(cli_values: list[str] | None, env, native=_native_ccs) -> ArchSelection:
    """The build's targets: `--arch` values (repeatable, each a list), else $MAMBA_FORGE_ARCH, else
    $TORCH_CUDA_ARCH_LIST (with a note saying so; the architectures of it mamba-forge does not build are left
    out with a note), else DEFAULT_TARGETS. An environment variable set to an empty value counts as unset; an
    empty --arch is bad input."""
    if cli_values is not None:
        if not cli_values:
            raise ForgeError("--arch names no architecture", hint="e.g. --arch sm_90a")
        names: list[str] = []
        notes: list[str] = []
        for value in cli_values:
            sel = parse_arch_list(value, "--arch", native)
            names.extend(sel.names)
            notes.extend(sel.notes)
        return ArchSelection(tuple(dict.fromkeys(names)), "--arch", tuple(notes))
    for var in (ARCH_ENV, TORCH_ARCH_ENV):
        value = env.get(var, "")
        if value.strip():
            sel = parse_arch_list(value, var, native, skip_unbuilt=var == TORCH_ARCH_ENV)  # ours stays strict
            if var == TORCH_ARCH_ENV:
                used = f"targets from {TORCH_ARCH_ENV}={value.strip()!r}: {', '.join(sel.names)} " \
                       f"(set {ARCH_ENV} or pass --arch to choose others)"
                sel = ArchSelection(sel.names, var, (used, *sel.notes))
            return sel
    return ArchSelection(DEFAULT_TARGETS, "default")
