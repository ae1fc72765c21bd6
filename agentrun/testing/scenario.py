"""Scripted model scenarios: the YAML format, its parsed form, matching and reply rendering.

Purely computational (no I/O, no aiohttp): `mockllm` reads the files and serves the replies.
What belongs here is everything that decides *what* the mock model answers; what does not is
how it is served (HTTP, recording, fault counters), which lives in `agentrun.testing.mockllm`.

Scenario file format (YAML)::

    scenarios:
      - name: rectangle                 # unique across all loaded files
        match:                          # all given regexes must match; omitted = match anything
          goal: "rectangle"             # re.search in the FIRST user message's text
          system: "calculator"          # re.search in the system (or developer) message text
          last: "reached its budget"    # re.search in the LAST message's text (any role)
        turns:                          # the reply for turn k, where k = the number of
                                        # assistant messages already in the request
          - content: "Let me compute both."         # optional text (null/omitted = null)
            tool_calls:                             # present (even []) => finish_reason tool_calls
              - {name: calculate, arguments: {expression: "3*4"}}   # dict -> JSON text
              - {id: call_x, name: calculate, arguments: '{"expression": 1'}  # str: verbatim
            usage: {prompt_tokens: 120, completion_tokens: 30, cached_tokens: 20}
          - content: "Area 12, perimeter 14."
        after: repeat_last              # past the last turn: repeat_last | error (default)

Per-turn keys: ``content``, ``tool_calls`` (each ``{id?, name, arguments?}``; ``arguments``
defaults to ``{}``), ``refusal`` (string; content stays null unless given), ``finish_reason``
(override; default ``tool_calls`` when the turn has the key ``tool_calls``, else ``stop``),
``usage`` (omitted: estimated as characters/4 of the request messages and of the reply; a
mapping whose missing counts are estimated the same way, ``cached_tokens`` and
``reasoning_tokens`` default 0, ``total_tokens`` defaults to prompt + completion;
``null``: the response carries ``"usage": null``), ``latency_ms`` (sleep before answering),
``fault: {status, times?, retry_after?, body?}`` (answer an error instead: ``times`` omitted
means every request for this turn fails, ``times: N`` means the first N requests of one
conversation for this turn fail and later ones get the reply; ``retry_after`` seconds go in a
``Retry-After`` header; ``body`` a mapping sent as JSON or a string sent as text, default an
OpenAI-shaped error object).

Every string of a reply (content, refusal, tool call ids, names and arguments) may hold the
template ``{turn}``, replaced with k, and ``{request}``, replaced with the request's index in
the server's log (unique per request: a real model's fresh call ids when it is asked again for
a decision it already made). ``arguments`` may also be a list of variants (each a mapping or a
string): request n sends variant n mod len (the same call worded differently, e.g. its keys in
another order). Tool call ids default to ``call_<k>_<index>``; an
explicit ``id`` is sent as written, duplicates included (to reproduce servers that repeat
ids within one response). The first scenario whose ``match`` fits wins; files are read in
the order given.

Response shape: the chat completion object of the OpenAI API reference
(https://platform.openai.com/docs/api-reference/chat/object), as modelled by the `openai`
SDK's `ChatCompletion` / `CompletionUsage` types; error bodies follow
https://platform.openai.com/docs/guides/error-codes (``{"error": {message, type, param,
code}}``).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import yaml

from agentrun.kernel import wire

__all__ = [
    "After",
    "Conversation",
    "Count",
    "Fault",
    "Provider",
    "RequestError",
    "Scenario",
    "ScenarioError",
    "Streaming",
    "ToolCallSpec",
    "Turn",
    "UsageSpec",
    "check_unique",
    "error_body",
    "estimate_tokens",
    "find_scenario",
    "message_text",
    "parse_scenarios",
    "read_conversation",
    "render_chunks",
    "render_completion",
    "select_turn",
]

TURN_TEMPLATE = "{turn}"
REQUEST_TEMPLATE = "{request}"
CHARS_PER_TOKEN = 4
"""The usage estimate's rule of thumb (OpenAI: about 4 characters of English per token)."""


class ScenarioError(ValueError):
    """A scenario document is malformed; the message names the source and the place."""


