"""A symbol's launch contract for the qualified manifest (manifest_version 2): the catalog's declaration of the
family (params, launch grid and dynamic shared memory), resolved for one symbol (its dtype, instance constants,
the module's state capacity), joined with the ABI census (offset and size per parameter).

The contract is what a caller needs to launch the symbol without the catalog: the expressions stay expressions
(over `dims`, which the caller supplies, and `constants`, which the symbol fixes). The qualifier launches through
the same record (runtime_symbol -> runtime.contract.Contract; qualify/spec.py), so what it qualified is what an
engine's launch of the signed record computes.
"""

from __future__ import annotations

from mamba_forge.catalog.model import Family, ModuleSpec, Symbol
from mamba_forge.core import expr
from mamba_forge.core.schema import Param, RuntimeSymbol, param_kind
from mamba_forge.core.vocab import DTYPES


def _text(v) -> str:
    """An expression as the manifest writes it: text; a float literal as its repr."""
    return v if isinstance(v, str) else repr(v) if isinstance(v, float) else str(v)


def _is_expression(text: str) -> bool:
    return bool(text) and not (text[0].isdigit() or text[0] in "+-.")


def constants_of(sym: Symbol) -> dict[str, int]:
    """The names the symbol fixes: integer instance parameters, and sizeof_<key> for each dtype key."""
    env = sym.params_env
    out = {k: v for k, v in env.items() if isinstance(v, int)}
    out.update({f"sizeof_{k}": DTYPES[v][1] for k, v in env.items() if isinstance(v, str) and v in DTYPES})
    return out


def contract(sym: Symbol, spec: ModuleSpec, layout: list[list[int]], state_capacity: int) -> dict:
    """The QSymbol fields of the launch contract: grid, dynamic_smem_expr, dims, constants, state_capacity,
    the dims rules, params, pdl_max_blocks. `layout` is the ABI census ([offset, size] per parameter, in order); where it does not cover the
    declared parameters one for one (the module failed to compile, or the ABI check rejected the symbol), no
    parameter can be placed and `params` stays empty: such a symbol never serves."""
    return family_contract(sym, spec.family(sym.family), layout, state_capacity if spec.module.state_capacity else 0)


def family_contract(sym: Symbol, fam: Family, layout: list[list[int]], state_capacity: int) -> dict:
    """contract() for a family given as is (the qualifier's, which tests vary) and the state capacity the symbol's
    module was compiled with (0: none)."""
    env = sym.params_env
    params: list[Param] = []
    if len(layout) == len(fam.params):
        for p, (offset, size) in zip(fam.params, layout, strict=True):
            kind = param_kind(p.type)
            dtype = ""
            if kind == "pointer" and p.dtype is not None:
                dtype = p.dtype if p.dtype in DTYPES else str(env.get(p.dtype, p.dtype))
            params.append(Param(
                name=p.name, kind=kind, type=p.type, dtype=dtype,  # type: ignore[arg-type]
                role="" if kind == "scalar" else p.role, in_place_of=p.in_place_of, shape=[_text(x) for x in p.shape],
                value="" if p.value is None else _text(p.value), offset=offset, size=size,
            ))
    grid = [_text(g) for g in fam.launch.grid]
    constants = constants_of(sym)
    texts = grid + [x for p in params for x in p.shape] + [p.value for p in params if _is_expression(p.value)]
    used = set().union(*(expr.names(x) for x in texts)) if texts else set()
    return {
        "grid": grid, "dynamic_smem_expr": _text(fam.launch.dynamic_smem), "dims": sorted(used - set(constants)),
        "constants": constants, "state_capacity": state_capacity, "params": params,
        "tensor_maps": tensor_map_hook(fam), "dims_multiple_of": dict(fam.requires.multiple_of),
        "dims_at_most": dict(fam.requires.at_most), "pdl_max_blocks": sym.pdl_max_blocks,
    }


def tensor_map_hook(fam: Family) -> str:
    """The family's tensor-map hook (its qualify.prepare, a function of mamba_forge.gpu.tma) where it takes
    by-value blobs; "" otherwise (no blobs, or a prepare that builds something else, e.g. a pointer table)."""
    module, _, name = (fam.qualify.prepare or "").partition(":")
    takes_blobs = any(param_kind(p.type) == "blob" for p in fam.params)
    return name if takes_blobs and module == TENSOR_MAP_MODULE else ""


TENSOR_MAP_MODULE = "mamba_forge.gpu.tma"


def runtime_symbol(sym: Symbol, fam: Family, layout: list[list[int]], state_capacity: int) -> RuntimeSymbol:
    """The record an engine loads for `sym` (the signed QSymbol's launch contract, as the runtime table projects
    it): block and dynamic shared memory as the build records them (the catalog symbol's), the contract's fields
    from family_contract. The qualifier launches through runtime.contract.Contract of this record."""
    return RuntimeSymbol(name=sym.name, module=sym.module, target="", family=sym.family, dtype=sym.dtype or "",
                         status="admitted", fallback=list(sym.fallback), block=list(sym.block),
                         dynamic_smem=sym.dynamic_smem, deterministic=sym.deterministic,
                         **family_contract(sym, fam, layout, state_capacity))


__all__ = ["TENSOR_MAP_MODULE", "constants_of", "contract", "family_contract", "runtime_symbol", "tensor_map_hook"]
