"""Where a tool may connect: a tenant's URL rules and the addresses a host may resolve to.

One rule set for every outbound connection a run's tenant governs — the ``http_get`` tool
(``AgentTenant.spec.httpGet.allow``) and MCP tool servers, at discovery by the operator and at
each call by a worker (``AgentTenant.spec.toolServers.allow``): a URL is allowed when a rule's
host (and port, when the rule names one) equals the URL's and its path starts with the rule's
prefix (``allowed_by``), read as any server would read it (``outside_prefix``: no dot
segment, encoded or not, no encoded slash or backslash, nothing encoded twice); every request
of an MCP session is held to the same prefix (``endpoint.Bounds``). Before connecting, the host
is resolved once and every address is checked (``resolve_checked``): private, loopback,
link-local and other non-global addresses are refused unless the matching rule sets
``privateNetwork``; the connection then goes to exactly those addresses, so a second DNS
answer (DNS rebinding) cannot swap in another. ``CheckedBackend`` does this for the
``httpcore2`` connections the MCP SDK makes.

What does not belong here: following redirects (``http_get`` re-checks each one; the MCP SDK
follows none), reading the rules from an AgentTenant (the operator).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import unquote

import httpcore2
from httpcore2 import AsyncNetworkBackend, AsyncNetworkStream
from yarl import URL

from agentrun.protocol import UrlRule

__all__ = [
    "CheckedBackend",
    "Refused",
    "allowed_by",
    "check_address",
    "outside_prefix",
    "resolve_checked",
]


class Refused(Exception):
    """The host resolves to an address its rule does not allow; the message says which."""


def allowed_by(url: URL, rules: Sequence[UrlRule]) -> UrlRule | None:
    """The first rule that allows ``url`` (scheme http/https, no credentials, host and port
    equal, path under the prefix: ``outside_prefix``), or ``None``."""
    if url.scheme not in ("http", "https") or url.user or url.password or not url.host:
        return None
    host = url.host.lower().rstrip(".")
    for rule in rules:
        rule_host, rule_port = _host_port(rule.host.lower())
        if rule_host != host:
            continue
        if rule_port and int(rule_port) != url.port:
            continue
        if outside_prefix(url.raw_path or "/", rule.path_prefix) is None:
            return rule
    return None


ENCODED_SEPARATORS = ("%2e", "%2f", "%5c")
"""A dot, a slash and a backslash percent-encoded (compared in lower case)."""


def outside_prefix(raw_path: str, prefix: str) -> str | None:
    """Why the path ``raw_path`` (as sent: percent-encoded, no query) is not under ``prefix``
    for every server that may read it, or ``None`` when it is.

    Servers and gateways differ in what they decode and normalise, so a path is refused when
    any of them could read it as another: an encoded slash or backslash (``%2F``, ``%5C``:
    one server splits there, another does not), a backslash, a ``.`` or ``..`` segment once
    decoded (``/a/../b``, ``/a/%2e%2e/b``, ``/a/.%2E/b``), or a dot, slash or backslash still
    encoded after decoding once (``%252e``: a server that decodes twice). The decoded path
    must then start with ``prefix``, case and all (``/A/`` is not ``/a/``)."""
    lowered = raw_path.lower()
    if "%2f" in lowered or "%5c" in lowered:
        return "its path has an encoded slash or backslash"
    path = unquote(raw_path)
    if "\\" in path:
        return "its path has a backslash"
    if any(part in (".", "..") for part in path.split("/")):
        return "its path has a . or .. segment"
    if any(encoded in path.lower() for encoded in ENCODED_SEPARATORS):
        return "its path has a dot, slash or backslash encoded twice"
    if not path.startswith(prefix):
        return f"its path is not under {prefix}"
    return None


def _host_port(text: str) -> tuple[str, str]:
    """A rule's ``host[:port]`` (an IPv6 address in brackets: ``[::1]:8443``) split in two."""
    if text.startswith("["):
        address, _, rest = text[1:].partition("]")
        return address, rest.removeprefix(":")
    host, _, port = text.partition(":")
    return host, port


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
"""The well-known NAT64 prefix (RFC 6052): a gateway translates ``64:ff9b::a.b.c.d`` to the
IPv4 address ``a.b.c.d``."""
NOT_GLOBAL_V6 = (
    ipaddress.IPv6Network("64:ff9b:1::/48"),  # local-use NAT64 (RFC 8215): an internal gateway
    ipaddress.IPv6Network("fec0::/10"),  # site-local (deprecated, RFC 3879): internal
    ipaddress.IPv6Network("5f00::/16"),  # SRv6 segment identifiers (RFC 9602)
    ipaddress.IPv6Network("3fff::/20"),  # documentation (RFC 9637)
    ipaddress.IPv6Network("ff00::/8"),  # multicast
)
"""IPv6 networks the standard library may count as global that lead inside a network."""


def embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and is translated or tunnelled to, if any:
    IPv4-mapped (``::ffff:a.b.c.d``), IPv4-translated (``::ffff:0:a.b.c.d``, RFC 2765),
    IPv4-compatible (``::a.b.c.d``, deprecated), NAT64 (``64:ff9b::/96``), 6to4
    (``2002::/16``, RFC 3056) and ISATAP interface ids (``…:0:5efe:a.b.c.d`` or
    ``…:200:5efe:a.b.c.d`` under any prefix, RFC 5214)."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    value = int(ip)
    low = ipaddress.IPv4Address(value & 0xFFFFFFFF)
    high = value >> 32
    if high == 0xFFFF0000 or ip in NAT64 or (high == 0 and int(low) > 1):
        return low
    if (high & 0xFDFFFFFF) == 0x00005EFE:  # ISATAP (RFC 5214): ``…:0:5efe:a.b.c.d``, any prefix
        return low
    return None


def check_address(address: str, *, private_network: bool) -> str | None:
    """Why connecting to ``address`` is refused (a non-global address without
    ``private_network``), or ``None``. An IPv6 address that carries an IPv4 address the
    network translates or tunnels to (``embedded_ipv4``) is judged as that IPv4 address, so
    ``64:ff9b::a9fe:a9fe`` is the metadata address 169.254.169.254 behind a NAT64 gateway."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if any(ip in network for network in NOT_GLOBAL_V6) and not private_network:
            return f"{address} is an internal address, which the tenant's rule does not allow"
        ip = embedded_ipv4(ip) or ip
    if ip.is_global or private_network:
        return None
    kind = "loopback" if ip.is_loopback else "link-local" if ip.is_link_local else "private"
    return f"{address} is a {kind} address, which the tenant's rule does not allow"


async def resolve_checked(
    host: str, port: int, *, private_network: bool
) -> list[tuple[socket.AddressFamily, int, str]]:
    """Every address of ``host`` as ``(family, proto, address)``, each checked
    (``check_address``); an IP literal is checked as it is.

    Raises ``Refused`` naming the first address refused, ``OSError`` when the name does not
    resolve.
    """
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    answers: list[tuple[socket.AddressFamily, int, str]] = []
    for family, _, proto, _, sockaddr in infos:
        address = str(sockaddr[0])
        why = check_address(address, private_network=private_network)
        if why is not None:
            raise Refused(f"{host}: {why}")
        answers.append((family, proto, address))
    return answers


class CheckedBackend(AsyncNetworkBackend):
    """An ``httpcore2`` network backend that resolves each host itself, refuses it unless
    every address passes ``check_address``, and connects to those addresses only (TLS still
    verifies the certificate against the host's name, which ``httpcore2`` passes as the
    server name). Refusals surface as ``httpcore2.ConnectError`` (``httpx2.ConnectError``
    through a client): the request was never sent."""

    def __init__(self, *, private_network: bool) -> None:
        self.private_network = private_network
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        """Resolve, check, then connect to the first address that answers."""
        try:
            answers = await resolve_checked(host, port, private_network=self.private_network)
        except Refused as err:
            raise httpcore2.ConnectError(f"refused by the tenant's rules: {err}") from None
        except OSError as err:
            raise httpcore2.ConnectError(f"cannot resolve {host}: {err}") from None
        last: Exception | None = None
        for _, _, address in answers:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore2.ConnectError as err:
                last = err
        raise last or httpcore2.ConnectError(f"{host} has no address")

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore2.SOCKET_OPTION] | None = None,
    ) -> AsyncNetworkStream:
        """Never: a tool server is reached over TCP only."""
        raise httpcore2.ConnectError("unix sockets are not a tool server's address")

    async def sleep(self, seconds: float) -> None:
        """As the default backend."""
        await self._inner.sleep(seconds)