class RequestError(ValueError):
    """A chat completion request the mock cannot read (answered with HTTP 400)."""


class After(enum.StrEnum):
    """What a scenario does once the conversation is past its last scripted turn."""

    REPEAT_LAST = "repeat_last"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class ToolCallSpec:
    """One scripted tool call."""

    name: str
    """Function name, sent as written (may be a name no tool has, e.g. a mangled one)."""
    arguments: str
    """The `function.arguments` text: JSON-encoded from a mapping, or a raw string."""
    id: str | None = None
    """Explicit call id; None gives `call_<turn>_<index>`."""
    variants: tuple[str, ...] = ()
    """Alternative `arguments` texts: request n sends ``variants[n % len]`` (empty: always
    ``arguments``)."""

    def arguments_for(self, request: int) -> str:
        """The arguments text request number ``request`` sends."""
        return self.variants[request % len(self.variants)] if self.variants else self.arguments


@dataclass(frozen=True, slots=True)
class UsageSpec:
    """Scripted token counts; a None count is estimated from text at chars/4."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    """Reported as `usage.prompt_tokens_details.cached_tokens` (a subset of prompt_tokens)."""
    reasoning_tokens: int = 0
    """Reported as `usage.completion_tokens_details.reasoning_tokens` (OpenAI counts them
    inside completion_tokens; some servers do not)."""
    total_tokens: int | None = None
    """Reported `usage.total_tokens`; None = prompt + completion (servers that count reasoning
    only here report more)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """An HTTP error answered instead of the turn's reply."""

    status: int
    """HTTP status, 400..599."""
    times: int | None = None
    """How many requests per conversation and turn fail; None = all of them."""
    retry_after: float | None = None
    """Seconds for the `Retry-After` header; None = no header."""
    body: Mapping[str, Any] | str | None = None
    """Sent as JSON (mapping) or text (str); None = an OpenAI-shaped error object."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One scripted model reply."""

    content: str | None = None
    tool_calls: tuple[ToolCallSpec, ...] | None = None
    """None = the message has no `tool_calls` key; () = an explicitly empty list (which some
    servers send with ``finish_reason: tool_calls``)."""
    refusal: str | None = None
    reasoning: str | None = None
    """The model's reasoning, sent before its content in ``provider.reasoning_field`` (its
    tokens are counted in ``completion_tokens`` where usage is not scripted)."""
    finish_reason: str | None = None
    """Override; None = `tool_calls` when `tool_calls` is not None, else `stop`."""
    usage: UsageSpec | None = field(default_factory=UsageSpec)
    """None = the response says `"usage": null` (the runtime must then estimate usage)."""
    latency_ms: float = 0.0
    fault: Fault | None = None
    provider: Provider = field(default_factory=lambda: Provider())
    """How the provider behaves: limits, token counting, streaming."""


