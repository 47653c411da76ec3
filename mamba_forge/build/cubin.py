"""Read per-kernel resources from a cubin (pyelftools for the ELF; the .nv.info decoding is ours) and from the
ptxas verbose log (the only source that separates spill bytes from the stack frame).

.nv.info entries: format byte, attribute byte, then a u16 that is the value (formats 1-3) or the payload
length (format 4, EIFMT_SVAL, payload follows). The global .nv.info holds per-function REGCOUNT, FRAME_SIZE
and MIN_STACK_SIZE keyed by symbol index; .nv.info.<kernel> holds the kernel's own attributes.
"""

from __future__ import annotations

import io
import re
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyelftools is imported when a cubin is read (a compile), not for a cache hit's checks
    from elftools.elf.elffile import ELFFile

EIFMT_SVAL = 0x04
EIATTR_MAX_THREADS = 0x05
EIATTR_FRAME_SIZE = 0x11
EIATTR_MIN_STACK_SIZE = 0x12
EIATTR_KPARAM_INFO = 0x17
EIATTR_CBANK_PARAM_SIZE = 0x19
EIATTR_MAXREG_COUNT = 0x1B
EIATTR_REGCOUNT = 0x2F
EIATTR_NUM_BARRIERS = 0x4C

STT_FUNC = 2
STO_CUDA_ENTRY = 0x10  # st_other bit that marks a __global__ entry point


class CubinError(ValueError):
    pass


EM_CUDA = 190
ELFOSABI_CUDA = 0x41


def elf_problem(data: bytes, cc: int) -> str | None:
    """Why `data` is not a cubin for compute capability `cc` (an ELF64 little-endian file for EM_CUDA whose e_flags
    name that SM), or None. NVRTC 13 (ELF ABI version 8) keeps the SM in e_flags bits 8-15; older ABIs in bits 0-7."""
    if len(data) < 64:
        return f"cubin of {len(data)} bytes is not an ELF file"
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return "cubin is not a little-endian ELF64 file"
    (machine,) = struct.unpack_from("<H", data, 18)
    if machine != EM_CUDA:
        return f"cubin is an ELF file for machine {machine}, not CUDA ({EM_CUDA})"
    (flags,) = struct.unpack_from("<I", data, 48)
    sm = (flags >> 8) & 0xFF if data[8] >= 7 else flags & 0xFF
    if data[7] == ELFOSABI_CUDA and sm != cc:
        return f"cubin is for sm_{sm}, not sm_{cc}"
    return None


@dataclass(frozen=True)
class ParamInfo:
    ordinal: int
    offset: int
    size: int


@dataclass
class KernelInfo:
    """What the cubin says about one entry point."""

    name: str
    registers: int = 0
    frame_size: int = 0
    min_stack_size: int = 0
    max_threads: int = 0  # 0: no __launch_bounds__
    maxreg_count: int = 0
    barriers: int = 0
    param_bytes: int = 0
    params: list[ParamInfo] = field(default_factory=list)
    static_smem: int = 0  # size of .nv.shared.<kernel> (on sm_90+ this includes 1 KB reserved by the system)


def _entries(data: bytes):
    pos = 0
    while pos + 4 <= len(data):
        fmt, attr, val = struct.unpack_from("<BBH", data, pos)
        pos += 4
        if fmt == EIFMT_SVAL:
            payload = data[pos : pos + val]
            pos += val
            yield attr, None, payload
        else:
            yield attr, val, b""


