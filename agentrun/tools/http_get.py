"""`http_get`: GET a URL the run's tenant allows, with size and time caps.

Policy comes from the run's AgentTenant (``spec.httpGet.allow``, snapshotted into the run's
config at admission): a URL is fetched only when its host (and port, when the rule names one)
equals a rule's and its path starts with the rule's path prefix. Every redirect is checked
against the same rules before it is followed. The host's addresses are resolved once and
checked before connecting, and the connection goes to exactly those addresses (a second DNS
answer cannot swap in another): private, loopback, link-local and other non-global addresses
are refused unless the matching rule sets ``privateNetwork``. URLs with credentials
(``user:pass@``) are refused, the tool sends no credentials of its own, and no response header
is echoed, so no secret reaches the model through it.

Results: ``HTTP <status> <reason>, <content type>, <n> bytes`` and the body as text (UTF-8 or
the declared charset, JSON and XML included); a binary body is named, not shown. The body is
read up to ``MAX_BYTES``; the tool runner's byte cap then applies to what the model sees.
Failures: a URL the rules refuse is the model's (``domain``); an HTTP 4xx is ``rejected`` with
the first part of the body; a 5xx, refused or reset connection, unresolvable name or timeout are
infrastructure faults, as is an answer opening with more informational (1xx) heads than
``heads.MAX_INFORMATIONAL``, or one whose connection carries more than ``MAX_WIRE_BYTES``
(``connection``).
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler
from yarl import URL

from agentrun.kernel import ToolFault
from agentrun.protocol import UrlRule

from . import catalog, heads, reach
from .reach import allowed_by, check_address

__all__ = ["MAX_BYTES", "MAX_REDIRECTS", "SPEC", "HttpGet", "allowed_by", "check_address"]

MAX_BYTES = 1_048_576
"""Most bytes of a body read (the rest is not downloaded)."""
MAX_WIRE_BYTES = 4 * MAX_BYTES
"""Most bytes one connection (one request: head, body and the body's framing) may receive:
a body of ``MAX_BYTES`` sent in chunks of one byte behind a chunk extension of 60 KB each
(which the HTTP parser reads and drops) took 2.9 GB of the wire and 7.7 s of a worker core
until ``TIMEOUT_SECONDS`` ended it; now it is refused after 4 MiB. A real body's framing (a
chunk header per kilobytes of data) is a fraction of a percent of it."""
MAX_REDIRECTS = 5
TIMEOUT_SECONDS = 20.0
"""Bound on one call: resolution, every redirect and the body."""
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/yaml")

SPEC = catalog.ToolSpec(
    name="http_get",
    description=(
        "Fetch a URL with HTTP GET and return the status, content type, size and the body as "
        "text. Only URLs the platform allows for your tenant can be fetched (host and path "
        "prefix); anything else fails with a message listing what is allowed. Redirects are "
        f"followed (at most {MAX_REDIRECTS}) only to allowed URLs. Bodies beyond "
        f"{MAX_BYTES // 1024} KiB are cut; binary bodies are not shown. HTTP errors (4xx) come "
        "back as errors with the start of the body."
    ),
    parameters=catalog.object_schema(
        {
            "url": {
                "type": "string",
                "minLength": 1,
                "maxLength": 2048,
                "description": "Absolute http:// or https:// URL, e.g. https://api.example.com/v1/status",
            },
        },
        required=["url"],
    ),
    effect="read",
    pollable=True,
)


class _Pinned(AbstractResolver):
    """Answers with addresses resolved and checked beforehand (no second DNS lookup)."""

    def __init__(self, answers: Mapping[str, list[ResolveResult]]) -> None:
        self._answers = answers

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [dict(a, port=port) for a in self._answers[host]]  # type: ignore[misc]

    async def close(self) -> None:
        return None


class _BoundedHandler(ResponseHandler):
    """aiohttp's protocol of one connection (which carries one request: a session of its own
    each), refusing an answer that opens with more than ``heads.MAX_INFORMATIONAL``
    informational heads or whose heads come in too many reads (``heads.HeadCount.refusal``),
    or whose connection receives more than
    ``MAX_WIRE_BYTES``: aiohttp reads informational heads for as long as they come, and a
    chunked body's framing without a bound, each under the read timeout, which a server
    sending them at network speed turned into ``TIMEOUT_SECONDS`` of a core of the worker
    parsing them."""

    def __init__(self, loop: asyncio.AbstractEventLoop, refusals: list[str]) -> None:
        """``refusals`` gets the reason of each refusal (the error aiohttp raises for one
        during a body is its own: a payload cut short)."""
        super().__init__(loop)
        self._heads = heads.HeadCount()
        self._heads.start()
        self._received = 0
        self._refusals = refusals
        self._refused = False

    def data_received(self, data: bytes) -> None:
        self._received += len(data)
        self._heads.feed(data)
        if self._received > MAX_WIRE_BYTES:
            self._refuse(f"the server sent over {MAX_WIRE_BYTES} bytes on one connection")
        elif (why := self._heads.refusal()) is not None:
            self._refuse(why)
        else:
            super().data_received(data)

    def _refuse(self, why: str) -> None:
        if not self._refused:
            self._refused = True
            self._refusals.append(why)
            self.set_exception(aiohttp.ClientConnectionError(why))
            if self.transport is not None:
                self.transport.close()


def _handler(loop: asyncio.AbstractEventLoop, refusals: list[str]) -> ResponseHandler:
    return _BoundedHandler(loop, refusals)


class _Connector(aiohttp.TCPConnector):
    """A ``TCPConnector`` whose connections are ``_BoundedHandler``s (aiohttp builds each
    connection's protocol with its ``_factory``, TLS ones too)."""

    def __init__(self, resolver: AbstractResolver) -> None:
        super().__init__(resolver=resolver)
        self.refusals: list[str] = []
        """Why its connections refused an answer (``_BoundedHandler``), in order."""
        self._factory = functools.partial(_handler, loop=self._loop, refusals=self.refusals)


async def _resolve(url: URL, rule: UrlRule) -> list[ResolveResult]:
    """The checked addresses of ``url``'s host (``reach.resolve_checked``); raises ToolError."""
    host = url.host or ""
    try:
        checked = await reach.resolve_checked(
            host, url.port or 0, private_network=rule.private_network
        )
    except reach.Refused as err:
        raise catalog.ToolError(f"{_shown(url)} refused: {err}") from None
    except OSError as err:
        raise catalog.ToolError(
            f"cannot resolve {host}: {err}", fault=ToolFault.CONNECTION
        ) from None
    return [
        ResolveResult(
            hostname=host,
            host=address,
            port=url.port or 0,
            family=family,
            proto=proto,
            flags=socket.AI_NUMERICHOST,
        )
        for family, proto, address in checked
    ]


def _render(response: aiohttp.ClientResponse, body: bytes, *, cut: bool) -> str:
    kind = response.headers.get("Content-Type", "")
    size = f"{len(body)} bytes" + (f" (cut at {MAX_BYTES})" if cut else "")
    head = f"HTTP {response.status} {response.reason or ''}".rstrip()
    head += f", {kind or 'no content type'}, {size}"
    if kind and not kind.lower().startswith(_TEXT_TYPES) and "+json" not in kind:
        return f"{head}\n[binary content, not shown]"
    text = body.decode(response.charset or "utf-8", errors="replace")
    return f"{head}\n\n{text}"


def _shown(url: URL) -> str:
    """``url`` as it may be shown: no credentials, no query string (either may hold a secret)."""
    return str(url.with_user(None).with_password(None).with_query(None).with_fragment(None))


def _refused(url: URL, rules: Sequence[UrlRule]) -> catalog.ToolError:
    allowed = ", ".join(f"{r.host}{r.path_prefix}" for r in rules) or "none"
    return catalog.ToolError(f"{_shown(url)} is not allowed for this tenant (allowed: {allowed})")


class HttpGet:
    """The `http_get` tool, with the URL rules of one run's tenant."""

    spec = SPEC

    def __init__(self, rules: Sequence[UrlRule] = ()) -> None:
        self.rules = tuple(rules)

    async def run(self, arguments: Mapping[str, Any], ctx: catalog.ToolContext) -> str:
        """GET ``arguments["url"]`` under the rules of the module docstring.

        Raises ToolError (with the fault of the module docstring) on every failure.
        """
        try:
            url = URL(str(arguments["url"]))
        except ValueError as err:
            raise catalog.ToolError(f"not a URL: {err}") from None
        try:
            async with asyncio.timeout(TIMEOUT_SECONDS):
                return await self._follow(url)
        except TimeoutError:
            raise catalog.ToolError(
                f"no complete answer within {TIMEOUT_SECONDS:g}s", fault=ToolFault.TIMEOUT
            ) from None

    async def _follow(self, url: URL) -> str:
        for _ in range(MAX_REDIRECTS + 1):
            rule = allowed_by(url, self.rules)
            if rule is None:
                raise _refused(url, self.rules)
            answers = await _resolve(url, rule)
            connector = _Connector(_Pinned({url.host or "": answers}))
            async with aiohttp.ClientSession(connector=connector) as session:
                try:
                    async with session.get(url, allow_redirects=False) as response:
                        if response.status in (301, 302, 303, 307, 308):
                            location = response.headers.get("Location", "")
                            url = url.join(URL(location))
                            continue
                        body = await _read_capped(response)
                        return _result(response, body[:MAX_BYTES], cut=len(body) > MAX_BYTES)
                except aiohttp.ClientError as err:  # refused, reset, cut short, malformed
                    why = (
                        connector.refusals[0]
                        if connector.refusals
                        else f"{type(err).__name__}: {err}"
                    )
                    raise catalog.ToolError(
                        f"{_shown(url)}: {why}", fault=ToolFault.CONNECTION
                    ) from None
        raise catalog.ToolError(f"more than {MAX_REDIRECTS} redirects", fault=ToolFault.REJECTED)


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    """At most ``MAX_BYTES + 1`` bytes of the body (one more tells it was cut)."""
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_BYTES:
        chunk = await response.content.read(MAX_BYTES + 1 - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _result(response: aiohttp.ClientResponse, body: bytes, *, cut: bool) -> str:
    text = _render(response, body, cut=cut)
    if response.status >= 500:
        raise catalog.ToolError(text[:2000], fault=ToolFault.SERVER)
    if response.status >= 400:
        raise catalog.ToolError(text[:2000], fault=ToolFault.REJECTED)
    return text
