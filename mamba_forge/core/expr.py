"""A tiny, safe integer expression language for catalog fields (grids, shared memory, shapes).

Catalog entries write sizes as expressions over named values, e.g. ``"ceil_div(rows*cols, 256)"`` or
``"(BM*BK + BK*BN) * S * 2"``. Only integer arithmetic, names and a few functions are allowed: the
catalog is data, never code. Expressions are bounded because a catalog is input from outside: at most
``MAX_LENGTH`` characters and ``MAX_NODES`` syntax nodes, every intermediate value within ``MAX_MAGNITUDE``
(checked before a power or a shift is computed, so ``9**9**9**9`` or ``1 << (1 << 40)`` fail at once), and every
arithmetic error (a zero divisor, ``log2(0)``, a call with the wrong number of arguments) an :class:`ExprError`.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from functools import lru_cache

MAX_LENGTH = 1024  # characters of one expression
MAX_NODES = 1024  # syntax nodes of one expression, operators included (bounds the work per evaluation)
MAX_MAGNITUDE = 1 << 64  # |value| of every intermediate result: sizes, grids and offsets fit 64 bits


def _ceil_div(a, b):
    if b == 0:
        raise ZeroDivisionError("ceil_div by zero")
    return -(-a // b)


def _round_up(a, b):
    if b == 0:
        raise ZeroDivisionError("round_up to a multiple of zero")
    return -(-a // b) * b


def _log2(a):
    if a <= 0:
        raise ValueError(f"log2 of {a}")
    return int(math.log2(a))


def _power(a, b):
    if not isinstance(b, int) or b < 0:
        raise ValueError(f"exponent {b} (only non-negative integer exponents)")
    if abs(a) > 1 and b * math.log2(abs(a)) > 64:
        raise OverflowError(f"{a} ** {b} exceeds 2**64")
    return a**b


def _shift_left(a, b):
    if b < 0 or b > 64:
        raise ValueError(f"shift by {b} (0 to 64)")
    return a << b


def _shift_right(a, b):
    if b < 0:
        raise ValueError(f"shift by {b} (0 or more)")
    return a >> b


# name -> (function, smallest and largest argument count)
FUNCTIONS = {
    "ceil_div": (_ceil_div, 2, 2),
    "min": (min, 1, 16),
    "max": (max, 1, 16),
    "round_up": (_round_up, 2, 2),
    "log2": (_log2, 1, 1),
}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: _power,
    ast.LShift: _shift_left,
    ast.RShift: _shift_right,
}


_DECIMAL = re.compile(r"^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$")  # the only literals the grammar has


class ExprError(ValueError):
    pass


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:77] + "...")


@lru_cache(maxsize=4096)
def _parse(text: str) -> ast.expr:
    if not isinstance(text, str):
        raise ExprError(f"expression {text!r} is not text")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression {_shown(text)} is {len(text)} characters long; the limit is {MAX_LENGTH}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse expression {_shown(text)}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ExprError(f"expression {_shown(text)} is nested too deeply") from None
    nodes = list(ast.walk(tree))
    if len(nodes) > MAX_NODES:
        raise ExprError(f"expression {_shown(text)} has {len(nodes)} terms; the limit is {MAX_NODES}")
    for node in nodes:
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS or node.keywords:
                raise ExprError(f"expression {_shown(text)}: only {sorted(FUNCTIONS)} may be called")
            _, lo, hi = FUNCTIONS[node.func.id]
            if not lo <= len(node.args) <= hi or any(isinstance(a, ast.Starred) for a in node.args):
                want = str(lo) if lo == hi else f"{lo} to {hi}"
                raise ExprError(f"expression {_shown(text)}: {node.func.id}() takes {want} arguments")
        elif isinstance(node, ast.Constant) and not _DECIMAL.match(ast.get_source_segment(text, node) or ""):
            shown = ast.get_source_segment(text, node) or repr(node.value)
            raise ExprError(f"expression {_shown(text)}: literal {_shown(shown)} is not a decimal number "
                            "(the grammar has no hex, octal, binary, underscores, strings or complex numbers)")
        elif not isinstance(
            node,
            (ast.Expression, ast.BinOp, ast.UnaryOp, ast.USub, ast.UAdd, ast.Name, ast.Load, ast.Constant)
            + tuple(_BINOPS),
        ):
            raise ExprError(f"expression {_shown(text)}: {type(node).__name__} is not allowed")
    return tree.body


def names(text: str | int) -> set[str]:
    """The free names an expression refers to."""
    if isinstance(text, int):
        return set()
    funcs = set(FUNCTIONS)
    return {n.id for n in ast.walk(_parse(text)) if isinstance(n, ast.Name) and n.id not in funcs}


def evaluate(text: str | int | float, env: Mapping[str, int | float]) -> int | float:
    """Evaluate an expression over `env`. Integers stay integers (``/`` is refused; use ``//``). Every failure,
    arithmetic included, is an ExprError naming the expression."""
    if isinstance(text, bool):
        raise ExprError(f"expression {text!r} is a bool, not a number")
    if isinstance(text, (int, float)):
        return _bounded(text, str(text))
    tree = _parse(text)

    def ev(node: ast.expr):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise ExprError(f"expression {_shown(text)}: constant {node.value!r} is not a number")
            return _bounded(node.value, text)
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ExprError(f"expression {_shown(text)}: unknown name {node.id!r} (known: {sorted(env)})")
            return _bounded(env[node.id], text)
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise ExprError(f"expression {_shown(text)}: operator {type(node.op).__name__} is not allowed")
            return _bounded(op(ev(node.left), ev(node.right)), text)
        if isinstance(node, ast.Call):
            return _bounded(FUNCTIONS[node.func.id][0](*(ev(a) for a in node.args)), text)
        raise ExprError(f"expression {_shown(text)}: {type(node).__name__} is not allowed")

    try:
        return ev(tree)
    except ExprError:
        raise
    except (ArithmeticError, ValueError, TypeError) as exc:  # ZeroDivisionError and OverflowError included
        raise ExprError(f"expression {_shown(text)}: {exc}") from None


def _bounded(v, text: str):
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ExprError(f"expression {_shown(text)}: {v!r} is not a number")
    if isinstance(v, float) and not math.isfinite(v):
        raise ExprError(f"expression {_shown(text)}: {v} is not finite")
    if abs(v) > MAX_MAGNITUDE:
        raise ExprError(f"expression {_shown(text)}: a value exceeds 2**64")
    return v
