"""The catalog's hard limits: what CUDA can launch (grid, block, dynamic shared memory) and how big a catalog may
be (modules, family files, families, variants, instances, symbols), checked on the raw TOML data BEFORE a family
is validated or expanded, so a hostile catalog is refused in time proportional to its file size, never to the
product it asks for. Every refusal is one CatalogError naming file, entry, field and the limit.

The size caps sit well above the built-in catalog (11 modules, 19 family files, 129 families, 317 symbols; at
most 3 variants, 5 instances and 12 symbols in one family): a catalog that reaches one is a mistake or an attack.
"""

from __future__ import annotations

from typing import Any

from mamba_forge.catalog.targets import TARGETS, gate_admits
from mamba_forge.core import expr
from mamba_forge.core.errors import CatalogError, printable

# CUDA's launch limits (CUDA C Programming Guide, "Technical Specifications per Compute Capability")
GRID_MAX = (2**31 - 1, 65535, 65535)  # grid x < 2^31, y and z < 65536; every dim >= 1
BLOCK_DIM_MAX = (1024, 1024, 64)
BLOCK_THREADS_MAX = 1024  # threads per block on every target
SMEM_OPTIN_MAX = max(t.optin_smem_per_block for t in TARGETS.values())  # 227 KiB (sm_90 and newer)
DIM_MAX = 1 << 40  # a qualification dim: >= 1, and small enough that its products stay in 64 bits

# catalog size caps (see the module docstring for what the built-in catalog holds)
MAX_MODULES = 256
MAX_FAMILY_FILES = 256  # per module
MAX_SOURCES = 256  # per module
MAX_FAMILIES = 4096  # in the whole catalog
MAX_VARIANTS = 16  # per family (there are 10 dtype tokens)
MAX_INSTANCES = 256  # per family
MAX_FAMILY_SYMBOLS = 1024  # per family: (variants + bare) x instances
MAX_SYMBOLS = 16384  # in the whole catalog, after expansion
MAX_PARAMS = 128  # per family
MAX_FALLBACKS = 16  # per family


def _count(value: Any) -> int:
    return len(value) if isinstance(value, list) else 0


def _cap(n: int, cap: int, where: str, what: str) -> None:
    if n > cap:
        raise CatalogError(f"{where}: {n} {what}; the limit is {cap}", hint="split or shrink the catalog")


def check_root_size(data: Any, path) -> None:
    """Modules, and per module its family files and sources, on the raw root file (before validation)."""
    if not isinstance(data, dict):
        return
    modules = data.get("module")
    _cap(_count(modules), MAX_MODULES, f"{path}: module", "modules")
    for mi, mod in enumerate(modules if isinstance(modules, list) else []):
        if isinstance(mod, dict):
            where = f"{path}: module[{mi}] (kind={printable(mod.get('kind'), limit=60)})"
            _cap(_count(mod.get("families")), MAX_FAMILY_FILES, f"{where}.families", "family files")
            _cap(_count(mod.get("sources")), MAX_SOURCES, f"{where}.sources", "sources")


class SizeBudget:
    """Running totals over the family files of one catalog: families and symbols, counted before expansion."""

    def __init__(self) -> None:
        self.families = 0
        self.symbols = 0

    def check_family_file(self, data: Any, path) -> None:
        """Families in the file, and per family its variants, instances, params, fallbacks and the symbols its
        expansion would give (computed as a product, never expanded), on the raw data before validation."""
        families = data.get("family") if isinstance(data, dict) else None
        if not isinstance(families, list):
            return  # the schema refuses it with its own message
        self.families += len(families)
        _cap(self.families, MAX_FAMILIES, f"{path}: family", "families in the catalog so far")
        for fi, fam in enumerate(families):
            if not isinstance(fam, dict):
                continue
            where = f"{path}: family[{fi}] (name={printable(fam.get('name'), limit=60)})"
            variants, instances = _count(fam.get("variants")), _count(fam.get("instances"))
            _cap(variants, MAX_VARIANTS, f"{where}.variants", "variants")
            _cap(instances, MAX_INSTANCES, f"{where}.instances", "instances")
            _cap(_count(fam.get("params")), MAX_PARAMS, f"{where}.params", "params")
            _cap(_count(fam.get("fallback")), MAX_FALLBACKS, f"{where}.fallback", "fallback templates")
            dtypes = variants + (1 if fam.get("bare") else 0)
            n = max(dtypes, 1) * max(instances, 1)
            _cap(n, MAX_FAMILY_SYMBOLS, where, "symbols from (variants + bare) x instances")
            self.symbols += n
            _cap(self.symbols, MAX_SYMBOLS, where, "symbols in the catalog so far")


def smem_limit(gates: list[str]) -> tuple[int, str]:
    """The most dynamic shared memory a block may opt into on any target the module's gates admit, and that
    target's name (the largest limit of all targets where no known target is admitted)."""
    admitted = [t for t in TARGETS.values() if any(gate_admits(g, t) for g in gates)]
    best = max(admitted or TARGETS.values(), key=lambda t: t.optin_smem_per_block)
    return best.optin_smem_per_block, best.name


def check_block(block: tuple[int, ...], where: str) -> None:
    if len(block) != 3 or any(b < 1 for b in block):
        raise CatalogError(f"{where}: launch.block {block}: every dim must be at least 1")
    for axis, (b, top) in enumerate(zip(block, BLOCK_DIM_MAX, strict=True)):
        if b > top:
            raise CatalogError(f"{where}: launch.block[{axis}] = {b}; CUDA allows at most {top}")
    threads = block[0] * block[1] * block[2]
    if threads > BLOCK_THREADS_MAX:
        raise CatalogError(f"{where}: launch.block {block} has {threads} threads; CUDA allows at most "
                           f"{BLOCK_THREADS_MAX} per block")


def check_smem(smem: int, gates: list[str], where: str) -> None:
    limit, target = smem_limit(gates)
    if not 0 <= smem <= limit:
        raise CatalogError(f"{where}: launch.dynamic_smem = {smem} bytes; it must be 0..{limit} "
                           f"({limit // 1024} KiB, the opt-in limit of {target})")


def check_dims(dims: dict[str, int], where: str) -> None:
    for name, value in dims.items():
        if not 1 <= value <= DIM_MAX:
            raise CatalogError(f"{where}: qualify.dims.{printable(name, limit=60)} = {value}; a qualification "
                               f"dim must be 1..2**40")


def check_grid(grid: list, env: dict[str, int], evaluate_named: bool, where: str) -> None:
    """Each grid expression that can be evaluated here (a constant, or any expression at the qualification dims
    of a qualified family) must give 1 <= x < 2^31 and 1 <= y, z < 65536."""
    for axis, e in enumerate(grid):
        try:
            named = expr.names(e)
            if named - set(env) or (named and not evaluate_named):
                continue  # unknown names are refused with their own message; build-only fixtures stay unevaluated
            value = expr.evaluate(e, env)
        except expr.ExprError:
            continue  # _check_launch_expressions reports it with the expression's own problem
        if isinstance(value, float) or not 1 <= value <= GRID_MAX[axis]:
            which = "xyz"[axis]
            raise CatalogError(f"{where}: launch.grid[{axis}] = {value!r}; CUDA needs 1 <= grid {which} <= "
                               f"{GRID_MAX[axis]}" + (" at the qualification dims" if named else ""))
