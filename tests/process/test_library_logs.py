"""What a tenant's peer makes a library log is bounded per process (``process.LibraryLogBound``):
the MCP SDK logs a line per odd message a tool server sends (see
``tests/tools/test_server_streams.py`` for one served for real)."""

from __future__ import annotations

import io
import logging

from agentrun import process


def handler_at(clock: list[float]) -> tuple[logging.Logger, io.StringIO]:
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    handler.addFilter(process.LibraryLogBound(per_minute=3, chars=50, clock=lambda: clock[0]))
    logger = logging.getLogger("mcp.client.test_library_logs")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, written


def test_lines_pass_a_few_a_minute_and_say_how_many_were_dropped() -> None:
    clock = [0.0]
    logger, written = handler_at(clock)
    for n in range(10):
        logger.warning("Unknown SSE event: %s", f"e{n}")
    clock[0] = 61.0
    logger.warning("next minute")
    lines = written.getvalue().splitlines()
    assert lines[:3] == ["Unknown SSE event: e0", "Unknown SSE event: e1", "Unknown SSE event: e2"]
    assert lines[3].startswith("next minute [7 earlier line(s)")
    assert len(lines) == 4


def test_a_line_is_cut_and_its_traceback_left_out() -> None:
    logger, written = handler_at([0.0])
    try:
        raise ValueError("x" * 10_000)
    except ValueError:
        logger.exception("Error parsing SSE message")
    (line,) = written.getvalue().splitlines()
    assert line.startswith("Error parsing SSE message (ValueError: xxx") and len(line) == 50


def test_other_lines_pass_untouched() -> None:
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    handler.addFilter(process.LibraryLogBound(per_minute=0, chars=5))
    record = logging.LogRecord("agentrun.worker", logging.INFO, "", 0, "a long line", (), None)
    assert handler.filter(record)
    assert record.getMessage() == "a long line"