class Count(enum.StrEnum):
    """How the mock counts tokens where usage is not scripted (and where it honours
    ``max_tokens``)."""

    QUARTER = "quarter"
    """Four characters a token (OpenAI's rule of thumb for English; the default)."""
    CHAR = "char"
    """One token a character: several providers' tokenizers for CJK text."""
    BYTE = "byte"
    """One token a UTF-8 byte: the most any byte-level BPE can count."""

    def tokens(self, text: str) -> int:
        """Tokens of ``text`` in this count."""
        if self is Count.CHAR:
            return len(text)
        if self is Count.BYTE:
            return len(text.encode("utf-8", "surrogatepass"))
        return -(-len(text) // CHARS_PER_TOKEN)

    def total(self, texts: Iterable[str]) -> int:
        """Tokens of ``texts`` together, at least 1 (four characters a token over their
        joined length, as the mock always estimated)."""
        if self is Count.QUARTER:
            return estimate_tokens(sum(len(t) for t in texts))
        return max(1, sum(self.tokens(t) for t in texts))

    def pieces(self, text: str) -> list[str]:
        """``text`` split into its tokens (a byte's token is its whole character)."""
        width = CHARS_PER_TOKEN if self is Count.QUARTER else 1
        return [text[i : i + width] for i in range(0, len(text), width)]


class Streaming(enum.StrEnum):
    """How the mock answers a request with ``stream: true``."""

    SSE = "sse"
    """Server-sent chunks (``chat.completion.chunk``), usage last when asked (the default)."""
    JSON = "json"
    """One ``chat.completion`` JSON body: a server that does not stream."""
    REFUSE = "refuse"
    """HTTP 400 naming ``stream``: a server that refuses streamed requests."""


@dataclass(frozen=True, slots=True)
class Provider:
    """A turn's provider behaviour (the fault modes budgets are tested against)."""

    honor_max_tokens: bool = False
    """``max_tokens: honor`` cuts the reply at the request's ``max_tokens`` (counted with
    ``count``; ``finish_reason: length``); ``ignore`` (the default) sends it whole, as
    providers that ignore the limit do."""
    count: Count = Count.QUARTER
    streaming: Streaming = Streaming.SSE
    stream_usage: bool = True
    """Whether a streamed reply ends with the usage chunk when
    ``stream_options.include_usage`` asks for it."""
    chunk_tokens: int = 1
    """Tokens per streamed content chunk (one, as OpenAI's and llama.cpp's servers send)."""
    chunk_ms: float = 0.0
    """Milliseconds between two streamed chunks."""
    reasoning_field: str = "reasoning_content"
    """Where the turn's ``reasoning`` goes, in the message and its streamed deltas:
    ``reasoning_content`` (DeepSeek, vLLM, llama.cpp), ``reasoning`` (OpenRouter, Groq,
    Ollama) or ``reasoning_details`` (OpenRouter's list of ``reasoning.text`` parts)."""


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named script: which conversations it answers and the reply per turn."""

    name: str
    turns: tuple[Turn, ...]
    goal: re.Pattern[str] | None = None
    """Searched in the first user message; None = any."""
    system: re.Pattern[str] | None = None
    """Searched in the system/developer text; None = any."""
    last: re.Pattern[str] | None = None
    """Searched in the last message's text (e.g. a runtime's summary request); None = any."""
    after: After = After.ERROR


@dataclass(frozen=True, slots=True)
class Conversation:
    """What the mock reads from a request's `messages`."""

    system: str
    """Text of all system/developer messages, joined by newlines ('' if none)."""
    first_user: str | None
    """Text of the first user message; None if there is none."""
    turn: int
    """k: the number of assistant messages in the request."""
    last: str = ""
    """Text of the last message (any role)."""

    def describe(self) -> str:
        """A short human description for error messages."""
        user = "<no user message>" if self.first_user is None else repr(self.first_user[:200])
        return f"first user message {user}, system {self.system[:120]!r}, turn {self.turn}"


# --------------------------------------------------------------------------- parsing

# The document's JSON Schema (Draft 2020-12), in YAML for brevity; checked once at import.
_SCHEMA: Mapping[str, Any] = yaml.safe_load(
    """
$schema: https://json-schema.org/draft/2020-12/schema
type: object
required: [scenarios]
additionalProperties: false
properties:
  scenarios:
    type: array
    items:
      type: object
      required: [name, turns]
      additionalProperties: false
      properties:
        name: {type: string, minLength: 1}
        match:
          type: [object, "null"]
          additionalProperties: false
          properties: {goal: {type: string}, system: {type: string}, last: {type: string}}
        turns: {type: array, minItems: 1, items: {$ref: "#/$defs/turn"}}
        after: {enum: [repeat_last, error]}
$defs:
  count: {type: integer, minimum: 0}
  turn:
    type: object
    additionalProperties: false
    properties:
      content: {type: [string, "null"]}
      refusal: {type: [string, "null"]}
      reasoning: {type: [string, "null"]}
      reasoning_field: {enum: [reasoning_content, reasoning, reasoning_details]}
      finish_reason: {type: string}
      latency_ms: {type: number, minimum: 0}
      tool_calls:
        type: array
        items:
          type: object
          required: [name]
          additionalProperties: false
          properties:
            id: {type: string}
            name: {type: string}
            arguments:
              oneOf:
                - {type: [object, string]}
                - {type: array, minItems: 1, items: {type: [object, string]}}
      usage:
        type: [object, "null"]
        additionalProperties: false
        properties:
          prompt_tokens: {$ref: "#/$defs/count"}
          completion_tokens: {$ref: "#/$defs/count"}
          cached_tokens: {$ref: "#/$defs/count"}
          reasoning_tokens: {$ref: "#/$defs/count"}
          total_tokens: {$ref: "#/$defs/count"}
      max_tokens: {enum: [honor, ignore]}
      count: {enum: [quarter, char, byte]}
      stream: {enum: [sse, json, refuse]}
      stream_usage: {type: boolean}
      chunk_tokens: {type: integer, minimum: 1}
      chunk_ms: {type: number, minimum: 0}
      fault:
        type: object
        required: [status]
        additionalProperties: false
        properties:
          status: {type: integer, minimum: 400, maximum: 599}
          times: {type: integer, minimum: 1}
          retry_after: {type: number, minimum: 0}
          body: {type: [object, string]}
"""
)
jsonschema.Draft202012Validator.check_schema(_SCHEMA)
_VALIDATOR = jsonschema.Draft202012Validator(_SCHEMA)


