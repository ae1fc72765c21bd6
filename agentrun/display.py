"""Model and tool text made safe to show a person on a terminal.

Text a model or a tool server wrote (answers, arguments, results, provider errors) is
untrusted: printed raw, an escape sequence can recolour, hide or rewrite what a reviewer sees
(CSI ``ESC [ … m``, OSC ``ESC ] … BEL`` titles and hyperlinks, a carriage return that prints
over a line, C1 controls such as the 8-bit CSI ``U+009B``, bidirectional overrides that show
text in another order than it is stored), and characters a terminal draws as nothing carry
text a person does not see but a tool or a model reads (tag characters spelling ASCII,
zero-width characters, variation selectors). ``printable`` neutralises every such character by
writing it as a visible escape (``\\x1b``, ``\\x0d``, ``\\u202e``, ``\\U000e0072``): no
sequence survives, because its introducer no longer is one, and the person sees that
something was there. Newlines and tabs are kept (as ``\\n``/``\\t`` escapes with
``newlines=False``).

Characters neutralised (``NEUTRALISED``): Unicode category Cc — C0 (U+0000–U+001F), DEL
(U+007F) and C1 (U+0080–U+009F), the ECMA-48 control functions —; category Cf, the format
characters, among them the bidirectional formatting characters of Unicode Standard Annex #9
(U+061C, U+200E, U+200F, U+202A–U+202E, U+2066–U+2069), the zero-width characters
(U+200B–U+200D, U+2060, U+FEFF), the soft hyphen and the tag characters (U+E0001,
U+E0020–U+E007F); the line and paragraph separators (Zl, Zp: U+2028, U+2029); and the
variation selectors (U+FE00–U+FE0F, U+E0100–U+E01EF). An emoji joined by U+200D or styled by
U+FE0F is shown with the escape: a reviewer's view is for reading exactly.

What belongs here: that rule, showing a tool call's arguments in full for review
(``arguments_block``), and counting things in words (``counted``). What does not: choosing
what to show (the programs: ``agentrun.cli``, the operator's Events, ``agentrun dev demo``).
Pure, standard library only, so every program (the dev tooling included) can use it.
"""

from __future__ import annotations

import collections
import json
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["NEUTRALISED", "arguments_block", "printable"]

_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp"})
_SELECTORS = (*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0))


def _escape(code: int) -> str:
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


_PLANES = (range(0x20000), range(0xE0000, 0xE1000))
"""Where Unicode puts every Cc, Cf, Zl and Zp character: the basic and supplementary
multilingual planes and the special-purpose plane (scanned at import; not the whole range)."""

NEUTRALISED: frozenset[int] = frozenset(
    [c for plane in _PLANES for c in plane if unicodedata.category(chr(c)) in _INVISIBLE]
    + list(_SELECTORS)
)
"""Code points ``printable`` writes as visible escapes (see the module docstring)."""

_KEEP_LINES = {c: _escape(c) for c in NEUTRALISED if c not in (0x09, 0x0A)}
_ONE_LINE = {**_KEEP_LINES, 0x09: "\\t", 0x0A: "\\n"}


def counted(number: int, noun: str) -> str:
    """``1 step``, ``2 steps``, ``0 steps``: ``number`` and ``noun``, plural (an ``s``)
    unless ``number`` is 1."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` with every character of ``NEUTRALISED`` written as a visible escape
    (``ESC`` → ``\\x1b``, CR → ``\\x0d``, U+202E → ``\\u202e``, a tag character →
    ``\\U000e00xx``); newlines and tabs kept, or
    written as ``\\n``/``\\t`` when ``newlines`` is false (for one-line fields)."""
    return text.translate(_KEEP_LINES if newlines else _ONE_LINE)


def arguments_block(arguments: Mapping[str, Any] | Any) -> str:
    """A tool call's arguments in full, for a person deciding it: JSON indented by two
    spaces with sorted keys, non-ASCII kept readable, then ``printable`` (JSON escapes C0
    controls itself, not DEL, C1, format characters or selectors). A value that is not JSON is shown
    by its ``repr``."""
    try:
        text = json.dumps(arguments, indent=2, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(arguments)
    return printable(text)


REDACTED = "[redacted]"
"""What stands in a text for a secret it would otherwise show."""
MIN_SECRET_CHARS = 8
"""Shorter secrets are not taken out of text (they would match ordinary words)."""


def secret_parts(value: str) -> set[str]:
    """What of a secret ``value`` must not be shown: the value and each whitespace-separated
    part of it (the token of ``Bearer <token>``, which a server may echo alone), those of at
    least ``MIN_SECRET_CHARS`` characters, each also as the texts that quote it escaped
    (``escaped_forms``: an HTTP library refusing a header value shows it as ``bytes``' repr,
    a JSON body with ``\\n`` escapes), which a search for the value itself would miss."""
    parts = {part for part in (value, *value.split()) if len(part) >= MIN_SECRET_CHARS}
    return {form for part in parts for form in escaped_forms(part)}


def escaped_forms(value: str) -> set[str]:
    """``value`` and how it appears quoted inside other text: Python's ``repr`` of it as
    ``str`` and as UTF-8 ``bytes`` (``b'…'``, as h11 and httpx name an illegal header
    value), and JSON's string escapes, each without its quotes."""
    return {
        value,
        repr(value)[1:-1],
        repr(value.encode())[2:-1],
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
    }


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``REDACTED``; pass them longest first
    (``by_length``), so a secret containing another is taken out whole."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, REDACTED)
    return text


def by_length(secrets: Iterable[str]) -> tuple[str, ...]:
    """``secrets`` longest first, as ``redact`` takes them."""
    return tuple(sorted(secrets, key=len, reverse=True))


SECRETS_KEPT = 1_024
"""Secret values a process remembers for its redaction at most: the ones read most recently
(``Redactor.add``). A value still in use is read again within its cache's lifetime and so stays;
a tenant that changes its Secrets' values without end cannot grow the set, nor the work every
log line's redaction does, past this."""


class Redactor:
    """The secret values this process read most recently (model API keys, tool servers' header
    values: a worker's, and the operator's for discovery; at most ``limit``), and ``redact``,
    which takes each out of a text: what an endpoint echoes back in an error (a key quoted in a
    message, a header line) must not reach a status, an Event or a log line, whichever error
    class carried it."""

    def __init__(self, limit: int = SECRETS_KEPT) -> None:
        self.limit = limit
        self._recent: collections.OrderedDict[str, frozenset[str]] = collections.OrderedDict()
        """Each value remembered, least recently read first, with its ``secret_parts``."""
        self._ordered: tuple[str, ...] = ()
        """Every remembered value's parts, longest first, kept as values come and go (every log
        line is redacted)."""

    def add(self, value: str) -> None:
        """Remember what of ``value`` must not be shown (``secret_parts``), as read just now;
        the value read least recently is forgotten past ``limit``."""
        if value in self._recent:
            self._recent.move_to_end(value)
            return
        parts = frozenset(secret_parts(value))
        if not parts:
            return
        self._recent[value] = parts
        while len(self._recent) > self.limit:
            self._recent.popitem(last=False)
        self._ordered = by_length(set().union(*self._recent.values()))

    def redact(self, text: str) -> str:
        """``text`` with every remembered value replaced by ``REDACTED``, longest first."""
        return redact(text, self._ordered)


KNOWN = Redactor()
"""This process's secrets: ``agentrun.kube.secret_values`` adds every value it reads out, a
worker each model key; ``agentrun.process`` takes them out of every log line."""
