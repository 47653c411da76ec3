"""A tiny, safe integer expression language for catalog fields (grids, shared memory, shapes).

Catalog entries write sizes as expressions over named values, e.g. ``"ceil_div(rows*cols, 256)"`` or
``"(BM*BK + BK*BN) * S * 2"``. Only integer arithmetic, names and a few functions are allowed: the
catalog is data, never code.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from functools import lru_cache

_FUNCS = {
    "ceil_div": lambda a, b: -(-a // b),
    "min": min,
    "max": max,
    "round_up": lambda a, b: -(-a // b) * b,
    "log2": lambda a: int(math.log2(a)),
}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
}


class ExprError(ValueError):
    pass


@lru_cache(maxsize=4096)
def _parse(text: str) -> ast.expr:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse expression {text!r}: {exc.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCS or node.keywords:
                raise ExprError(f"expression {text!r}: only {sorted(_FUNCS)} may be called")
        elif not isinstance(
            node,
            (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Name, ast.Load, ast.Constant)
            + tuple(_BINOPS),
        ):
            raise ExprError(f"expression {text!r}: {type(node).__name__} is not allowed")
    return tree.body


def names(text: str | int) -> set[str]:
    """The free names an expression refers to."""
    if isinstance(text, int):
        return set()
    funcs = set(_FUNCS)
    return {n.id for n in ast.walk(_parse(text)) if isinstance(n, ast.Name) and n.id not in funcs}


def evaluate(text: str | int | float, env: Mapping[str, int | float]) -> int | float:
    """Evaluate an expression over `env`. Integers stay integers (``/`` is refused; use ``//``)."""
    if isinstance(text, (int, float)):
        return text

    def ev(node: ast.expr):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise ExprError(f"expression {text!r}: constant {node.value!r} is not a number")
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ExprError(f"expression {text!r}: unknown name {node.id!r} (known: {sorted(env)})")
            return env[node.id]
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise ExprError(f"expression {text!r}: operator {type(node.op).__name__} is not allowed")
            return op(ev(node.left), ev(node.right))
        if isinstance(node, ast.Call):
            return _FUNCS[node.func.id](*(ev(a) for a in node.args))
        raise ExprError(f"expression {text!r}: {type(node).__name__} is not allowed")

    return ev(_parse(text))
