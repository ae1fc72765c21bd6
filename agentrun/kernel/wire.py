"""The wire form of a prompt: the strictest rules OpenAI-compatible servers apply to a request.

What belongs here: ``conform``, the one function that turns the stored conversation into the
messages a request carries. ``plan_turn`` applies it to every prompt the kernel builds (ordinary
turns, corrective turns, no-progress nudges, approval resumes, the summary at a cap); stored
history is never rewritten, so replay, idempotency keys (``<run-uid>:<call-id>``) and spans keep
the model's own call ids. What does not: fitting the context window (``context``).

The rules, each the strictest seen among major providers and servers:

- Roles. One optional ``system`` message, first; then a ``user`` message; after that ``user``
  and ``assistant`` turns alternate, an assistant's ``tool_calls`` answered by ``tool``
  messages right after it. Two ``user`` messages in a row are merged into one (contents joined
  by a blank line; chat templates of Llama, Gemma and Mistral raise "conversation roles must
  alternate"); a ``user`` message right after a ``tool`` message gets a short assistant
  message before it (Mistral's API answers 400 "Unexpected role 'user' after role 'tool'");
  two plain ``assistant`` messages in a row are merged. A ``system`` message anywhere but
  first becomes a ``user`` message.
- Tool results. Every result follows the assistant message that called it, in the order of its
  ``tool_calls``, with matching ids: the kernel stores history so (one result per call, call
  order), and ``conform`` never inserts anything between a call and its results.
- Call ids. Every id is replaced by ``wire_call_id``: 9 characters from ``[a-zA-Z0-9]``
  (Mistral's API answers 400 "Tool call id was … but must be a-z, A-Z, 0-9, with a length of
  9"; Anthropic-compatible servers accept ``^[a-zA-Z0-9_-]+$``; OpenAI any string up to 40
  characters — nine alphanumerics satisfy all). The mapping is a pure function of the stored
  id, so an assistant's call and its result keep matching ids and a prompt's prefix stays the
  same from turn to turn (prompt caches keep working); two stored ids that hash alike in one
  prompt are told apart deterministically, in order of appearance.
- Function names. A name in an assistant's ``tool_calls`` that breaks OpenAI's rule
  ``^[a-zA-Z0-9_-]{1,64}$`` (only a mangled name of an invalid call can) is replaced by
  ``wire_name``; its error result still quotes the name the model wrote.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Sequence

from agentrun.kernel.state import Message

ID_LENGTH = 9
"""Characters of a call id on the wire (Mistral's exact length)."""
ID_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
WIRE_ID = re.compile(r"^[a-zA-Z0-9]{9}$")
"""What every call id on the wire matches."""
WIRE_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""What every function name on the wire matches (OpenAI: "a-z, A-Z, 0-9, underscores and
dashes, with a maximum length of 64")."""
BRIDGE = "[agentrun] Tool results received."
"""The assistant message put between a tool result and a user message that follows it."""


@functools.lru_cache(maxsize=16_384)
def wire_call_id(stored: str, *, salt: int = 0) -> str:
    """The 9-character ``[a-zA-Z0-9]`` id that stands for ``stored`` on the wire.

    Deterministic (SHA-256 of the stored id, and of ``salt`` when it is not 0, in base 62);
    remembered, since every prompt of a run maps its whole history's ids again.
    """
    seed = stored if salt == 0 else f"{stored}\x00{salt}"
    number = int.from_bytes(hashlib.sha256(seed.encode("utf-8", "surrogatepass")).digest()[:8])
    chars = []
    for _ in range(ID_LENGTH):
        number, digit = divmod(number, len(ID_ALPHABET))
        chars.append(ID_ALPHABET[digit])
    return "".join(chars)


def wire_name(name: str) -> str:
    """``name`` if it meets ``WIRE_NAME``, else every other character as ``_``, cut to 64
    characters (``_`` when empty)."""
    if WIRE_NAME.match(name):
        return name
    safe = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "_-") else "_" for ch in name)
    return safe[:64] or "_"


class _Ids:
    """Stored id → wire id for one prompt, unique, assigned in order of appearance."""

    def __init__(self) -> None:
        self.by_stored: dict[str, str] = {}
        self.taken: set[str] = set()

    def __call__(self, stored: str) -> str:
        wire = self.by_stored.get(stored)
        if wire is None:
            salt = 0
            wire = wire_call_id(stored)
            while wire in self.taken:
                salt += 1
                wire = wire_call_id(stored, salt=salt)
            self.by_stored[stored] = wire
            self.taken.add(wire)
        return wire


def _text(message: Message) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _joined(first: str, second: str) -> str:
    return f"{first}\n\n{second}" if first and second else first or second


def _recast(messages: Iterable[Message], ids: _Ids) -> Iterable[Message]:
    """Each message with wire ids and names, and a late ``system`` message as ``user``; a
    message with nothing to change is the stored one itself (never mutated)."""
    for index, message in enumerate(messages):
        role, calls = message.get("role"), message.get("tool_calls")
        late_system = role == "system" and index > 0
        if not (calls or role == "tool" or late_system):
            yield message
            continue
        out = dict(message)
        if late_system:
            out["role"] = "user"
        if calls:
            out["tool_calls"] = [_wire_call(call, ids) for call in calls]
        if role == "tool":
            out["tool_call_id"] = ids(str(out.get("tool_call_id", "")))
        yield out


def _wire_call(call: Message, ids: _Ids) -> dict[str, object]:
    function = call.get("function", {})
    return {
        **call,
        "id": ids(str(call.get("id", ""))),
        "function": {**function, "name": wire_name(str(function.get("name", "")))},
    }


def conform(messages: Sequence[Message]) -> tuple[Message, ...]:
    """``messages`` as a request carries them: roles ordered, ids and names in wire form.

    Shapes: chat-completions messages in, the same shape out; the result has at most one
    message more per ``tool`` → ``user`` boundary and fewer when messages merge. Pure and
    deterministic; never raises for the messages the kernel stores.
    """
    out: list[Message] = []
    for message in _recast(messages, _Ids()):
        role = message.get("role")
        last = out[-1] if out else None
        last_role = last.get("role") if last else None
        if role == "user" and last is not None and last_role == "user":
            out[-1] = {**last, "content": _joined(_text(last), _text(message))}
            continue
        if (
            role == "assistant"
            and last is not None
            and last_role == "assistant"
            and not last.get("tool_calls")
        ):
            merged = {**message, "content": _joined(_text(last), _text(message))}
            out[-1] = merged
            continue
        if role == "user" and last_role == "tool":
            out.append({"role": "assistant", "content": BRIDGE})
        out.append(message)
    return tuple(out)