def parse_scenarios(text: str, *, source: str = "<string>") -> tuple[Scenario, ...]:
    """Parse one scenario YAML document (format in the module docstring).

    Raises ScenarioError naming `source` and the offending path (invalid YAML, schema
    violation, bad regex, duplicate scenario names within the document).
    """
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{source}: not valid YAML: {exc}") from exc
    error = jsonschema.exceptions.best_match(_VALIDATOR.iter_errors(document))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "<document>"
        raise ScenarioError(f"{source}: at {where}: {error.message}")
    scenarios = tuple(_to_scenario(raw, source=source) for raw in document["scenarios"])
    check_unique(scenarios, source=source)
    return scenarios


def check_unique(scenarios: Iterable[Scenario], *, source: str) -> None:
    """Raise ScenarioError if two scenarios share a name (requests name their scenario)."""
    seen: set[str] = set()
    for scenario in scenarios:
        if scenario.name in seen:
            raise ScenarioError(f"{source}: duplicate scenario name {scenario.name!r}")
        seen.add(scenario.name)


def _to_scenario(raw: Mapping[str, Any], *, source: str) -> Scenario:
    name = raw["name"]
    match = raw.get("match") or {}
    try:
        goal = re.compile(match["goal"]) if "goal" in match else None
        system = re.compile(match["system"]) if "system" in match else None
        last = re.compile(match["last"]) if "last" in match else None
    except re.error as exc:
        raise ScenarioError(f"{source}: scenario {name!r}: bad match regex: {exc}") from exc
    return Scenario(
        name=name,
        turns=tuple(_to_turn(t) for t in raw["turns"]),
        goal=goal,
        system=system,
        last=last,
        after=After(raw.get("after", After.ERROR.value)),
    )


def _to_turn(raw: Mapping[str, Any]) -> Turn:
    calls = raw.get("tool_calls")
    usage = raw.get("usage", {})
    fault = raw.get("fault")
    return Turn(
        content=raw.get("content"),
        tool_calls=None if calls is None else tuple(_to_call(c) for c in calls),
        refusal=raw.get("refusal"),
        reasoning=raw.get("reasoning"),
        finish_reason=raw.get("finish_reason"),
        usage=None if usage is None else UsageSpec(**usage),
        latency_ms=float(raw.get("latency_ms", 0)),
        fault=None if fault is None else Fault(**fault),
        provider=Provider(
            honor_max_tokens=raw.get("max_tokens", "ignore") == "honor",
            count=Count(raw.get("count", Count.QUARTER.value)),
            streaming=Streaming(raw.get("stream", Streaming.SSE.value)),
            stream_usage=bool(raw.get("stream_usage", True)),
            chunk_tokens=int(raw.get("chunk_tokens", 1)),
            chunk_ms=float(raw.get("chunk_ms", 0)),
            reasoning_field=str(raw.get("reasoning_field", "reasoning_content")),
        ),
    )


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, separators=(",", ":"))


def _to_call(raw: Mapping[str, Any]) -> ToolCallSpec:
    arguments = raw.get("arguments", {})
    variants = tuple(_arguments_text(a) for a in arguments) if isinstance(arguments, list) else ()
    text = variants[0] if variants else _arguments_text(arguments)
    return ToolCallSpec(name=raw["name"], arguments=text, id=raw.get("id"), variants=variants)


