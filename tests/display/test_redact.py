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


def test_the_values_remembered_are_the_most_recently_read_and_bounded() -> None:
    known = display.Redactor(limit=2)
    first, second, third = ("tok-first-0001", "tok-second-002", "tok-third-0003")
    known.add(first)
    known.add(second)
    known.add(first)  # read again: the most recent now
    known.add(third)  # past the limit: the one read least recently goes
    shown = known.redact(f"{first} {second} {third}")
    assert shown == f"{display.REDACTED} {second} {display.REDACTED}"


def test_a_tenant_changing_its_secret_values_without_end_grows_nothing_past_the_limit() -> None:
    known = display.Redactor(limit=8)
    for n in range(1_000):
        known.add(f"header-value-{n:06d}")
    everything = known.redact(" ".join(f"header-value-{n:06d}" for n in range(1_000)))
    assert everything.count(display.REDACTED) == 8  # only the 8 read last are remembered
    assert known.redact("header-value-000999") == display.REDACTED
    assert known.redact("header-value-000991") == "header-value-000991"  # forgotten
    assert display.SECRETS_KEPT >= 256  # enough for every value in use on a large install
