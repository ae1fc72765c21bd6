"""Where the events of an event stream (``text/event-stream``) end, found chunk by chunk as the
bytes arrive: what ``endpoint.BoundedStream`` counts and divides every event stream by (a
model's answer, a tool server's answer and its own stream, an SSE session's paced stream).

The rule is the one the parsers that read those streams follow (the ``openai`` client's
decoder; ``httpx2``'s, which the MCP SDK reads through), the WHATWG HTML standard's for
server-sent events: a line ends at a CR LF pair, at an LF not after a CR, or at a CR ("Parsing
an event stream"); an empty line dispatches the event ("Interpreting an event stream"). So an
event ends at the byte that ends an empty line: an LF or a CR right after an LF, or a CR right
after a CR (an LF right after a CR is the second byte of its pair, not a line end) — in
``\\n\\n``, ``\\n\\r``, ``\\r\\r``, and so in ``\\r\\n\\r\\n``, ``\\r\\n\\r``, ``\\r\\n\\n`` —
whatever the chunks the stream arrives in. The stream's start counts as the end of a line (an
empty first line ends an event that holds nothing, which the parsers drop: the count errs high
by that one); a leading byte order mark, which the standard drops and the parsers keep, is
part of the first line. An event's bytes run to the byte that ends its empty line; the LF of
a CR LF pair there starts the next event's, however the stream is cut.

What does not belong here: the bounds and reading the body (``endpoint``). Pure: no I/O.
"""

from __future__ import annotations

__all__ = ["EMPTY_LINE_ENDS", "EventEnds"]

EMPTY_LINE_ENDS = (b"\n\n", b"\n\r", b"\r\r")
"""The byte pairs whose second byte ends an empty line: the first is the end of the line
before (an LF, or a lone CR)."""


class EventEnds:
    """The events that end in each chunk of one event stream, the chunks fed in order
    (``feed``). Each chunk costs a few passes of ``bytes`` methods over it (``splitlines``,
    ``find``, ``rfind``), never a Python loop over its bytes or lines."""

    __slots__ = ("_before",)

    def __init__(self) -> None:
        self._before = b"\n"
        """The last byte fed (the start of the stream counts as the end of a line)."""

    def feed(self, chunk: bytes) -> tuple[int, int, int]:
        """``(ended, first, last)`` of the next ``chunk``: how many events end in it;
        ``chunk[:first]`` is the rest of the event that ends first, ``chunk[last:]`` the
        start of the one after the last that ends (both 0 when none ends)."""
        if not chunk:
            return 0, 0, 0
        across = self._before + chunk[:1] in EMPTY_LINE_ENDS
        self._before = chunk[-1:]
        lines = chunk.splitlines()
        # an empty first piece is a line end first in the chunk: ``across`` tells whether
        # that one ends an empty line (or the line of the chunk before, or its CR LF pair)
        ended = lines.count(b"") - (lines[0] == b"") + across
        if not ended:
            return 0, 0, 0
        pairs = EMPTY_LINE_ENDS if b"\r" in chunk else EMPTY_LINE_ENDS[:1]
        inside = [at for at in (chunk.find(pair) for pair in pairs) if at >= 0]
        first = 1 if across else min(inside) + 2
        last = max(chunk.rfind(pair) for pair in pairs) + 2 if inside else 1
        return ended, first, last