def read_cubin(blob: bytes) -> dict[str, KernelInfo]:
    """All entry kernels of a cubin with their static resources, keyed by name."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    try:
        elf = ELFFile(io.BytesIO(blob))
        symtab = elf.get_section_by_name(".symtab")
    except Exception as exc:  # noqa: BLE001 - pyelftools raises many types on garbage
        raise CubinError(f"not a readable cubin: {exc}") from None
    if not isinstance(symtab, SymbolTableSection):
        raise CubinError("cubin has no symbol table")
    syms = list(symtab.iter_symbols())
    kernels: dict[str, KernelInfo] = {}
    by_index: dict[int, KernelInfo] = {}
    for idx, s in enumerate(syms):
        if s["st_info"]["type"] == "STT_FUNC" and (s["st_other"]["local"] & 0) == 0:
            other = s.entry["st_other"]
            raw_other = other if isinstance(other, int) else _raw_other(blob, elf, symtab, idx)
            if raw_other & STO_CUDA_ENTRY and s.name:
                k = KernelInfo(s.name)
                kernels[s.name] = k
                by_index[idx] = k
    glob = elf.get_section_by_name(".nv.info")
    if glob is not None:
        for attr, _val, payload in _entries(glob.data()):
            if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE, EIATTR_MIN_STACK_SIZE) and len(payload) >= 8:
                sym_idx, value = struct.unpack_from("<II", payload)
                k = by_index.get(sym_idx)
                if k is None:
                    continue
                if attr == EIATTR_REGCOUNT:
                    k.registers = value
                elif attr == EIATTR_FRAME_SIZE:
                    k.frame_size = value
                else:
                    k.min_stack_size = value
    for name, k in kernels.items():
        sec = elf.get_section_by_name(f".nv.info.{name}")
        if sec is not None:
            for attr, val, payload in _entries(sec.data()):
                if attr == EIATTR_MAX_THREADS and len(payload) >= 12:
                    x, y, z = struct.unpack_from("<III", payload)
                    k.max_threads = x * y * z
                elif attr == EIATTR_MAXREG_COUNT:
                    k.maxreg_count = val or 0
                elif attr == EIATTR_NUM_BARRIERS:
                    k.barriers = val or 0
                elif attr == EIATTR_CBANK_PARAM_SIZE:
                    k.param_bytes = val or 0
                elif attr == EIATTR_KPARAM_INFO and len(payload) >= 12:
                    _index, ordinal, offset, flags = struct.unpack_from("<IHHI", payload)
                    k.params.append(ParamInfo(ordinal, offset, (flags >> 18) & 0x3FFF))
        k.params.sort(key=lambda p: p.ordinal)
        shared = elf.get_section_by_name(f".nv.shared.{name}")
        if shared is not None:
            k.static_smem = shared["sh_size"]
    return kernels


def _raw_other(blob: bytes, elf: ELFFile, symtab, idx: int) -> int:
    """st_other as the raw byte (pyelftools decodes it into visibility fields and drops CUDA's bits)."""
    off = symtab["sh_offset"] + idx * symtab["sh_entsize"]
    # Elf64_Sym: st_name u32, st_info u8, st_other u8, ...
    return blob[off + 5]


# ---- ptxas verbose log --------------------------------------------------------------------------------------

_FUNC = re.compile(r"Function properties for (\S+)")
_COMPILING = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
# a kernel with a stack prints "N bytes cumulative stack size" between the barriers and the smem figure
_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, \d+ bytes cumulative stack size)?"
                   r"(?:, (\d+) bytes smem)?")


@dataclass
class PtxasEntry:
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    registers: int = 0
    barriers: int = 0
    smem: int = 0


def parse_ptxas_log(log: str) -> dict[str, PtxasEntry]:
    """Per entry function: stack frame, spill stores/loads, registers, barriers, smem."""
    out: dict[str, PtxasEntry] = {}
    current: PtxasEntry | None = None
    for line in log.splitlines():
        m = _COMPILING.search(line)
        if m:
            current = out.setdefault(m.group(1), PtxasEntry())
            continue
        m = _FUNC.search(line)
        if m:
            current = out.setdefault(m.group(1), PtxasEntry())
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
            continue
        m = _USED.search(line)
        if m:
            current.registers = int(m.group(1))
            current.barriers = int(m.group(2) or 0)
            current.smem = int(m.group(3) or 0)
    return out


# ---- PTX scan for determinism ----------------------------------------------------------------------------

_PTX_ENTRY = re.compile(r"^\s*\.visible\s+\.entry\s+(\w+)", re.M)
_FLOAT_ATOMIC = re.compile(r"\b(atom|red)(\.[a-z0-9:_]+)*\.(f16x2|bf16x2|f16|bf16|f32|f64)\b")


# The deterministic token policy (catalog policy static_tokens = "deterministic"): instructions whose effect may
# depend on arrival order or that hide work from static admission: atomics and reductions of any type (TMA
# cp.reduce too), local memory, and calls to functions that were not inlined.
ORDER_TOKENS = re.compile(r"\b(?:atom|red|cp\.reduce)(?:\.[a-z0-9:_]+)+|\b(?:ld|st)\.local\b|^\s*\.local\b"
                          r"|\bcall(?:\.uni)?\b", re.M)


def order_tokens_by_entry(ptx: str) -> dict[str, list[str]]:
    """Per .entry body of a PTX module, the distinct ORDER_TOKENS it holds (sorted); entries without any are absent."""
    return _by_entry(ptx, ORDER_TOKENS)