# --------------------------------------------------------------------------- matching


def message_text(content: Any) -> str:
    """The text of a message `content`: a string, or the `text` of its content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def read_conversation(messages: Any) -> Conversation:
    """Read the matching keys from a request's `messages` list.

    Raises RequestError if `messages` is not a non-empty list of objects with a `role`.
    """
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty array")
    system: list[str] = []
    first_user: str | None = None
    assistants = 0
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError("every message must be an object with a string 'role'")
        role = message["role"]
        if role == "assistant" and message.get("content") != wire.BRIDGE:
            assistants += 1  # the runtime's bridge between a tool result and a user note is no turn
        elif role in ("system", "developer"):
            system.append(message_text(message.get("content")))
        elif role == "user" and first_user is None:
            first_user = message_text(message.get("content"))
    last = message_text(messages[-1].get("content"))
    return Conversation(system="\n".join(system), first_user=first_user, turn=assistants, last=last)


def find_scenario(scenarios: Sequence[Scenario], conversation: Conversation) -> Scenario | None:
    """The first scenario whose `goal`, `system` and `last` regexes all match, or None."""
    for scenario in scenarios:
        if scenario.goal is not None and (
            conversation.first_user is None or not scenario.goal.search(conversation.first_user)
        ):
            continue
        if scenario.system is not None and not scenario.system.search(conversation.system):
            continue
        if scenario.last is not None and not scenario.last.search(conversation.last):
            continue
        return scenario
    return None


def select_turn(scenario: Scenario, k: int) -> Turn | None:
    """The scripted turn for conversation turn k; None when past the end with `after: error`."""
    if k < len(scenario.turns):
        return scenario.turns[k]
    if scenario.after is After.REPEAT_LAST:
        return scenario.turns[-1]
    return None


# --------------------------------------------------------------------------- rendering


def estimate_tokens(chars: int) -> int:
    """Tokens for `chars` characters at CHARS_PER_TOKEN, at least 1."""
    return max(1, -(-chars // CHARS_PER_TOKEN))


def _fill(text: str | None, k: str, request: int = 0) -> str | None:
    if text is None:
        return None
    return text.replace(TURN_TEMPLATE, k).replace(REQUEST_TEMPLATE, str(request))


def render_completion(
    turn: Turn,
    *,
    k: int,
    model: str,
    completion_id: str,
    created: int,
    messages: Sequence[Any],
    request: int = 0,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The chat.completion object for `turn` at conversation turn k.

    Shape: OpenAI API reference, "The chat completion object"
    (https://platform.openai.com/docs/api-reference/chat/object): one choice whose message is
    {role: assistant, content, refusal, tool_calls?[{id, type: function, function{name,
    arguments}}]}, `finish_reason`, and `usage` {prompt_tokens, completion_tokens,
    total_tokens, prompt_tokens_details{cached_tokens}} or null. `messages` (the request's)
    is only read when a prompt token count must be estimated. `request` is the request's
    index in the server's log (the ``{request}`` template and argument variants).
    `max_tokens` is the request's; a turn with ``max_tokens: honor`` cuts its reply there.
    """
    ks = str(k)
    count = turn.provider.count
    content = _fill(turn.content, ks, request)
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": _fill(turn.refusal, ks, request),
    }
    out_texts = [content or "", turn.refusal or ""]
    if turn.reasoning:
        field_name = turn.provider.reasoning_field
        message[field_name] = reasoning_value(field_name, turn.reasoning)
        out_texts.append(turn.reasoning)
    if turn.tool_calls is not None:
        calls = []
        for index, spec in enumerate(turn.tool_calls):
            arguments = _fill(spec.arguments_for(request), ks, request) or ""
            name = _fill(spec.name, ks, request) or ""
            call_id = f"call_{ks}_{index}" if spec.id is None else _fill(spec.id, ks, request)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
            out_texts += [arguments, name]
        message["tool_calls"] = calls
    finish = turn.finish_reason or ("tool_calls" if turn.tool_calls is not None else "stop")
    out_tokens = count.total(out_texts)
    limit = max_tokens if turn.provider.honor_max_tokens else None
    if limit is not None and out_tokens > limit:  # cut at max_tokens, as providers do
        message["content"] = "".join(count.pieces(content or "")[:limit])
        message.pop("tool_calls", None)
        finish, out_tokens = "length", limit
    usage = _render_usage(turn.usage, out_tokens=out_tokens, messages=messages, count=count)
    if usage is not None and limit is not None:
        usage["completion_tokens"] = min(usage["completion_tokens"], limit)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }


