"""Three nats-servers on loopback form one JetStream cluster, closed as a single server is,
and stop by pid; a replicated stream's leader can be stepped down."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import nats
import pytest
from nats.js import api

from agentrun_dev import components, natscluster, procs


def routes(monitor_url: str) -> int:
    with urllib.request.urlopen(f"{monitor_url}/routez", timeout=5) as response:
        return int(json.load(response)["num_routes"])


async def test_three_servers_form_one_cluster_that_keeps_a_stream_on_all_three(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    assert len(nats_cluster.servers) == 3
    assert all(routes(server.monitor_url) >= 2 for server in nats_cluster.servers)
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


async def test_clients_need_the_same_credentials_as_on_one_server(
    nats_cluster: natscluster.NatsCluster,
) -> None:
    assert all(url.startswith("tls://127.0.0.1:") for url in nats_cluster.urls)
    worker = await nats.connect(**nats_cluster.client_options("worker"))
    await worker.close()
    with pytest.raises(Exception):  # noqa: B017 - no credentials: refused (or no TLS at all)
        await nats.connect(nats_cluster.url, allow_reconnect=False, connect_timeout=2)


def test_a_cluster_stops_by_pid(tmp_path: Path, devenv_launch: components.Launch) -> None:
    cluster = natscluster.start_nats_cluster(tmp_path, launch=devenv_launch)
    assert len(set(cluster.pids())) == 3
    cluster.stop()
    assert not any(procs.is_alive(server.component.record) for server in cluster.servers)


def test_a_cluster_of_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 2"):
        natscluster.start_nats_cluster(tmp_path, size=1)