def order_tokens_outside_entries(ptx: str) -> list[str]:
    """ORDER_TOKENS in the module's non-entry functions (.func bodies), which an entry may call."""
    return _outside_entries(ptx, ORDER_TOKENS)


def _outside_entries(ptx: str, pattern: re.Pattern) -> list[str]:
    first = _PTX_ENTRY.search(ptx)
    return sorted({m.group(0).strip() for m in pattern.finditer(ptx[: first.start()] if first else ptx)})


def _by_entry(ptx: str, pattern: re.Pattern) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    starts = [(m.start(), m.group(1)) for m in _PTX_ENTRY.finditer(ptx)]
    for i, (start, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(ptx)
        hits = sorted({m.group(0).strip() for m in pattern.finditer(ptx, start, end)})
        if hits:
            found[name] = hits
    return found


def float_atomics_by_entry(ptx: str) -> dict[str, list[str]]:
    """Floating-point atomics (atom/red on float types) in each .entry body of a PTX module.

    Device functions are inlined into entries by NVRTC at -O3 unless marked noinline; a `call` to a
    non-inlined function is attributed to the calling entry's module-wide scan (see admit)."""
    return _by_entry(ptx, _FLOAT_ATOMIC)


def float_atomics_outside_entries(ptx: str) -> list[str]:
    """Float atomics in non-entry functions (.func bodies), which any entry might call."""
    return _outside_entries(ptx, _FLOAT_ATOMIC)


# ---- PTX scan for programmatic dependent launch ---------------------------------------------------------

_PDL_WAIT = re.compile(r"\bgriddepcontrol\.wait\b")


def pdl_wait_entries(ptx: str) -> list[str]:
    """The .entry functions of a PTX module whose body holds griddepcontrol.wait (mf::pdl_wait, inlined): the ones
    a launch with programmatic dependent launch may serve (build/records.py rejects a catalog pdl_max_blocks symbol
    that is not among them: it would read what the grid before it is still writing)."""
    return sorted(_by_entry(ptx, _PDL_WAIT))


# ---- PTX scan for placement-dependent special registers ----------------------------------------------------

# Special registers whose value depends on where (which SM, warp slot) or when a block runs: a deterministic
# kernel that reads one may make its bits depend on placement or timing. A warning, not a rejection (a rotation
# of a commutative pairwise tree by %smid is harmless): the qualifier's placement check decides.
PLACEMENT_REGISTERS = ("smid", "nsmid", "warpid", "nwarpid", "clock", "clock_hi", "clock64", "globaltimer",
                       "globaltimer_lo", "globaltimer_hi")
_SPECIAL_REGISTER = re.compile(r"%(" + "|".join(sorted(PLACEMENT_REGISTERS, key=len, reverse=True)) + r")\b")
# a function header: `.visible .entry name(`, `.func (.param .b32 r) name(`, `.weak .func name(`
_PTX_FUNCTION = re.compile(r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)", re.M)
_PTX_CALL = re.compile(r"\bcall(?:\.uni)?\s+(?:\([^)]*\)\s*,\s*)?([\w$]+)")


def special_registers_by_entry(ptx: str) -> dict[str, list[str]]:
    """Per .entry of a PTX module, the placement-dependent special registers (PLACEMENT_REGISTERS, without the
    '%', sorted) that the entry or any .func it calls, directly or through other calls, reads; entries without
    any are absent. Function bodies run from one header to the next (a prototype's slice holds no code)."""
    heads = [(m.start(), m.group(1), m.group(2)) for m in _PTX_FUNCTION.finditer(ptx)]
    reads: dict[str, set[str]] = {}
    calls: dict[str, set[str]] = {}
    entries: list[str] = []
    for i, (start, kind, name) in enumerate(heads):
        end = heads[i + 1][0] if i + 1 < len(heads) else len(ptx)
        body = ptx[start:end]
        reads.setdefault(name, set()).update(m.group(1) for m in _SPECIAL_REGISTER.finditer(body))
        calls.setdefault(name, set()).update(m.group(1) for m in _PTX_CALL.finditer(body))
        if kind == "entry":
            entries.append(name)
    found: dict[str, list[str]] = {}
    for entry in entries:
        seen, todo, regs = {entry}, [entry], set()
        while todo:  # the transitive callees (a call to a name with no body here reads nothing we can see)
            f = todo.pop()
            regs |= reads.get(f, set())
            for callee in calls.get(f, set()) - seen:
                seen.add(callee)
                todo.append(callee)
        if regs:
            found[entry] = sorted(regs)
    return found
