"""``agentrun check`` prints a run's end: its message holds what a model endpoint or a tool
server said (a provider's error), which must not steer the terminal of whoever reads it."""

from __future__ import annotations

import pytest

from agentrun.cli import check


def test_the_message_of_a_run_is_printed_without_terminal_controls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    message = "HTTP 400: \x1b]0;owned\x07\x1b[2J\rok\u202e\nsecond line"
    status = {"phase": "Failed", "terminalReason": "model_error", "message": message}
    assert check._report("r1", status, expect="completed") == 1
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "\u202e" not in out and "\x07" not in out
    assert "message: HTTP 400: \\x1b]0;owned\\x07\\x1b[2J\\x0dok\\u202e\\nsecond line" in out
