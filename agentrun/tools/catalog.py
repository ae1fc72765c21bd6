"""The tool port: what a tool declares (`ToolSpec`), how it is called (`Tool`), the catalog.

What belongs here: the types every tool and the tool runner share, and the catalog that maps
names to tools and renders their OpenAI `tools=[...]` definitions. What does not: argument
validation (the runtime checks arguments against `ToolSpec.parameters` with jsonschema before
`run` is called), budgets, effect ledgers and result formatting for the model (the worker).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from agentrun.kernel.faults import ToolFault

__all__ = ["Catalog", "Tool", "ToolContext", "ToolError", "ToolSpec", "object_schema"]

Effect = Literal["read", "idempotent", "write"]
"""``read``: no side effects. ``idempotent``: a side effect that repeating with the same
idempotency key does not repeat. ``write``: a side effect that must happen at most once."""


class ToolError(Exception):
    """An expected tool failure whose message the model should see as the call's result.

    ``fault`` says who caused it (``kernel.ToolFault``): by default ``domain`` (the tool
    refused the input; the model can correct itself). A tool raises it with an
    infrastructure fault (``timeout``, ``connection``, ``server``, ``transport``) when its
    backend could not be reached or failed: the runner may retry such a call, and a tool that
    keeps failing so across turns ends the run ``tool_unavailable``.

    Any other exception from `Tool.run` is a bug in the tool; the runner reports it as an
    error result too (fault ``crashed``), but without trusting its text.

    ``unsent`` says the request is known never to have reached the tool's backend (the
    connection could not be opened, the server refused the request unread). An
    infrastructure failure of a ``write`` call that is not known to be unsent may have done
    its effect: the runner reports it as ``effect_unknown`` (the run ends so) instead of letting
    the model call it again.
    """

    def __init__(
        self, message: str, *, fault: ToolFault = ToolFault.DOMAIN, unsent: bool = False
    ) -> None:
        super().__init__(message)
        self.message = message
        self.fault = fault
        self.unsent = unsent


def object_schema(
    properties: Mapping[str, Mapping[str, Any]], *, required: Iterable[str]
) -> dict[str, Any]:
    """The JSON Schema of a tool's arguments object: these `properties`, no others.

    `required` names the properties the model must give; unknown ones are refused
    (``additionalProperties: false``), so a misspelt argument is a validation error the
    model reads, not a silently ignored value.
    """
    return {
        "type": "object",
        "properties": {name: dict(schema) for name, schema in properties.items()},
        "required": list(required),
        "additionalProperties": False,
    }


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a tool declares to the model and to the runtime."""

    name: str
    """Function name the model calls; OpenAI allows ``^[a-zA-Z0-9_-]{1,64}$``."""
    description: str
    """Shown to the model: what the tool does, its limits and its errors."""
    parameters: Mapping[str, Any]
    """JSON Schema (Draft 2020-12) of the arguments object; treat as read-only."""
    effect: Effect
    """`read` has no side effects (infrastructure failures are retried); `idempotent` and
    `write` calls get an idempotency key; a `write` call is never re-sent."""
    pollable: bool
    """True if calling again with the same arguments may legitimately give a new answer
    (observing changing state), which exempts it from the no-progress detector (which ends a
    run that repeats the same call with the same result)."""
    timeout: float | None = None
    """Seconds one call may take in all, its retries included (an MCP server's declared call
    timeout); ``None``: the worker's call timeout."""

    def as_openai_tool(self) -> dict[str, Any]:
        """The function tool definition of the Chat Completions API (a fresh copy).

        Shape: ``{"type": "function", "function": {"name", "description", "parameters"}}``
        (https://platform.openai.com/docs/api-reference/chat/create#chat-create-tools).
        """
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(dict(self.parameters)),
            },
        }


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Who is calling: passed to every `Tool.run`."""

    namespace: str
    """The AgentRun's namespace; tools that touch the cluster stay inside it."""
    run_name: str
    run_uid: str
    call_id: str
    """The (re-keyed, unique) tool call id of this call."""
    kube: Any | None = None
    """A kubernetes_asyncio `ApiClient`, or None when the worker has no cluster access."""


class Tool(Protocol):
    """A callable tool. Implementations must not crash on arguments valid for their schema."""

    @property
    def spec(self) -> ToolSpec:
        """The tool's declaration."""
        ...

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        """Run once with schema-valid `arguments`; returns the result text for the model.

        Raises ToolError for an expected failure the model should read.
        """
        ...


class Catalog(Mapping[str, Tool]):
    """An immutable name → tool mapping."""

    def __init__(self, tools: Iterable[Tool]) -> None:
        """Raises ValueError if two tools share a name."""
        by_name: dict[str, Tool] = {}
        for tool in tools:
            name = tool.spec.name
            if name in by_name:
                raise ValueError(f"two tools are named {name!r}")
            by_name[name] = tool
        self._tools = by_name

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def specs(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """OpenAI `tools=[...]` for `names` in the order given (all tools when None).

        Duplicate names are listed once. Raises KeyError naming the unknown tools and the
        available ones (an AgentRun asking for a tool this worker lacks: `tool_unavailable`).
        """
        wanted = list(dict.fromkeys(self._tools if names is None else names))
        unknown = [n for n in wanted if n not in self._tools]
        if unknown:
            raise KeyError(f"unknown tools {unknown}; available: {sorted(self._tools)}")
        return [self._tools[n].spec.as_openai_tool() for n in wanted]
