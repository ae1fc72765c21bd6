"""A final answer's Markdown code fence is found in time linear in the answer
(agentrun.kernel.output): the model's text is the tenant's, and a backtracking regex over it
held the GIL, so the event loop waited even when the check ran on a thread."""

from __future__ import annotations

import random
import re
import time

import pytest

from agentrun.kernel import decision, output

RULE = re.compile(r"^\s*```(?:json)?\s*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)
"""The fence as it was written (Python's ``re``): the independent statement of the rule, used
on short texts only."""
PIECES = ["`", "```", "\n", " ", "\t", "json", "js", "x", "{}", "\u00a0", "\u2028", "\x1c", "\r"]
"""What the compared texts are made of: fences, whitespace (Unicode's too), ``json`` and bits
of it, a body."""


def _ruled(text: str) -> str | None:
    match = RULE.match(text)
    return None if match is None else match.group("body")


def test_the_fence_found_is_the_one_the_regular_expression_finds() -> None:
    """20,000 short texts built from fence pieces, each decided as the regex decides it."""
    chance = random.Random(20261207)
    for _ in range(20_000):
        text = "".join(chance.choices(PIECES, k=chance.randrange(12)))
        assert output.fenced_body(text) == _ruled(text), repr(text)


FENCES = {
    "json": ('```json\n{"a": 1}\n```', '{"a": 1}'),
    "spaces": ('  ```\n\n {"a": 1}```  \n', ' {"a": 1}'),
    "two-newlines": ("```json \t\n[1]\n\n```", "[1]\n"),
    "empty": ("```\n```", ""),
    "empty-two": ("```\n\n```", ""),
    "jsonx": ("```jsonx\n1\n```", None),
    "same-line": ("```json 1\n```", None),
    "four": ("```\n1\n````", "1\n`"),
    "open": ("```\n1", None),
    "bare": ("```", None),
}
"""Texts and the body of their fence (``None``: not fenced)."""


@pytest.mark.parametrize(("text", "body"), FENCES.values(), ids=FENCES.keys())
def test_a_fence_holds_what_lies_between_its_lines(text: str, body: str | None) -> None:
    assert output.fenced_body(text) == body == _ruled(text)


CAP = decision.MAX_CONTENT_BYTES
HOSTILE = {
    "unclosed-newlines": "```" + "\n" * CAP,
    "unclosed-json-newlines": "```json" + "\n" * (CAP - 7),
    "newlines-then-text": "```" + "\n" * (CAP - 4) + "x",
    "closed-late": "```" + "\n" * (CAP - 8) + "1\n```",
}


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_an_answer_at_the_cap_is_checked_in_milliseconds(text: str) -> None:
    """128 KiB of newlines after an opening fence took Python's ``re`` about 2 minutes (4.4 s
    for 24,000); a linear pass takes about a millisecond, so 1 s of CPU is far above it."""
    started = time.process_time()
    found = output.output_error(text, {"type": "integer"})
    used = time.process_time() - started
    assert used < 1.0, f"took {used:.2f} s of CPU"
    assert (found is None) == text.endswith("1\n```")
