"""``AgentToolServer.spec`` as pydantic models, and the names runs give a server's tools.

What belongs here: the shape of an AgentToolServer's spec and its defaults; how a run names a
server's tool (``SERVER/TOOL``) and the function name the model sees for it (``SERVER__TOOL``).
What does not: the status discovery writes (``status``), resolving a run's names at admission
(``resolve``), reading the objects (``store``), discovery itself (``refresher``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import Field, field_validator

from agentrun.tools import remote
from agentrun.tools.endpoint import reserved_header

from ..platform.spec import Duration, DurationField, SpecModel, parse

TOOL_SERVERS = "agenttoolservers"
"""The plural of ``AgentToolServer``."""
REFERENCE = "/"
"""Separates server and tool in ``AgentRun.spec.tools`` (``SERVER/TOOL``)."""


class Effect(enum.StrEnum):
    """``spec.tools[].effect``: what calling the tool does."""

    READ = "read"
    IDEMPOTENT = "idempotent"
    WRITE = "write"


class OfferedTool(SpecModel):
    """``spec.tools[]``: one allowlisted tool."""

    name: str
    effect: Effect = Effect.READ


class SecretName(SpecModel):
    """``spec.headersFrom.secretRef``."""

    name: str


class HeadersFrom(SpecModel):
    """``spec.headersFrom``: the Secret and the keys of it sent as headers (no other key)."""

    secret_ref: SecretName = Field(alias="secretRef")
    keys: tuple[str, ...] = Field(min_length=1)

    @field_validator("keys")
    @classmethod
    def _no_reserved(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        """No key names a header that routes or frames a request (``Host``, ``X-Forwarded-*``,
        ``Content-Length``, …: ``endpoint.reserved_header``)."""
        for key in keys:
            if (why := reserved_header(key)) is not None:
                raise ValueError(f"{key!r} cannot be sent from a Secret: {why}")
        return keys


class Timeouts(SpecModel):
    """``spec.timeouts``."""

    discovery: DurationField = Field(default_factory=lambda: Duration.parse("10s"))
    call: DurationField = Field(default_factory=lambda: Duration.parse("30s"))


class AgentToolServerSpec(SpecModel):
    """``AgentToolServer.spec``. Parse with ``AgentToolServerSpec.of``."""

    url: str
    transport: remote.Transport = remote.Transport.STREAMABLE_HTTP
    headers_from: HeadersFrom | None = Field(default=None, alias="headersFrom")
    timeouts: Timeouts = Field(default_factory=Timeouts)
    refresh_interval: DurationField = Field(
        default_factory=lambda: Duration.parse("5m"), alias="refreshInterval"
    )
    tools: tuple[OfferedTool, ...] = ()

    @classmethod
    def of(cls, spec: Mapping[str, Any] | None) -> AgentToolServerSpec:
        """Parse an AgentToolServer's spec; raises ``SpecError`` naming the field."""
        return parse(cls, spec, where="spec")

    def effect_of(self, tool: str) -> Effect | None:
        """The allowlisted tool's effect, or ``None`` when it is not allowlisted."""
        return next((t.effect for t in self.tools if t.name == tool), None)


def split_reference(name: str) -> tuple[str, str] | None:
    """``("server", "tool")`` for a ``SERVER/TOOL`` name, ``None`` for a built-in tool."""
    if REFERENCE not in name:
        return None
    server, _, tool = name.partition(REFERENCE)
    return server, tool


def function_names(names: Sequence[str]) -> tuple[str, ...]:
    """The names the model (and the kernel) use for ``spec.tools``-style names: built-in names
    unchanged, ``SERVER/TOOL`` as ``SERVER__TOOL``."""
    out = []
    for name in names:
        parts = split_reference(name)
        out.append(name if parts is None else remote.function_name(*parts))
    return tuple(out)
