"""A launch contract's expressions (grid, shapes, scalar values) compiled into one Python function.

Each expression is validated by mamba_forge.core.expr's parser (integer arithmetic, names and the catalog's
functions only; imported lazily so the loader's import stays light), may name only the symbol's dims and
constants, and is compiled from a private copy of its AST: dims become the function's positional parameters,
constants literals, calls the catalog's own functions (so compiled and interpreted values agree). The function
runs with no builtins. Standard library only.
"""

from __future__ import annotations

import ast

from mamba_forge.runtime.errors import LaunchRefused


class _Slots(ast.NodeTransformer):
    """Dims -> the evaluator's positional names, constants -> literals, catalog functions -> their bindings."""

    def __init__(self, slot: dict[str, str], constants: dict[str, int]):
        self.slot, self.constants = slot, constants

    def visit_Call(self, node: ast.Call) -> ast.Call:
        node.args = [self.visit(a) for a in node.args]  # the callee's Name is not a dim
        node.func = ast.Name(id=f"_f_{node.func.id}", ctx=ast.Load())  # type: ignore[attr-defined]
        return node

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if node.id in self.slot:
            return ast.Name(id=self.slot[node.id], ctx=ast.Load())
        return ast.Constant(value=self.constants[node.id])


def compile_expressions(symbol: str, exprs: list[str], dims: tuple[str, ...], constants: dict[str, int]):
    """(function of the dims in order -> tuple of every expression's value, its source), from the validated ASTs."""
    from mamba_forge.core import expr  # lazily: the loader's import stays light

    slots = _Slots({d: f"_d{i}" for i, d in enumerate(dims)}, constants)
    parts = []
    for text in exprs:
        try:
            unknown = expr.names(text) - set(dims) - set(constants)  # validates: only the catalog's grammar
        except expr.ExprError as exc:
            raise LaunchRefused(f"{symbol}: the recorded contract has a bad expression: {exc}") from None
        if unknown:
            raise LaunchRefused(f"{symbol}: expression {text!r} names {sorted(unknown)}, "
                                f"neither dims {list(dims)} nor constants {sorted(constants)}")
        tree = ast.parse(text, mode="eval")  # a private copy: core.expr caches its own trees
        parts.append(f"({ast.unparse(slots.visit(tree.body))})")
    src = f"def _evaluate({', '.join(slots.slot.values())}):\n    return ({', '.join(parts)},)\n"
    # the catalog's own functions, so compiled and interpreted values agree; no builtins reachable
    namespace = {"__builtins__": {}, **{f"_f_{k}": f[0] for k, f in expr.FUNCTIONS.items()}}
    exec(compile(src, f"<contract {symbol}>", "exec"), namespace)  # noqa: S102 - validated grammar only
    return namespace["_evaluate"], src


def literal(text: str, symbol: str) -> int | float | None:
    """A value expression without names, as its number; None when it names something."""
    from mamba_forge.core import expr

    try:
        return None if expr.names(text) else expr.evaluate(text, {})
    except expr.ExprError as exc:
        raise LaunchRefused(f"{symbol}: the recorded contract has a bad value expression: {exc}") from None


__all__ = ["compile_expressions", "literal"]
