"""The chart's KEDA ScaledObject, read as KEDA's nats-jetstream scaler reads it, against three
real nats-servers (issue 23): KEDA itself does not run here (its operator does not build in CI's
time), so `keda_support` does what its scaler does, statement by statement, and the first test
finds each of those statements in KEDA's own source.

The trigger comes from the chart as a first install renders it, before the bootstrap hook
writes the ``<fullname>-nats-server`` Secret (helm renders every template before any hook
runs): it names no account, and the chart's TriggerAuthentication has KEDA read the account's
key from that Secret when it builds the scaler, as `keda_support.build_trigger` does here from
the suite's API server once the Secret is written. The servers are a closed JetStream cluster
with each server on a loopback address of its own, as each pod of the chart's StatefulSet has
one: the scaler finds the consumer's leader by the hosts the servers advertise, and a
follower's ``/jsz`` does not hold the lag (its ``num_pending`` is 0), so which server is read
matters. `PodNetwork` stands in for what KEDA's pod reaches: the monitor Service's name and the
pods' addresses on the monitoring port. The streams and the workers' consumer are made by the
operator's `Bus` at three replicas, turns are published as the operator publishes them and
held by a worker's subscription.

Not proven here: KEDA's operator and metrics server themselves, the HPA they drive (its
scaling policies and stabilization window: how fast and when it scales, scale-in timing and
``cooldownPeriod``), the pod network's own DNS and Service balancing, and KEDA's client reading
the TriggerAuthentication (taken here from the render; ``test_server.py`` has the API server
accept it under KEDA's own CRD).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import dataclasses
import json
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from chart_support import CHART_DIR, FEATURES, documents, keda_module_dir
from cluster_nats_support import jetstream_usable
from keda_support import (
    SOURCE_FACTS,
    Reading,
    Scaler,
    ScalerError,
    Trigger,
    build_trigger,
    desired_replicas,
    hpa_bounds,
    lag_of,
    monitoring_url,
)
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from agentrun import protocol
from agentrun.bus import Bus, BusSettings
from agentrun.natsauth import bootstrap
from agentrun.protocol import TurnRequest
from agentrun_dev import components, helm, natscluster
from agentrun_dev.kubectl import Kubectl, create_namespace, delete_namespace

POD_ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
"""Each server's own loopback address (``n1``, ``n2``, ``n3``), as each NATS pod has its own."""

VALUES = {**FEATURES["nats-cluster"], **FEATURES["keda"]}
"""The chart's NATS as three servers, and the ScaledObject."""

SERVER_SECRET = "agentrun-nats-server"
"""The Secret the chart's TriggerAuthentication has KEDA read the account's key from (release
``agentrun``: ``<fullname>-nats-server``, ``agentrun.natsServerSecret``), which the bootstrap
hook writes."""

Manifest = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ApiSecrets:
    """Secrets as KEDA's client reads them from the suite's API server (a
    `keda_support.ReadSecret`)."""

    kubectl: Kubectl

    def __call__(self, namespace: str, name: str) -> dict[str, str] | None:
        """Secret `name` of `namespace`: its keys and decoded values, None when it does not
        exist (raises KubectlError when the API server cannot be asked)."""
        got = self.kubectl(
            "get", "secret", name, "-n", namespace, "--ignore-not-found", "-o", "json"
        )
        if not got.stdout.strip():
            return None
        data = json.loads(got.stdout).get("data") or {}
        return {key: base64.b64decode(value).decode() for key, value in data.items()}


@dataclasses.dataclass(frozen=True)
class Release:
    """The chart's KEDA objects as rendered into `namespace`."""

    namespace: str
    scaled_object: Manifest
    authentications: dict[str, Manifest]
    """The TriggerAuthentications rendered, by name."""

    def build(self, secrets: ApiSecrets) -> Trigger:
        """The trigger KEDA builds from these objects and the Secrets that exist now (raises
        ScalerError when that build fails)."""
        return build_trigger(
            self.scaled_object, authentications=self.authentications, read_secret=secrets
        )


