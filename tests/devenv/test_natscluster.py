"""Three nats-servers on loopback form one JetStream cluster, closed as a single server is,
and stop by pid; a replicated stream's leader can be stepped down."""

from __future__ import annotations

import json
import socket
import ssl
import urllib.request
from pathlib import Path

import nats
import pytest
from nats.js import api

from agentrun_dev import components, natscluster, procs


def routes(monitor_url: str) -> list[str]:
    """The names of the servers the server at `monitor_url` has a route connection to, one
    entry per connection (``/routez``)."""
    with urllib.request.urlopen(f"{monitor_url}/routez", timeout=5) as response:
        return sorted(str(route["remote_name"]) for route in json.load(response)["routes"])


async def test_three_servers_form_one_cluster_that_keeps_a_stream_on_all_three(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    assert len(nats_cluster.servers) == 3
    names = {"n1", "n2", "n3"}
    for index, server in enumerate(nats_cluster.servers):  # one ordered route per pair
        assert routes(server.monitor_url) == sorted(names - {f"n{index + 1}"})
    client = await nats.connect(**nats_cluster.client_options("admin"))
    try:
        js = client.jetstream(timeout=10)
        await js.add_stream(api.StreamConfig(name="DEVENV_R3", subjects=["r3.>"], num_replicas=3))
        await js.publish("r3.a", b"kept three times")
        info = await js.stream_info("DEVENV_R3")
        assert info.cluster is not None and info.cluster.name == natscluster.CLUSTER_NAME
        peers = {info.cluster.leader, *(peer.name for peer in info.cluster.replicas or [])}
        assert peers == {"n1", "n2", "n3"}
        old, new = await natscluster.step_down(client, "DEVENV_R3")
        assert old != new and new in peers
        await js.delete_stream("DEVENV_R3")
    finally:
        await client.close()


async def test_a_stopped_server_lags_until_it_is_back_and_caught_up(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    """``lagging`` (what ``wait_caught_up`` waits on) names every group a stopped server is
    behind on, and nothing once it is back and caught up; a consumer's group counts too."""
    client = await nats.connect(**nats_cluster.client_options("admin"))
    server = nats_cluster.servers[2]
    try:
        js = client.jetstream(timeout=10)
        await js.add_stream(api.StreamConfig(name="DEVENV_LAG", subjects=["lag.>"], num_replicas=3))
        await js.add_consumer("DEVENV_LAG", api.ConsumerConfig(durable_name="reader"))
        natscluster.wait_caught_up(nats_cluster, "n3", timeout=30)
        assert natscluster.lagging(nats_cluster, "n3") == []
        components.stop_component(server.component)
        behind = natscluster.lagging(nats_cluster, "n3")
        assert {"DEVENV_LAG", "DEVENV_LAG/reader"} <= set(behind), behind
        server.restart()
        natscluster.wait_caught_up(nats_cluster, "n3", timeout=60)
        assert natscluster.lagging(nats_cluster, "n3") == []
    finally:
        if not server.component.is_alive():
            server.restart()
        await client.close()


async def test_clients_need_the_same_credentials_as_on_one_server(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    assert all(url.startswith("tls://127.0.0.1:") for url in nats_cluster.urls)
    worker = await nats.connect(**nats_cluster.client_options("worker"))
    await worker.close()
    with pytest.raises(Exception):  # noqa: B017 - no credentials: refused (or no TLS at all)
        await nats.connect(nats_cluster.url, allow_reconnect=False, connect_timeout=2)


def test_routes_speak_only_tls_with_a_peer_certificate_and_ask_for_credentials(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    """On a route port a plain-text client hears nothing, a TLS client without a certificate
    is refused, and one with the servers' certificate is asked for credentials."""
    auth_dir = nats_cluster.auth_dir
    port = nats_cluster.servers[0].component.ports["route"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.settimeout(1.0)  # the server waits for a TLS hello, then closes: no word either way
        try:
            heard = conn.recv(2000)
        except TimeoutError:
            heard = b""
        assert heard == b""
    anonymous = ssl.create_default_context(cafile=str(auth_dir / "ca.crt"))
    with (
        pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"),
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        anonymous.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        conn.recv(2000)
    peer = ssl.create_default_context(cafile=str(auth_dir / "ca.crt"))
    peer.load_cert_chain(str(auth_dir / "tls.crt"), str(auth_dir / "tls.key"))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        peer.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
    ):
        line = conn.makefile("rb").readline()
    assert line.startswith(b"INFO "), line
    info = json.loads(line[5:])
    assert (info["tls_required"], info["tls_verify"], info["auth_required"]) == (True, True, True)


def test_a_cluster_stops_by_pid(tmp_path: Path, devenv_launch: components.Launch) -> None:
    cluster = natscluster.start_nats_cluster(tmp_path, launch=devenv_launch)
    assert len(set(cluster.pids())) == 3
    cluster.stop()
    assert not any(procs.is_alive(server.component.record) for server in cluster.servers)


def test_a_cluster_of_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        natscluster.start_nats_cluster(tmp_path, size=1)


def test_a_cluster_given_hosts_of_another_count_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 hosts for 3 servers"):
        natscluster.start_nats_cluster(tmp_path, hosts=("127.0.0.2", "127.0.0.3"))
