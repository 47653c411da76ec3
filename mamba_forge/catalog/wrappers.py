"""Generated kernel entry points (issue 28: a parameter is declared once, in the family's TOML).

A family that names a ``body`` gets, for each of its symbols, an ``extern "C" __global__`` wrapper written here
from its ``params`` and ``bounds``; the build appends it where a macro family's ``MACRO(symbol, args...)`` line
goes (build/jobs.py ``compose``). The wrapper calls the body, a ``__device__ __forceinline__`` function the
sources keep, with every parameter in declared order::

    body = "mf::ssm_scan_tokens<T>"
    bounds = [64, 8]
    params = [{ name = "out", type = "ptr", dtype = "T", role = "out" }, { name = "L", type = "i64" }, ...]

gives, for the f32 symbol::

    extern "C" __global__ void __launch_bounds__(64, 8) ssm_scan_tokens_f32(float* __restrict__ out, ..., long long L) {
      mf::ssm_scan_tokens<float>(out, ..., L);
    }

C types: a pointer is ``<element>* __restrict__``, ``const`` when its role is ``in``, its element the C type of its
dtype (a token, or an instance key naming one) unless ``ctype`` names a record (``mf::AdamWTensorDesc``); a scalar
is the C type of its type token (core/vocab.py DTYPES); a by-value blob is ``const __grid_constant__ <ctype>``
(``mf::TmaDesc``). The body's template arguments are integers, ``true``/``false``, qualified names, dtype tokens
(their C type) or instance keys, replaced by their C token as a macro's arguments are (a dtype by its C type, a
layout by its enumerator).
``bounds``: ``[]`` (no ``__launch_bounds__``), ``[threads]`` or ``[threads, min_blocks]``, each an expression over
the instance's integers; ``min_blocks`` may instead be a table by arch gate, ``{"sm_80+" = 1, "sm_90+" = 2}``,
written as a ``__CUDA_ARCH__`` choice (NVRTC compiles device code only, so ``__CUDA_ARCH__`` is always defined).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from mamba_forge.catalog.entries import LAYOUT_KEY
from mamba_forge.core import expr
from mamba_forge.core.vocab import DTYPES, LAYOUT_ENUMS

if TYPE_CHECKING:
    from mamba_forge.catalog.entries import Family, Module, Param
    from mamba_forge.catalog.expanded import Symbol

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
QUALIFIED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z_][A-Za-z0-9_]*)*$")
_TARG = r"(-?[0-9]+|[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)"
BODY = re.compile(rf"^([A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*)(?:<\s*({_TARG}(?:\s*,\s*{_TARG})*)\s*>)?$")
ARCH_GATE = re.compile(r"^sm_([0-9]+)\+$")
MAX_BODY = 256  # characters of a body or a ctype
SCALAR_CTYPES = {t: DTYPES[t][0] for t in ("i32", "u32", "i64", "u64", "f32", "f64")}


class WrapperError(ValueError):
    """A generated family whose declaration cannot give a wrapper: the message names what."""


def c_token(key: str, value: int | str) -> str:
    """An instance value as C sees it: a layout name becomes its enumerator, a dtype token its C type."""
    if key == LAYOUT_KEY:
        return LAYOUT_ENUMS[str(value)]
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value][0]
    return str(value)


def family_problem(fam: Family, module: Module) -> str | None:
    """What is wrong with a family's wrapper declaration as a whole (each symbol's own is checked as it is
    written: `wrapper_text`); None when nothing is. A family without a body must declare none of it."""
    if fam.body is None:
        if fam.bounds is not None:
            return "bounds shape a generated wrapper only: name its body, or drop bounds"
        return None
    if fam.instantiate is not None:
        return "names both instantiate (a macro in the sources) and body (a generated wrapper): keep one"
    if fam.args is not None:
        return 'args are a macro\'s arguments: a body names its template arguments itself (body = "mf::f<T, BM>")'
    if len(fam.body) > MAX_BODY or not BODY.match(fam.body):
        return (
            f"body {fam.body!r} is not a qualified C name with optional template arguments "
            "(integers, true/false, names, instance keys)"
        )
    if fam.bounds is None:
        return "a generated wrapper needs bounds: [threads], [threads, min_blocks], or [] for no __launch_bounds__"
    problem = _bounds_problem(fam.bounds, module)
    if problem:
        return problem
    for p in fam.params:
        problem = _param_problem(p)
        if problem:
            return problem
    return None


def _bounds_problem(bounds: list, module: Module) -> str | None:
    if len(bounds) > 2:
        return f"bounds takes at most 2 entries (threads, min_blocks), got {len(bounds)}"
    if bounds and isinstance(bounds[0], dict):
        return "bounds[0] (threads) is an expression, not a table by arch"
    if len(bounds) == 2 and isinstance(bounds[1], dict):
        table = bounds[1]
        if not table:
            return "bounds[1]: an empty table by arch"
        for gate, value in table.items():
            if not ARCH_GATE.match(gate):
                return f"bounds[1]: gate {gate!r} is not of the form sm_NN+ (the value from that arch on)"
            if value < 1:
                return f"bounds[1]: min_blocks {value} for {gate} (at least 1)"
        lowest, built = min(map(_cc, table)), min(map(_cc, module.arch + module.check_arch))
        if lowest > built:
            return (
                f"bounds[1]: no entry covers sm_{built}, which the module builds for "
                f"(start the table at sm_{built}+ or lower)"
            )
    return None


def _cc(gate: str) -> int:
    """The compute capability (major * 10 + minor) of a gate already checked: sm_NN, sm_NNa or sm_NN+."""
    m = re.match(r"sm_([0-9]+)", gate)
    assert m is not None
    return int(m.group(1))


def _param_problem(p: Param) -> str | None:
    if not IDENT.match(p.name):
        return f"parameter {p.name!r} is not a C identifier (the wrapper declares it)"
    if p.ctype is not None and (len(p.ctype) > MAX_BODY or not QUALIFIED.match(p.ctype)):
        return f"parameter {p.name!r}: ctype {p.ctype!r} is not a qualified C name"
    if p.type == "bytes" and p.ctype is None:
        return f"bytes parameter {p.name!r} needs ctype, the by-value type the wrapper passes (e.g. mf::TmaDesc)"
    return None


def entry_point(fam: Family, sym: Symbol) -> str | None:
    """What the composed program gets for a symbol: its generated wrapper, its family's macro call
    ``MACRO(symbol, args...)``, or None where the sources define it literally."""
    if fam.body is not None:
        return wrapper_text(fam, sym.name, sym.params_env, sym.threads)
    if fam.instantiate:
        return f"{fam.instantiate}({', '.join([sym.name, *sym.macro_args])})"
    return None


def wrapper_text(fam: Family, name: str, env: dict[str, int | str], threads: int) -> str:
    """The extern "C" wrapper of symbol `name` (instance `env`, `threads` per launched block) of a family whose
    declaration passed `family_problem`. Raises WrapperError naming what does not resolve for this symbol."""
    assert fam.body is not None and fam.bounds is not None
    params = ", ".join(_c_param(p, env) for p in fam.params)
    args = ", ".join(p.name for p in fam.params)
    return (
        f'extern "C" __global__ void {_launch_bounds(fam.bounds, env, threads)}{name}({params}) {{\n'
        f"  {_body(fam.body, env)}({args});\n}}"
    )


def _c_param(p: Param, env: dict[str, int | str]) -> str:
    if p.type == "bytes":
        return f"const __grid_constant__ {p.ctype} {p.name}"
    if p.type != "ptr":
        return f"{SCALAR_CTYPES[p.type]} {p.name}"
    elem = p.ctype
    if elem is None:
        token = env.get(p.dtype, p.dtype) if p.dtype is not None else None
        if not isinstance(token, str) or token not in DTYPES:
            raise WrapperError(
                f"parameter {p.name!r}: dtype {p.dtype!r} is neither a dtype token nor an instance "
                f"key naming one (tokens: {', '.join(DTYPES)})"
            )
        elem = DTYPES[token][0]
    return f"{'const ' if p.role == 'in' else ''}{elem}* __restrict__ {p.name}"


def _body(body: str, env: dict[str, int | str]) -> str:
    m = BODY.match(body)
    assert m is not None  # family_problem
    if m.group(2) is None:
        return m.group(1)
    out = []
    for arg in (a.strip() for a in m.group(2).split(",")):
        if arg in env:
            out.append(c_token(arg, env[arg]))
        elif arg in DTYPES:
            out.append(DTYPES[arg][0])
        elif IDENT.match(arg) and arg not in ("true", "false"):
            raise WrapperError(
                f"body {body!r}: template argument {arg!r} is neither an instance key (have "
                f"{sorted(env)}), a dtype token, true/false, an integer nor a qualified name"
            )
        else:
            out.append(arg)
    return f"{m.group(1)}<{', '.join(out)}>"


def _launch_bounds(bounds: list, env: dict[str, int | str], threads: int) -> str:
    if not bounds:
        return ""
    num_env = {k: v for k, v in env.items() if isinstance(v, int)}
    try:
        most = int(expr.evaluate(bounds[0], num_env))
        if most < threads:
            raise WrapperError(f"bounds[0] = {most} threads, fewer than the launch's block of {threads}")
        parts = [str(most)]
        if len(bounds) == 2:
            parts.append(_min_blocks(bounds[1], num_env))
    except expr.ExprError as exc:
        raise WrapperError(f"bounds: {exc}") from None
    return f"__launch_bounds__({', '.join(parts)}) "


def _min_blocks(entry: int | str | dict[str, int], num_env: dict[str, int]) -> str:
    if not isinstance(entry, dict):
        value = int(expr.evaluate(entry, num_env))
        if value < 1:
            raise WrapperError(f"bounds[1] = {value} min blocks (at least 1)")
        return str(value)
    # newest gate first; the oldest is the default (family_problem: it covers every arch the module builds)
    gates = sorted(((_cc(g), v) for g, v in entry.items()), reverse=True)
    text = str(gates[-1][1])
    for cc, value in reversed(gates[:-1]):
        text = f"__CUDA_ARCH__ >= {cc * 10} ? {value} : {text}"
    return f"({text})" if len(gates) > 1 else text