@dataclasses.dataclass
class PodNetwork:
    """What KEDA's pod reaches by HTTP (a `keda_support.Fetch`): the monitor Service's
    host:port answers from each server in turn (a Service may send each connection to
    another pod); a server's own address on the Service's port (the chart's ``containerPort``
    8222) answers from that server; any other host:port is not reachable (OSError). Every URL
    asked is kept in `asked`, as the scaler built it."""

    service: str
    """host:port of the monitor Service (the trigger's ``natsServerMonitoringEndpoint``)."""
    servers: list[str]
    """Each server's real monitoring URL, ``http://<its address>:<its port>``."""
    turn: int = 0
    """The index in `servers` of the one the Service sends the next request to."""
    asked: list[str] = dataclasses.field(default_factory=list)

    def __call__(self, url: str) -> Any:
        self.asked.append(url)
        parts = urllib.parse.urlsplit(url)
        real = urllib.parse.urlsplit(self._route(parts.netloc))
        with urllib.request.urlopen(parts._replace(netloc=real.netloc).geturl(), timeout=5) as got:
            return json.load(got)

    def _route(self, netloc: str) -> str:
        if netloc == self.service:
            server = self.servers[self.turn % len(self.servers)]
            self.turn += 1
            return server
        port = urllib.parse.urlsplit(f"//{self.service}").port
        for server in self.servers:
            if netloc == f"{urllib.parse.urlsplit(server).hostname}:{port}":
                return server
        raise OSError(f"{netloc}: not reachable from KEDA's pod")


@pytest.fixture(scope="module")
def pods(
    tmp_path_factory: pytest.TempPathFactory, devenv_launch: components.Launch
) -> Iterator[natscluster.NatsCluster]:
    """Three closed nats-servers forming one JetStream cluster, ``n<i>`` on
    ``POD_ADDRESSES[i-1]``; stopped after the module."""
    cluster = natscluster.start_nats_cluster(
        tmp_path_factory.mktemp("keda-nats"), launch=devenv_launch, hosts=POD_ADDRESSES
    )
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as thread:  # this loop stays current
            thread.submit(asyncio.run, jetstream_usable(cluster)).result()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def account(pods: natscluster.NatsCluster) -> str:
    """The AGENTRUN account's public key, as the bootstrap hook writes it into the server's
    Secret (``account.pub``)."""
    return bootstrap.server_secret(pods.servers[0].authority())[bootstrap.ACCOUNT_KEY]


@pytest.fixture(scope="module")
def online_helm(
    helm_binary: Path, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> helm.Helm:
    """helm asking the suite's API server (its ``lookup`` sees what exists there)."""
    return helm.Helm(
        helm_binary,
        home=tmp_path_factory.mktemp("helm-online"),
        kubeconfig=kubectl.env["KUBECONFIG"],
    )


def render_release(online: helm.Helm, namespace: str) -> Release:
    """The chart's ScaledObject and TriggerAuthentications as ``helm install`` or ``helm
    upgrade`` renders them into `namespace` (``--dry-run=server``: against the API server)."""
    docs = documents(
        online.template(CHART_DIR, namespace=namespace, values=VALUES, extra=["--dry-run=server"])
    )
    [scaled] = [d for d in docs if d["kind"] == "ScaledObject"]
    authentications = {
        d["metadata"]["name"]: d for d in docs if d["kind"] == "TriggerAuthentication"
    }
    return Release(namespace, scaled, authentications)


def write_server_secret(kubectl: Kubectl, namespace: str, pods: natscluster.NatsCluster) -> None:
    """Write the server's Secret as the bootstrap hook does: this cluster's ``auth.conf`` and
    ``account.pub``."""
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SERVER_SECRET, "namespace": namespace},
        "stringData": bootstrap.server_secret(pods.servers[0].authority()),
    }
    kubectl("apply", "-f", "-", input=json.dumps(secret))


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A fresh namespace on the suite's API server, deleted afterwards."""
    name = create_namespace(kubectl, prefix="agentrun-keda-")
    try:
        yield name
    finally:
        delete_namespace(kubectl, name)


@pytest.fixture(scope="module")
def release(
    online_helm: helm.Helm, kubectl: Kubectl, pods: natscluster.NatsCluster
) -> Iterator[Release]:
    """The chart rendered into a fresh namespace, then the server's Secret written there as
    the install's hook writes it; the namespace deleted after the module."""
    name = create_namespace(kubectl, prefix="agentrun-keda-")
    try:
        rendered = render_release(online_helm, name)
        write_server_secret(kubectl, name, pods)
        yield rendered
    finally:
        delete_namespace(kubectl, name)


