"""Fit a prompt into the model's context window by eliding old, large observations.

Rule: when the next prompt (plus the output allowance) would exceed ``contextWindow``, replace
the content of the oldest large tool results with a short note, oldest first, until it fits.
The system prompt, the goal and every assistant message stay; no message is removed, so no
tool call is ever separated from its result (OpenAI tool calling requires one result per
call). Applied when building each prompt, never to the stored history, so replay is exact.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from agentrun.kernel.limits import Limits
from agentrun.kernel.state import Message
from agentrun.kernel.usage import CHARS_PER_TOKEN, estimate_tokens

ELIDE_MIN_CHARS = 256
"""Results shorter than this are kept: eliding them saves too little."""


def elided_note(chars: int) -> str:
    """The text that replaces an elided observation."""
    return (
        f"[agentrun: an earlier tool result of {chars} characters was elided to fit the "
        "model's context window; call the tool again if you need it]"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    """The messages to send and their estimated size."""

    messages: tuple[Message, ...]
    tokens: int
    """``estimate_tokens`` of ``messages`` plus the tools."""


def fit_context(
    messages: Sequence[Message], *, limits: Limits, tools: Sequence[Any] = ()
) -> Prompt:
    """``messages`` as sent to the model: unchanged if they fit, else with old results elided.

    The budget is ``limits.context_window - limits.max_output_tokens`` tokens, estimated with
    ``estimate_tokens`` (once). Returns the best effort when even full elision does not fit.
    """
    budget = limits.context_window - limits.max_output_tokens
    total = estimate_tokens(messages, tools)
    if total <= budget:
        return Prompt(tuple(messages), total)
    fitted = list(messages)
    for index, message in enumerate(fitted):
        content = message.get("content")
        if message.get("role") != "tool" or not isinstance(content, str):
            continue
        if len(content) < ELIDE_MIN_CHARS:
            continue
        note = elided_note(len(content))
        fitted[index] = {**message, "content": note}
        total -= (len(content) - len(note)) // CHARS_PER_TOKEN
        if total <= budget:
            break
    return Prompt(tuple(fitted), total)
