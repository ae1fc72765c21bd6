"""``display.secret_parts`` and ``display.Redactor``: a secret is taken out of a text however
it is quoted there — whole, a whitespace-separated part alone (the token of ``Bearer``), or
escaped (``repr`` of ``str`` or ``bytes``, as an HTTP library names an illegal header value;
JSON's escapes in a body an endpoint echoes)."""

from __future__ import annotations

import json

import pytest

from agentrun import display

SECRET = "tok-0123\x1b456789-\u00e9t\u00e9"
"""A value with characters every quoting writes escaped, and a non-ASCII part."""


@pytest.mark.parametrize(
    "quoted",
    [
        SECRET,
        repr(SECRET),
        repr(SECRET.encode()),
        json.dumps(SECRET),
        json.dumps(SECRET, ensure_ascii=False),
        f"Illegal header value {('Bearer ' + SECRET).encode()!r}",
    ],
    ids=["raw", "repr", "bytes", "json", "json-utf8", "header"],
)
def test_a_secret_is_taken_out_however_it_is_quoted(quoted: str) -> None:
    known = display.Redactor()
    known.add(f"Bearer {SECRET}")
    shown = known.redact(f"refused: {quoted}.")
    assert "0123" not in shown and "456789" not in shown, shown
    assert display.REDACTED in shown


def test_a_short_value_is_not_taken_for_a_secret_even_escaped() -> None:
    assert display.secret_parts("ab\ncd") == set()
    assert display.secret_parts("tok-0123456789") == {"tok-0123456789"}