@pytest.fixture(scope="module")
def trigger(release: Release, kubectl: Kubectl) -> Trigger:
    """The trigger KEDA builds from the release's objects and the hook's Secret."""
    return release.build(ApiSecrets(kubectl))


def network(pods: natscluster.NatsCluster, trigger: Trigger, *, first: int = 0) -> PodNetwork:
    """The pod network of `pods` for `trigger`'s endpoint, the Service first sending KEDA to
    ``pods.servers[first]``."""
    return PodNetwork(trigger.endpoint, [s.monitor_url for s in pods.servers], turn=first)


def jsz(trigger: Trigger, netloc: str) -> str:
    """The ``/jsz`` URL KEDA asks of `netloc` (host:port), written out."""
    return f"http://{netloc}/jsz?acc={trigger.account_id}&config=true&consumers=true"


def pod(server_name: str) -> str:
    """host:port of server ``n<i>``'s monitoring port as KEDA's pod dials it (its own address,
    the chart's port 8222)."""
    return f"{POD_ADDRESSES[int(server_name.removeprefix('n')) - 1]}:8222"


def own_lag(pods: natscluster.NatsCluster, server_name: str, trigger: Trigger) -> int | None:
    """The lag server `server_name`'s own ``/jsz`` answer gives (KEDA's query, asked of it
    directly)."""
    server = pods.servers[int(server_name.removeprefix("n")) - 1]
    query = urllib.parse.urlsplit(monitoring_url(trigger)).query
    with urllib.request.urlopen(f"{server.monitor_url}/jsz?{query}", timeout=5) as got:
        return lag_of(json.load(got), trigger)


