"""The values that cross NATS between operator and workers: a run's config, a TurnRequest, an
approval. Plain frozen data; their JSON shapes are ``protocol.shapes``."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from agentrun import kernel

DEFAULT_TENANT = "default"
"""The tenant of a run no AgentTenant claims (when the operator is configured to allow it)."""

DEFAULT_RUN_TIMEOUT = "10m"
"""``spec.budget.timeout`` of a run that neither it nor its tenant sets (a duration)."""

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """Seconds of a Go-style duration with units ms, s, m, h (``90s``, ``1h30m``, ``250ms``:
    the CRDs' ``timeout`` fields). Raises ``ValueError`` for anything else (a number alone has
    no unit)."""
    pos, total = 0, 0.0
    for match in _DURATION.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"{text!r} is not a duration like 90s, 10m or 1h30m")
    return total


def duration_text(seconds: float) -> str:
    """``seconds`` (>= 0) to the millisecond as Go's ``time.Duration.String`` writes it, the
    form Kubernetes writes durations in: ``10m0s``, ``1h30m0s``, ``1m30.5s``, ``250ms``,
    ``0s``; ``duration_seconds`` reads it back."""
    millis = round(seconds * 1000)
    if millis < 1000:
        return f"{millis}ms" if millis else "0s"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, frac = divmod(rest, 1000)
    text = f"{whole}.{frac:03d}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


@dataclasses.dataclass(frozen=True, slots=True)
class SecretRef:
    """Where the model's API key lives (``AgentModel.spec.credentials.secretRef``)."""

    name: str
    namespace: str
    key: str = "apiKey"


@dataclasses.dataclass(frozen=True, slots=True)
class ModelConfig:
    """The resolved AgentModel, snapshotted at admission so a run's prices cannot move."""

    name: str
    """The AgentModel object's name."""
    base_url: str
    model: str
    pricing: kernel.Pricing
    context_window: int
    max_output_tokens: int
    secret: SecretRef | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class UrlRule:
    """One URL the ``http_get`` tool may fetch (``AgentTenant.spec.httpGet.allow[]``)."""

    host: str
    """Host name, optionally with ``:port`` (then only that port)."""
    path_prefix: str = "/"
    """The URL's path must start with this."""
    private_network: bool = False
    """Allow private, loopback and link-local addresses for this host."""


@dataclasses.dataclass(frozen=True, slots=True)
class RemoteTool:
    """One tool of an AgentToolServer (a remote MCP server) as admitted for a run: where to
    call it and what the model sees, snapshotted at admission so a run keeps the schemas it
    started with."""

    name: str
    """The function name the model calls (``SERVER__TOOL``), as listed in ``RunConfig.tools``."""
    server: str
    """The AgentToolServer's name (in the run's namespace)."""
    tool: str
    """The tool's own name on the MCP server."""
    description: str
    parameters: Mapping[str, Any]
    """The input JSON Schema the server listed."""
    effect: str
    """``read``, ``idempotent`` or ``write`` (``AgentToolServer.spec.tools[].effect``)."""
    url: str
    transport: str
    """``StreamableHTTP`` or ``SSE``."""
    timeout: float
    """Seconds one call may take (``spec.timeouts.call``)."""
    headers_secret: str | None = None
    """A Secret in the run's namespace whose ``headers_keys`` are sent as HTTP headers."""
    headers_keys: tuple[str, ...] = ()
    """The keys of ``headers_secret`` sent, each as the header of its name (no other key)."""
    private_network: bool = False
    """Whether the server's host may resolve to non-global addresses (the tenant's rule that
    allowed its URL at admission, ``AgentTenant.spec.toolServers.allow[].privateNetwork``)."""
    path_prefix: str = "/"
    """The path every request of its sessions must stay under (the same rule's
    ``pathPrefix``): an SSE server's ``endpoint`` event naming a path outside it is refused.
    ``/`` (any path of the URL's origin) for configs written before it was carried."""


@dataclasses.dataclass(frozen=True, slots=True)
class RunConfig:
    """Everything a worker needs to run any turn of a run; carried by the ``admitted`` event."""

    uid: str
    namespace: str
    name: str
    goal: str
    instructions: str
    tools: tuple[str, ...]
    limits: kernel.Limits
    model: ModelConfig
    deadline: float
    """Epoch seconds: admission time + ``spec.budget.timeout``."""
    tenant: str = DEFAULT_TENANT
    output_schema: Mapping[str, Any] | None = None
    traceparent: str | None = None
    """W3C trace context of the run's ``invoke_agent`` span (minted at admission)."""
    remote_tools: tuple[RemoteTool, ...] = ()
    """The run's MCP tools (their function names are in ``tools`` too)."""
    url_rules: tuple[UrlRule, ...] = ()
    """What ``http_get`` may fetch for this run (its tenant's rules at admission)."""
    reruns: int = 0
    """How many times the run had been started again from turn 0 (``agentrun.dev/rerun``)
    when this config was admitted: the life of the run it belongs to (``status.reruns`` of
    the AgentRun, which the operator alone writes). Sealed with the config, so a copy of an
    earlier life's admission is not taken for a later one's."""


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRequest:
    """Work item: run turn ``turn`` of run ``run_uid`` on top of event ``expected_seq``."""

    run_uid: str
    namespace: str
    name: str
    turn: int
    expected_seq: int
    """Stream sequence of the run's last event when this turn was dispatched (the CAS base)."""
    traceparent: str | None = None
    stored: int = 0
    """Bytes the run's events took when this turn was dispatched (its base event's
    ``stored``): what the worker reserves the turn's memory by, before it reads the run. 0
    from an operator older than the field (the worker then reserves a light turn's)."""

    @property
    def msg_id(self) -> str:
        """``Nats-Msg-Id`` for JetStream de-duplication: ``<run-uid>:<turn>@<expected-seq>``.

        The base event's stream sequence is part of it: a rerun keeps the run's uid and asks
        for turn 0 again on a new admission (its subject purged), and within the duplicate
        window an id without it would be dropped as the first run's copy. Stream sequences
        are never reused, so only a true re-dispatch (same turn, same base) is dropped."""
        return f"{self.run_uid}:{self.turn}@{self.expected_seq}"


@dataclasses.dataclass(frozen=True, slots=True)
class Approval:
    """A person's decision on the pending held call, bound to its digest."""

    digest: str
    approved: bool
    reviewer: str = ""
    """The Kubernetes user who decided (``agentrun.dev/reviewer``, which the chart's admission
    policy checks equals the requesting user); "" in events written before reviewers."""
    after: int = 0
    """The stream sequence of the run's event the decision was made on, which it is appended
    right after (sealed with it: a copy appended anywhere else, a later turn of the run or a
    rerun that holds the same call again, is refused); 0 in events written before it."""
