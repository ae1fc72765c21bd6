"""What a tenant's peer makes a library log is bounded per peer and per process
(``process.LibraryLogBound``): the MCP SDK logs a line per odd message a tool server sends (see
``tests/tools/test_server_streams.py`` for one served for real, and
``tests/tools/test_mcp_sessions.py`` for two)."""

from __future__ import annotations

import io
import logging
import re

from agentrun import display, peers, process


def handler_at(
    clock: list[float], *, ceiling: int = 100, max_peers: int = 8
) -> tuple[logging.Logger, io.StringIO]:
    """A logger of the SDK's whose lines pass 3 a minute per peer, ``ceiling`` in all."""
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    bound = process.LibraryLogBound(
        per_minute=3, ceiling=ceiling, max_peers=max_peers, chars=50, clock=lambda: clock[0]
    )
    handler.addFilter(bound)
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


def test_a_line_stays_one_line() -> None:
    """A peer's words (a validation error quoting them, over several lines) never start a line
    of their own."""
    logger, written = handler_at([0.0])
    try:
        raise ValueError("1 error\nINFO x: forged")
    except ValueError:
        logger.warning("Invalid", exc_info=True)
    (line,) = written.getvalue().splitlines()
    assert line == "Invalid (ValueError: 1 error\\nINFO x: forged)"


def test_the_sdk_client_sessions_own_logger_is_bounded() -> None:
    """``mcp.client.session`` logs as ``client`` (each notification it cannot validate)."""
    bound = process.LibraryLogBound(per_minute=1, clock=lambda: 0.0)
    records = [
        logging.LogRecord(name, logging.WARNING, "", 0, "Failed to validate", (), None)
        for name in ("client", "client", "clientele")
    ]
    assert [bound.filter(record) for record in records] == [True, False, True]


def test_other_lines_pass_untouched() -> None:
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    handler.addFilter(process.LibraryLogBound(per_minute=0, chars=5))
    record = logging.LogRecord("agentrun.worker", logging.INFO, "", 0, "a long line", (), None)
    assert handler.filter(record)
    assert record.getMessage() == "a long line"


def flood(logger: logging.Logger, peer: str, lines: int) -> None:
    """``lines`` lines logged while serving tool server ``peer`` of namespace ``ns``."""
    with peers.serving("ns", peer):
        for n in range(lines):
            logger.warning("Unknown SSE event: %s", f"{peer}{n}")


def test_one_peer_spending_its_budget_does_not_silence_another() -> None:
    clock = [0.0]
    logger, written = handler_at(clock)
    flood(logger, "hostile", 100)
    flood(logger, "quiet", 2)
    logger.warning("serving no peer")
    lines = written.getvalue().splitlines()
    assert lines == [
        "Unknown SSE event: hostile0 [peer ns/hostile]",
        "Unknown SSE event: hostile1 [peer ns/hostile]",
        "Unknown SSE event: hostile2 [peer ns/hostile]",
        "Unknown SSE event: quiet0 [peer ns/quiet]",
        "Unknown SSE event: quiet1 [peer ns/quiet]",
        "serving no peer",
    ]


def test_the_next_line_of_a_peer_names_it_and_its_dropped_lines() -> None:
    clock = [0.0]
    logger, written = handler_at(clock)
    flood(logger, "hostile", 10)
    flood(logger, "quiet", 1)
    clock[0] = 61.0
    flood(logger, "hostile", 1)
    lines = written.getvalue().splitlines()
    assert lines[3] == "Unknown SSE event: quiet0 [peer ns/quiet]"
    assert lines[4] == (
        "Unknown SSE event: hostile0 [peer ns/hostile] [7 earlier line(s) of peer ns/hostile "
        "dropped]"
    )


def test_the_process_ceiling_holds_over_every_peer() -> None:
    logger, written = handler_at([0.0], ceiling=5)
    for peer in ("a", "b", "c"):
        flood(logger, peer, 3)
    lines = written.getvalue().splitlines()
    assert len(lines) == 5
    assert lines[-1] == "Unknown SSE event: b1 [peer ns/b]"


def test_the_table_of_peers_stays_bounded_and_forgotten_drops_are_said() -> None:
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    bound = process.LibraryLogBound(per_minute=1, ceiling=10_000, max_peers=4, clock=lambda: 0.0)
    handler.addFilter(bound)
    logger, _ = handler_at([0.0])
    logger.handlers[:] = [handler]
    for n in range(1_000):
        flood(logger, f"s{n}", 2)  # one line passes, one is dropped
        assert bound.tracked <= 4
    flood(logger, "last", 1)
    lines = written.getvalue().splitlines()
    assert len(lines) == 1_001
    said = re.findall(r"\[(\d+) line\(s\) of peers no longer tracked dropped\]", "".join(lines))
    # every evicted peer's one dropped line is said; the three peers still tracked keep theirs
    assert sum(map(int, said)) == 1_000 - 3
    assert lines[-1] == (
        "Unknown SSE event: last0 [peer ns/last] [1 line(s) of peers no longer tracked dropped]"
    )


def test_a_secret_the_process_read_is_out_of_every_line_before_it_is_cut() -> None:
    """Every process's handlers (``process.start``: ``bound_library_logs``) take the Secret
    values it read out of each line, a library's line before it is cut to its bound: a value
    the cut split would no longer be found whole, and its first part would be written."""
    secret = "hdr-0123456789abcdef-SECRET"
    display.KNOWN.add(secret)
    written = io.StringIO()
    handler = logging.StreamHandler(written)
    process.bound_library_logs(handler)
    logger = logging.getLogger("mcp.client.test_library_logs_secret")
    logger.handlers[:] = [handler]
    logger.propagate = False
    preamble = "p" * (process.LIBRARY_LINE_CHARS - 30)  # the secret across the cut
    logger.warning("Unknown SSE event: %s %s", preamble, secret)
    logging.getLogger("agentrun.test_library_logs_secret").addHandler(handler)
    try:
        logging.getLogger("agentrun.test_library_logs_secret").error("refused %s", secret)
    finally:
        logging.getLogger("agentrun.test_library_logs_secret").removeHandler(handler)
    lines = written.getvalue().splitlines()
    assert len(lines) == 2
    assert secret[:8] not in lines[0] and lines[0].startswith("Unknown SSE event: ppp")
    assert lines[1] == "refused [redacted]"
