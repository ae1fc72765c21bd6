"""Resolving a run's ``SERVER/TOOL`` names at admission (pure): the ``RemoteTool`` values its
admitted config carries.

What belongs here: the rule (only allowlisted tools that discovery found, the last good list if
a refresh failed; a model-facing name the OpenAI API accepts) and whether a server was not
looked at yet. What does not: reading the AgentToolServer (``store``), the tenant's
``allowedTools`` (``tenants``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from yarl import URL

from agentrun.protocol import RemoteTool, UrlRule
from agentrun.tools import reach, remote

from ..platform.spec import ReferenceMissing, SpecError, hint, not_found
from .spec import AgentToolServerSpec, Effect, split_reference

MAX_FUNCTION_NAME = 64
"""Longest function name the OpenAI tools API accepts."""


def rules_text(rules: Sequence[UrlRule]) -> str:
    """The rules as a person reads them in a message: ``host/prefix (private network)``."""
    shown = [
        f"{r.host}{r.path_prefix}{' (private network)' if r.private_network else ''}" for r in rules
    ]
    return ", ".join(shown) or "none"


def url_rule(url: str, rules: Sequence[UrlRule], *, tenant: str) -> UrlRule:
    """The tenant's rule that allows an AgentToolServer's ``url`` (``reach.allowed_by``).

    Raises ``SpecError`` naming the URL, the tenant and its rules when none does."""
    try:
        parsed = URL(url)
    except ValueError as err:
        raise SpecError(f"spec.url: {url!r} is not a URL: {err}") from None
    rule = reach.allowed_by(parsed, rules)
    if rule is None:
        raise SpecError(
            f"spec.url: {parsed.with_query(None)} is not allowed by AgentTenant {tenant!r} "
            f"(spec.toolServers.allow: {rules_text(rules)})"
        )
    return rule


def check_reach(
    reference: str, server: Mapping[str, Any] | None, *, rules: Sequence[UrlRule], tenant: str
) -> None:
    """Raises ``SpecError`` naming ``spec.tools`` when the AgentToolServer ``reference`` names
    has a URL its tenant's ``toolServers`` rules do not allow (checked before waiting for its
    discovery, which such a server never gets). A missing or invalid server is left to
    ``resolve_tool``."""
    parts = split_reference(reference)
    if server is None or parts is None:
        return
    try:
        spec = AgentToolServerSpec.of(server.get("spec"))
    except SpecError:
        return
    _server_rule(spec, parts[0], rules=rules, tenant=tenant, where=f"spec.tools: {reference}")


def _server_rule(
    spec: AgentToolServerSpec,
    server_name: str,
    *,
    rules: Sequence[UrlRule],
    tenant: str,
    where: str,
) -> UrlRule:
    """The rule that allows the server's URL (``url_rule``); raises ``SpecError`` naming
    ``where`` and the server when none does."""
    try:
        return url_rule(spec.url, rules, tenant=tenant)
    except SpecError as err:
        raise SpecError(f"{where}: AgentToolServer {server_name!r}: {err}") from None


def _spec_of(server: Mapping[str, Any], server_name: str, *, where: str) -> AgentToolServerSpec:
    """``server``'s spec; raises ``SpecError`` naming it as invalid."""
    try:
        return AgentToolServerSpec.of(server.get("spec"))
    except SpecError as err:
        raise SpecError(f"{where}: AgentToolServer {server_name!r} is invalid: {err}") from None


def _function_name(server_name: str, tool: str, *, where: str) -> str:
    """The model-facing name of ``tool`` on ``server_name``; raises ``SpecError`` when it is
    longer than providers accept (``MAX_FUNCTION_NAME``)."""
    function = remote.function_name(server_name, tool)
    if len(function) > MAX_FUNCTION_NAME:
        raise SpecError(
            f"{where}: the model-facing name {function} is longer than {MAX_FUNCTION_NAME} "
            "characters; use a shorter AgentToolServer name"
        )
    return function


def _discovered(
    server: Mapping[str, Any], server_name: str, tool: str, *, where: str
) -> Mapping[str, Any]:
    """The status entry discovery wrote for ``tool`` on ``server``; raises ``SpecError`` with
    the server's ``Ready`` message (or "not discovered yet") when there is none."""
    status = server.get("status") or {}
    found = {t.get("name"): t for t in status.get("tools") or []}
    entry = found.get(tool)
    if entry is None:
        conditions = status.get("conditions") or []
        ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
        why = ready.get("message") or "its tools have not been discovered yet"
        raise SpecError(f"{where}: not discovered on AgentToolServer {server_name!r}: {why}")
    return entry  # type: ignore[no-any-return]


def resolve_tool(
    reference: str,
    server: Mapping[str, Any] | None,
    *,
    namespace: str,
    rules: Sequence[UrlRule],
    tenant: str,
) -> RemoteTool:
    """The ``RemoteTool`` a run gets for ``reference`` (``SERVER/TOOL``), from the
    AgentToolServer object (``None``: it does not exist) in the run's namespace, under its
    tenant's ``toolServers`` rules (``rules``: its URL must be allowed; the rule's
    ``privateNetwork`` and ``pathPrefix`` go with the tool, for the worker's address and
    request checks). Only allowlisted
    tools that discovery found are resolved (the last good list if a refresh failed).
    Raises ``SpecError`` naming ``spec.tools`` and the reason otherwise."""
    parts = split_reference(reference)
    assert parts is not None
    server_name, tool = parts
    where = f"spec.tools: {reference}"
    if server is None:
        raise ReferenceMissing(
            f"{where}: {not_found('AgentToolServer', server_name, namespace=namespace)}"
        )
    spec = _spec_of(server, server_name, where=where)
    rule = _server_rule(spec, server_name, rules=rules, tenant=tenant, where=where)
    if spec.effect_of(tool) is None:
        offered = ", ".join(t.name for t in spec.tools) or "none"
        raise SpecError(
            f"{where}: AgentToolServer {server_name!r} does not offer {tool!r}"
            f"{hint(tool, (t.name for t in spec.tools))} (spec.tools: {offered})"
        )
    entry = _discovered(server, server_name, tool, where=where)
    function = _function_name(server_name, tool, where=where)
    headers = spec.headers_from
    return RemoteTool(
        name=function,
        server=server_name,
        tool=tool,
        description=str(entry.get("description") or ""),
        parameters=dict(entry.get("inputSchema") or {"type": "object"}),
        effect=spec.effect_of(tool) or Effect.READ,
        url=spec.url,
        transport=spec.transport.value,
        timeout=spec.timeouts.call.seconds,
        headers_secret=headers.secret_ref.name if headers else None,
        headers_keys=headers.keys if headers else (),
        private_network=rule.private_network,
        path_prefix=rule.path_prefix,
    )


def is_pending(server: Mapping[str, Any] | None) -> bool:
    """True when an AgentToolServer exists but has not been looked at yet (no condition): a
    run naming it was probably applied together with it and should wait a moment."""
    return server is not None and not (server.get("status") or {}).get("conditions")