def _render_usage(
    usage: UsageSpec | None, *, out_tokens: int, messages: Sequence[Any], count: Count
) -> dict[str, Any] | None:
    if usage is None:
        return None
    prompt = usage.prompt_tokens
    if prompt is None:
        prompt = count.total(prompt_texts(messages))
    completion = usage.completion_tokens
    if completion is None:
        completion = out_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion if usage.total_tokens is None else usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


def prompt_texts(messages: Sequence[Any]) -> list[str]:
    """The request's message texts and tool call names and arguments (for estimates)."""
    texts: list[str] = []
    for message in messages:
        texts.append(message_text(message.get("content")))
        for call in message.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                texts += [str(function.get("arguments", "")), str(function.get("name"))]
    return texts


def reasoning_value(field_name: str, text: str) -> Any:
    """``text`` as field ``field_name`` carries it: a string, or for ``reasoning_details``
    a list of one ``reasoning.text`` part (OpenRouter's shape)."""
    if field_name == "reasoning_details":
        return [{"type": "reasoning.text", "text": text, "format": "unknown", "index": 0}]
    return text


def reasoning_text(value: Any) -> str:
    """The text of a ``reasoning_value``."""
    if isinstance(value, list):
        return "".join(str(part.get("text", "")) for part in value)
    return str(value)


def render_chunks(
    completion: Mapping[str, Any], *, provider: Provider, include_usage: bool
) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects a streaming server sends for ``completion``
    (OpenAI API reference, "The chat completion chunk object"): a first chunk with the role,
    the reasoning (if any) then the content in pieces of ``provider.chunk_tokens`` tokens,
    each tool call's id and name then its arguments in pieces, a last chunk with the finish
    reason and, when
    ``include_usage`` and ``provider.stream_usage``, a chunk with empty ``choices`` and the
    usage."""
    choice = completion["choices"][0]
    message = choice["message"]
    base = {k: completion[k] for k in ("id", "created", "model", "system_fingerprint")}
    base["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    step = provider.chunk_tokens
    chunks = [chunk({"role": "assistant", "content": ""})]
    reasoning = message.get(provider.reasoning_field)
    if reasoning:
        text = reasoning_text(reasoning)
        pieces = provider.count.pieces(text)
        chunks += [
            chunk({provider.reasoning_field: reasoning_value(provider.reasoning_field, part)})
            for part in ("".join(pieces[i : i + step]) for i in range(0, len(pieces), step))
        ]
    for key in ("content", "refusal"):
        pieces = provider.count.pieces(message.get(key) or "")
        chunks += [chunk({key: "".join(pieces[i : i + step])}) for i in range(0, len(pieces), step)]
    for index, call in enumerate(message.get("tool_calls") or ()):
        function = call["function"]
        head = {"index": index, "id": call["id"], "type": "function"}
        chunks.append(chunk({"tool_calls": [{**head, "function": {"name": function["name"]}}]}))
        pieces = provider.count.pieces(function["arguments"])
        for i in range(0, len(pieces), step):
            part = {"arguments": "".join(pieces[i : i + step])}
            chunks.append(chunk({"tool_calls": [{"index": index, "function": part}]}))
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage and provider.stream_usage and completion.get("usage") is not None:
        chunks.append({**base, "choices": [], "usage": completion["usage"]})
    return chunks


_ERROR_TYPES = {429: "rate_limit_exceeded", 401: "authentication_error", 404: "not_found_error"}


def error_body(
    message: str, *, status: int, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """An OpenAI-shaped error object {"error": {message, type, param, code}}.

    `type` follows the status as the OpenAI API does: `invalid_request_error` for other 4xx,
    `server_error` for 5xx (https://platform.openai.com/docs/guides/error-codes).
    """
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
