"""calculate: exact arithmetic by Python's rules, bounded, and never eval."""

from __future__ import annotations

import pytest

from agentrun import tools
from agentrun.tools import calculate

CTX = tools.ToolContext(namespace="ns", run_name="run", run_uid="uid", call_id="call_0_0")

RESULTS = {
    "int-product": ("3*4", "12"),
    "parentheses": ("2*(3+4)", "14"),
    "precedence": ("2+3*4", "14"),
    "true-division": ("7/2", "3.5"),
    "integral-division-drops-dot-zero": ("24/2", "12"),
    "floor-division": ("7//2", "3"),
    "negative-floor-division": ("-7//2", "-4"),
    "modulo-takes-divisor-sign": ("-7%3", "2"),
    "power": ("2**10", "1024"),
    "power-binds-tighter-than-unary-minus": ("-2**2", "-4"),
    "negative-exponent": ("2**-2", "0.25"),
    "floats": ("0.1+0.2", "0.30000000000000004"),
    "unary-plus-and-minus": ("+-+3", "-3"),
    "whitespace": ("  ( 1 + 2 ) * 3 ", "9"),
    "underscored-literal": ("1_000*3", "3000"),
    "scientific-literal": ("1.5e3+1", "1501"),
    "big-but-bounded-int": ("2**1000", str(2**1000)),
    "huge-float-kept-in-e-notation": ("1e20*10", "1e+21"),
    "deep-nesting": ("(" * 90 + "1" + ")" * 90, "1"),
    "many-unary-minus": ("-" * 150 + "1", "1"),
}

ERRORS = {
    "division-by-zero": ("1/0", "division by zero"),
    "floor-division-by-zero": ("1//0", "division by zero"),
    "modulo-by-zero": ("5%0", "division by zero"),
    "zero-to-negative-power": ("0**-1", "division by zero"),
    "syntax": ("3*", "invalid expression"),
    "empty": ("", "invalid expression"),
    "unbalanced": ("(1+2", "invalid expression"),
    "names": ("x+1", "unsupported element Name"),
    "calls": ("__import__('os')", "unsupported element Call"),
    "attributes": ("(1).real", "unsupported element Attribute"),
    "strings": ("'a'*3", "unsupported literal"),
    "booleans": ("True+1", "unsupported literal"),
    "complex": ("1j*1j", "unsupported literal"),
    "comparison": ("1<2", "unsupported element Compare"),
    "bitwise": ("1<<2", "unsupported element BinOp"),
    "power-too-large": ("9**999999", "too large"),
    "product-too-large": ("(2**1000)*(2**1000)", "too large"),
    "float-overflow": ("1e308*10", "too large"),
    "float-power-overflow": ("1.5**100000", "too large"),
    "infinite-literal": ("1e999", "too large"),
    "complex-result": ("(-8)**0.5", "not a real number"),
    "too-long": ("1+" * 100 + "1", "longer than 200"),
    "null-byte": ("1\x00", "invalid expression"),
}


@pytest.mark.parametrize(("expression", "expected"), RESULTS.values(), ids=RESULTS.keys())
async def test_calculates_exactly(expression: str, expected: str) -> None:
    assert await calculate.Calculate().run({"expression": expression}, CTX) == expected


@pytest.mark.parametrize(("expression", "message"), ERRORS.values(), ids=ERRORS.keys())
async def test_refuses_with_a_message_for_the_model(expression: str, message: str) -> None:
    with pytest.raises(tools.ToolError) as caught:
        await calculate.Calculate().run({"expression": expression}, CTX)
    assert message in caught.value.message


def test_is_a_read_only_tool_that_is_not_pollable() -> None:
    assert (calculate.SPEC.effect, calculate.SPEC.pollable) == ("read", False)
