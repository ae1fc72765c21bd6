"""`calculate`: deterministic, bounded arithmetic on integers and floats.

The expression is parsed with `ast` (never `eval`) and only numbers, parentheses, unary
``+ -`` and binary ``+ - * / // % **`` are accepted. Python semantics apply (``/`` is true
division, ``//`` floors, ``%`` takes the divisor's sign, ``**`` binds tighter than unary minus
on its left: ``-2**2 == -4``). Bounds keep a call cheap: integers up to MAX_INT_BITS bits and
finite floats; anything larger is a ToolError, as are division by zero and bad syntax.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping
from typing import Any

from . import catalog

__all__ = ["SPEC", "Calculate", "evaluate", "format_number"]

MAX_EXPRESSION_CHARS = 200
MAX_INT_BITS = 1024
"""Largest integer magnitude (about 308 decimal digits, the float range)."""

Number = int | float

SPEC = catalog.ToolSpec(
    name="calculate",
    description=(
        "Evaluate an arithmetic expression exactly and return the result, e.g. "
        '"2*(3+4)" -> "14". Supports integers, decimals, parentheses and + - * / // % ** '
        "(/ is true division, // floor division, ** power). No variables or functions. "
        "Fails on division by zero, invalid syntax or results beyond about 1e308."
    ),
    parameters=catalog.object_schema(
        {
            "expression": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_EXPRESSION_CHARS,
                "description": "The arithmetic expression, e.g. (12 + 3) * 4 / 5",
            },
        },
        required=["expression"],
    ),
    effect="read",
    pollable=False,
)

# Lambdas rather than the `operator` module: the repo's operator/ folder shadows it for
# static tools run from the repository root (the folder is installed as agentrun.operator).
_BINARY: Mapping[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
_UNARY: Mapping[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: lambda a: +a,
    ast.USub: lambda a: -a,
}


def evaluate(expression: str) -> Number:
    """The value of `expression` under the rules of the module docstring.

    Raises catalog.ToolError with a message for the model on anything not allowed.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise catalog.ToolError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError) as exc:
        raise catalog.ToolError(f"invalid expression: {getattr(exc, 'msg', exc)}") from None
    return _eval(tree.body)


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise catalog.ToolError(f"unsupported literal {value!r}: only numbers are allowed")
        return _checked(value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise catalog.ToolError("division by zero") from None
        except OverflowError:
            raise catalog.ToolError("result too large") from None
        return _checked(result)
    raise catalog.ToolError(
        f"unsupported element {type(node).__name__}: only numbers, parentheses and "
        "+ - * / // % ** are allowed"
    )


def _check_power(base: Number, exponent: Number) -> None:
    """Refuse a power whose integer result would exceed MAX_INT_BITS before computing it."""
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and abs(base) > 1
        and (abs(base).bit_length() - 1) * exponent > MAX_INT_BITS
    ):
        raise catalog.ToolError("result too large")


def _checked(value: Any) -> Number:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise catalog.ToolError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise catalog.ToolError("result too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise catalog.ToolError("result too large or not a number")
    return value


def format_number(value: Number) -> str:
    """Result text: integers in full; integral floats below 1e16 without ``.0``; other
    floats in Python's shortest round-trip form (``0.1+0.2`` gives ``0.30000000000000004``)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


class Calculate:
    """The `calculate` tool."""

    spec = SPEC

    async def run(self, arguments: Mapping[str, Any], ctx: catalog.ToolContext) -> str:
        """Evaluate ``arguments["expression"]``; returns the number as text."""
        return format_number(evaluate(arguments["expression"]))
