"""Static admission: each symbol against its target's limits and its own policy, with a reason.

A rejection names the symbol, the figure and the limit; the symbol's siblings are judged on their own.
"""

from __future__ import annotations

from mamba_forge.catalog.model import Symbol
from mamba_forge.catalog.targets import SMEM_RESERVED_BYTES, Target
from mamba_forge.core.schema import Resources, Verdict

REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def blocks_per_sm(threads: int, registers: int, smem_bytes: int, target: Target) -> int:
    """Resident blocks per SM at a launch shape: the least of the thread, register, smem and block limits."""
    warps = _ceil(threads, 32)
    limits = [target.max_blocks_per_sm, target.max_threads_per_sm // (warps * 32)]
    regs_per_warp = _ceil(max(registers, 1) * 32, REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    limits.append(target.regs_per_sm // (regs_per_warp * warps))
    if smem_bytes > 0:
        per_block = smem_bytes + (SMEM_RESERVED_BYTES if target.cc >= 90 else 0)
        limits.append(target.smem_per_sm // per_block)
    return max(0, min(limits))


def admit_symbol(sym: Symbol, res: Resources, target: Target) -> Verdict:
    """The first limit a symbol breaks, or admitted."""
    who = f"{sym.name} on {target.name}"
    p = sym.policy
    threads = sym.threads

    def no(check: str, reason: str) -> Verdict:
        return Verdict(status="rejected", check=check, reason=f"{who}: {reason}")

    if threads > target.max_threads_per_block:
        return no("block", f"block of {threads} threads > {target.max_threads_per_block} per block")
    if res.max_threads and threads > res.max_threads:
        return no("block", f"block of {threads} threads > its __launch_bounds__ of {res.max_threads}")
    if res.registers > min(p.max_regs, target.max_regs_per_thread):
        return no("registers", f"{res.registers} registers per thread > cap {min(p.max_regs, target.max_regs_per_thread)}")
    regs_block = _ceil(res.registers * 32, REG_ALLOC_UNIT) * REG_ALLOC_UNIT * _ceil(threads, 32)
    if regs_block > target.max_regs_per_block:
        return no("registers", f"{regs_block} registers per block of {threads} > {target.max_regs_per_block}")
    if res.static_smem > target.static_smem_per_block:
        return no("smem", f"{res.static_smem} bytes static shared memory > {target.static_smem_per_block} static limit")
    total_smem = res.static_smem + sym.dynamic_smem
    if total_smem > target.optin_smem_per_block:
        return no(
            "smem",
            f"{res.static_smem} static + {sym.dynamic_smem} dynamic = {total_smem} bytes shared memory "
            f"> {target.optin_smem_per_block} opt-in limit",
        )
    spills = res.spill_stores + res.spill_loads
    if spills > p.max_spill:
        return no("spills", f"{res.spill_stores} bytes spill stores + {res.spill_loads} loads > allowed {p.max_spill}")
    if res.stack_frame > p.max_stack:
        return no("stack", f"{res.stack_frame} bytes stack frame > allowed {p.max_stack}")
    occ = blocks_per_sm(threads, res.registers, total_smem, target)
    if occ < p.min_blocks_per_sm:
        return no("occupancy", f"{occ} resident blocks per SM at {threads} threads < required {p.min_blocks_per_sm}")
    return Verdict(status="admitted")


def reject_float_atomics(sym: Symbol, target: Target, atomics: list[str]) -> Verdict:
    shown = ", ".join(sorted(set(atomics))[:3])
    return Verdict(
        status="rejected",
        check="float-atomics",
        reason=f"{sym.name} on {target.name}: deterministic symbol uses floating-point atomics ({shown})",
    )


def reject_order_tokens(sym: Symbol, target: Target, tokens: list[str]) -> Verdict:
    shown = ", ".join(tokens[:4]) + (f" and {len(tokens) - 4} more" if len(tokens) > 4 else "")
    return Verdict(
        status="rejected",
        check="static-tokens",
        reason=f"{sym.name} on {target.name}: the deterministic token policy forbids atom.*, red.*, local memory "
               f"and call in its PTX; found {shown}",
    )


def reject_pdl_without_wait(sym: Symbol, target: Target) -> Verdict:
    return Verdict(
        status="rejected",
        check="pdl-wait",
        reason=f"{sym.name} on {target.name}: its catalog launch declares pdl_max_blocks = {sym.pdl_max_blocks} but "
               "its PTX never waits (griddepcontrol.wait): launched early it would read what the grid before it is "
               "still writing; call mf::pdl_wait() before its first global access or drop pdl_max_blocks",
    )


def placement_warnings(sym: Symbol, target: Target, registers: list[str], acknowledged: dict[str, str]) -> list[str]:
    """Notes for a deterministic symbol whose PTX (or a .func it calls) reads placement- or time-dependent special
    registers: a warning per unacknowledged read, naming the registers, and one note per acknowledged read with
    the catalog's reason. Not a rejection: the qualifier's placement check runs the symbol placed differently and
    compares bits (a symbol with a warning gets its hardest placement check). Empty for nondeterministic symbols."""
    if not sym.deterministic or not registers:
        return []
    who = f"{sym.name} on {target.name}"
    open_ = [r for r in registers if r not in acknowledged]
    out = []
    if open_:
        out.append(f"warning: {who}: reads {', '.join('%' + r for r in open_)}, so its bits may depend on which SM or "
                   f"when a block runs; the placement check will vary both (acknowledge a harmless use in the "
                   f"family's `acknowledge` table with the reason)")
    for r in registers:
        if r in acknowledged:
            out.append(f"acknowledged: {who}: reads %{r}: {acknowledged[r]}")
    return out