@dataclasses.dataclass
class Queue:
    """The work queue as the operator made it, a worker bound to it, and an admin client."""

    operator: Bus
    worker: Bus
    admin: Client
    subscription: JetStreamContext.PullSubscription
    """The worker's pull subscription on the workers' consumer (``Bus.turn_subscription``)."""

    async def publish(self, count: int) -> None:
        """Queue `count` TurnRequests of distinct runs, as the operator dispatches them."""
        for i in range(count):
            request = TurnRequest(f"uid-{i}", "tenant-a", f"run-{i}", 0, 1)
            await self.operator.publish_turn(request, tenant="tenant-a")

    async def settled(self, *, pending: int, ack_pending: int) -> str:
        """Wait (at most 20 s) until the consumer's leader reports `pending` undelivered and
        `ack_pending` unacknowledged TurnRequests (its replica of the stream may trail the
        publish acks); returns the leader's server name. Raises AssertionError with the last
        state otherwise."""
        js = self.admin.jetstream(timeout=2)
        deadline, last = time.monotonic() + 20, "not asked yet"
        while time.monotonic() < deadline:
            try:
                info = await js.consumer_info(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
            except (nats.errors.Error, TimeoutError) as err:
                last = repr(err)
            else:
                leader = info.cluster.leader if info.cluster else None
                state = (info.num_pending, info.num_ack_pending, leader)
                if state[:2] == (pending, ack_pending) and leader:
                    return str(leader)
                last = repr(state)
            await asyncio.sleep(0.1)
        raise AssertionError(f"consumer not at ({pending}, {ack_pending}) in 20 s: {last}")


@pytest.fixture
async def queue(pods: natscluster.NatsCluster) -> AsyncIterator[Queue]:
    """AGENTRUN_TURNS and the workers' consumer at three replicas as the operator provisions
    them (``Bus.connect``), empty; deleted afterwards."""
    admin = await nats.connect(**pods.client_options("admin"))
    settings = BusSettings(url=pods.url, replicas=3)
    operator = await Bus.connect(
        dataclasses.replace(settings, auth=pods.auth("operator")), name="keda-operator"
    )
    worker = await Bus.connect(
        dataclasses.replace(settings, auth=pods.auth("worker")), name="keda-worker", provision=False
    )
    try:
        subscription = await worker.turn_subscription()
        yield Queue(operator, worker, admin, subscription)
    finally:
        await worker.close()
        await operator.close()
        await admin.jetstream(timeout=10).delete_stream(protocol.STREAM_TURNS)
        await admin.close()


def test_the_reader_does_what_kedas_source_says() -> None:
    missing = {}
    for path, facts in SOURCE_FACTS.items():
        flat = " ".join((keda_module_dir() / path).read_text().split())
        missing[path] = [fact for fact in facts if " ".join(fact.split()) not in flat]
    assert not any(missing.values()), f"KEDA's source no longer says: {missing}"


def test_the_trigger_names_the_monitor_service_the_consumer_and_the_hooks_account_secret(
    release: Release, trigger: Trigger, account: str
) -> None:
    namespace = release.namespace
    [rendered] = release.scaled_object["spec"]["triggers"]
    assert "account" not in rendered["metadata"]
    assert rendered["authenticationRef"] == {"name": "agentrun-worker"}
    assert release.authentications["agentrun-worker"]["spec"] == {
        "secretTargetRef": [
            {"parameter": "account", "name": SERVER_SECRET, "key": bootstrap.ACCOUNT_KEY}
        ]
    }
    assert account.startswith("A") and len(account) == 56  # an account's public nkey
    assert trigger == Trigger(
        endpoint=f"agentrun-nats-monitor.{namespace}.svc:8222",
        account=account,
        account_id=account,
        stream="AGENTRUN_TURNS",
        consumer="agentrun-workers",
        lag_threshold=10,
        activation_lag_threshold=0,
    )
    assert (trigger.stream, trigger.consumer) == (
        protocol.STREAM_TURNS,
        protocol.WORKERS_CONSUMER,
    )
    assert monitoring_url(trigger) == (
        f"http://agentrun-nats-monitor.{namespace}.svc:8222/jsz"
        f"?acc={account}&config=true&consumers=true"
    )
    assert hpa_bounds(release.scaled_object) == (1, 10)


async def test_an_idle_queue_reads_zero_and_keda_does_not_activate(
    pods: natscluster.NatsCluster, trigger: Trigger, queue: Queue
) -> None:
    await queue.settled(pending=0, ack_pending=0)
    reading = Scaler(trigger, network(pods, trigger)).poll()
    assert (reading.lag, reading.active) == (0, False)


async def test_turns_nobody_fetched_count_as_pending_read_from_the_leader(
    pods: natscluster.NatsCluster,
    release: Release,
    trigger: Trigger,
    queue: Queue,
) -> None:
    await queue.publish(25)
    leader = await queue.settled(pending=25, ack_pending=0)
    asked = network(pods, trigger)
    scaler = Scaler(trigger, asked)

    first = scaler.poll()
    service = trigger.endpoint
    assert (first.lag, first.active) == (25, True)
    assert asked.asked[:2] == [jsz(trigger, service), f"http://{service}/varz"]
    assert asked.asked[-1] == jsz(trigger, pod(leader))  # found by its own answer
    asked.asked.clear()
    second = scaler.poll()
    assert second.lag == 25
    assert asked.asked == [jsz(trigger, pod(leader))]  # the leader kept between polls
    bounds = hpa_bounds(release.scaled_object)
    assert desired_replicas(second.lag, lag_threshold=10, current=1, bounds=bounds) == 3


async def test_turns_a_worker_holds_unacked_still_count_until_acked(
    pods: natscluster.NatsCluster, trigger: Trigger, queue: Queue
) -> None:
    await queue.publish(12)
    scaler = Scaler(trigger, network(pods, trigger))
    await queue.settled(pending=12, ack_pending=0)
    assert scaler.poll().lag == 12

    held = await queue.subscription.fetch(5, timeout=10)
    assert len(held) == 5
    await queue.settled(pending=7, ack_pending=5)
    assert scaler.poll().lag == 12

    for msg in held[:3]:
        await msg.ack_sync()
    await queue.settled(pending=7, ack_pending=2)
    assert scaler.poll().lag == 9


async def test_the_lag_is_the_leaders_wherever_the_service_sends_keda_and_after_it_moves(
    pods: natscluster.NatsCluster, trigger: Trigger, queue: Queue
) -> None:
    await queue.publish(7)
    held = await queue.subscription.fetch(2, timeout=10)
    assert len(held) == 2
    leader = await queue.settled(pending=5, ack_pending=2)
    assert own_lag(pods, leader, trigger) == 7
    followers = [name for name in ("n1", "n2", "n3") if name != leader]
    for name in followers:  # a follower's own answer is not the lag: why KEDA finds the leader
        assert own_lag(pods, name, trigger) != 7, name
    asked = network(pods, trigger, first=int(followers[0].removeprefix("n")) - 1)
    scaler = Scaler(trigger, asked)
    assert scaler.poll().lag == 7
    assert asked.asked[-1] == jsz(trigger, pod(leader))

    old, new = await natscluster.step_down(
        queue.admin, protocol.STREAM_TURNS, consumer=protocol.WORKERS_CONSUMER
    )
    assert (old, await queue.settled(pending=5, ack_pending=2)) == (leader, new)
    asked.asked.clear()
    assert scaler.poll().lag == 7
    assert asked.asked[0] == jsz(trigger, pod(old))  # the leader it kept, first
    assert asked.asked[-1] == jsz(trigger, pod(new))


async def test_a_first_installs_trigger_finds_the_consumer_once_the_hook_wrote_the_account(
    pods: natscluster.NatsCluster,
    online_helm: helm.Helm,
    kubectl: Kubectl,
    namespace: str,
    account: str,
    queue: Queue,
) -> None:
    """Rendered before the install's hook writes the server's Secret, the trigger names no
    account: KEDA's build fails and is retried while the Secret is missing, then reads the
    account's key from it and the lag from the consumer's leader; an upgrade renders the same
    objects."""
    secrets = ApiSecrets(kubectl)
    assert secrets(namespace, SERVER_SECRET) is None
    first = render_release(online_helm, namespace)
    with pytest.raises(ScalerError, match="no account name or id given"):
        first.build(secrets)

    write_server_secret(kubectl, namespace, pods)
    built = first.build(secrets)
    assert (built.account, built.account_id) == (account, account)
    await queue.publish(3)
    await queue.settled(pending=3, ack_pending=0)
    assert Scaler(built, network(pods, built)).poll() == Reading(lag=3, active=True)
    assert render_release(online_helm, namespace) == first


REPLICAS = [
    pytest.param(0, 1, 1, id="idle-keeps-the-minimum"),
    pytest.param(10, 1, 1, id="at-target"),
    pytest.param(25, 1, 3, id="25-turns-3-workers"),
    pytest.param(21, 2, 2, id="within-the-10-percent-tolerance"),
    pytest.param(9, 2, 1, id="scale-in-to-one"),
    pytest.param(1000, 3, 10, id="held-at-the-maximum"),
]
"""(lag, current replicas, replicas the HPA asks for) with the chart's lagThreshold 10 and
its bounds 1..10."""


@pytest.mark.parametrize(("lag", "current", "wanted"), REPLICAS)
def test_the_hpa_keda_drives_asks_for_the_lag_over_the_threshold_rounded_up(
    lag: int, current: int, wanted: int, release: Release, trigger: Trigger
) -> None:
    threshold = trigger.lag_threshold
    bounds = hpa_bounds(release.scaled_object)
    assert (threshold, bounds) == (10, (1, 10))
    got = desired_replicas(lag, lag_threshold=threshold, current=current, bounds=bounds)
    assert got == wanted


def test_an_existing_nats_with_credentials_brought_finds_the_server_secret_by_its_name(
    online_helm: helm.Helm, kubectl: Kubectl, namespace: str, pods: natscluster.NatsCluster
) -> None:
    """An existing NATS, the credentials brought and no Secret named: refused while no Secret
    has the name the chart's hook would give it; once ``agentrun nats bootstrap --prefix
    agentrun-nats`` put it there (as earlier charts' lookup expected), the trigger has KEDA
    read its ``account.pub``."""
    values = {
        "worker.autoscaling.keda.enabled": "true",
        "nats.monitoringEndpoint": "nats.nats.svc:8222",
        "nats.auth.operatorSecret": "bus-operator",
        "nats.auth.workerSecret": "bus-worker",
    }

    def render() -> list[Manifest]:
        extra = ["--dry-run=server"]
        return documents(
            online_helm.template(CHART_DIR, namespace=namespace, values=values, extra=extra)
        )

    with pytest.raises(helm.HelmError) as refused:
        render()
    assert "nats.auth.serverSecret" in str(refused.value)
    write_server_secret(kubectl, namespace, pods)
    [auth] = [d for d in render() if d["kind"] == "TriggerAuthentication"]
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "account", "name": SERVER_SECRET, "key": "account.pub"}
    ]
