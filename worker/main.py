"""Process wiring of ``agentrun-worker``: the shared start-up, the turn consumer, the probes,
serve until SIGTERM/SIGINT, then drain."""

from __future__ import annotations

import contextlib
import logging
import os

from kubernetes_asyncio.client import ApiClient

from agentrun import healthserver, kube, process
from agentrun.bus import Bus, BusSettings, connect_nats
from agentrun.ledger import LedgerStore
from agentrun.natsclient import close_nats
from agentrun.settings import WorkerSettings
from agentrun.tools import default_catalog, sessions
from agentrun.trust import Verifier, trust_file

from .consumer import ConsumerSettings, TurnConsumer
from .effects import EffectLedger
from .model import ModelClient
from .secrets import KubeSecrets
from .toolrunner import ToolRunSettings
from .turn import TurnDeps

log = logging.getLogger("agentrun.worker")


async def serve(config: WorkerSettings) -> None:
    """Run one worker until SIGTERM/SIGINT, then drain: the turns it holds get
    ``config.drain_seconds`` to commit before the rest are handed back. Raises ``ValueError``
    (no trust file set), ``OSError`` and ``trust.KeyFileError`` (it cannot be read) before
    connecting anywhere."""
    seals = Verifier(trust_file(config.trust_path()))
    url = config.nats_url
    bus = await Bus.connect(  # binds what the operator provisions; creates nothing
        BusSettings(url=url, auth=config.nats_auth, ack_wait=config.turn_ack_wait),
        name=f"agentrun-worker-{os.getpid()}",
        provision=False,
    )
    api = await _kube_api()
    deps = await _turn_deps(config, bus=bus, api=api)
    # its own connection: 30 KB ledger writes must not queue ahead of fetches and acks
    ledger_nc = await connect_nats(
        url, name=f"agentrun-worker-{os.getpid()}-ledger", auth=config.nats_auth
    )
    consumer = TurnConsumer(
        bus,
        deps,
        _consumer_settings(config),
        seals=seals,
        ledger=await LedgerStore.open(ledger_nc.jetstream(), create=False),
    )
    process.stop_on_signals(consumer.stop)
    probes = None
    if config.health_port:  # answered by this loop: a stuck loop fails the liveness probe
        answer = healthserver.probe_answer(
            alive="ok", ready=lambda: "draining" if consumer.draining else None
        )
        probes = await healthserver.serve(answer, host=config.metrics_addr, port=config.health_port)
    log.info("worker %d serving turns from %s", os.getpid(), url)
    try:
        await consumer.run()
    finally:
        if probes is not None:
            probes.close()
        if deps.mcp_sessions is not None:  # each session closed by the task that opened it
            await deps.mcp_sessions.aclose()
        await deps.model.close()
        await bus.close()
        with contextlib.suppress(Exception):
            await close_nats(ledger_nc)
        if api is not None:
            with contextlib.suppress(Exception):
                await api.close()
        log.info("worker %d stopped", os.getpid())


def _consumer_settings(config: WorkerSettings) -> ConsumerSettings:
    """The turn consumer's concurrency, beats, drain time, per-run event bound and turn
    memory."""
    return ConsumerSettings(
        concurrency=config.worker_concurrency,
        # one beat refreshes both the JetStream delivery and the ledger hold
        heartbeat=max(0.5, min(config.turn_ack_wait, config.hold_ttl) / 3),
        hold_ttl=config.hold_ttl,
        drain=config.drain_seconds,
        run_event_max_bytes=config.run_event_max_bytes,
        turn_memory_bytes=config.worker_turn_memory_bytes,
        turn_memory_shares=config.worker_turn_memory_shares,
    )


async def _kube_api() -> ApiClient | None:
    """The Kubernetes client, or ``None`` (logged) when there is no cluster access."""
    try:
        return await kube.api_client(trust_env=False, request_timeout=kube.REQUEST_TIMEOUT)
    except Exception as err:  # a worker without cluster access can still run cluster-free tools
        log.warning(
            "no Kubernetes access (%s): kubernetes_get and Secret credentials are unavailable", err
        )
        return None


async def _turn_deps(config: WorkerSettings, *, bus: Bus, api: ApiClient | None) -> TurnDeps:
    """What every turn uses: the model client, the tool catalog, Secrets, the effect ledger,
    the process's pool of reused MCP sessions."""
    secrets = KubeSecrets(api)
    return TurnDeps(
        model=ModelClient(),
        catalog=default_catalog(
            kube=api,
            prometheus_url=config.prometheus_url,
            prometheus_scope_label=config.prometheus_scope_label,
        ),
        secrets=secrets,
        tool_settings=ToolRunSettings(
            concurrency=config.tool_concurrency,
            call_timeout=config.tool_timeout,
            max_call_timeout=config.tool_timeout_max,
            max_result_bytes=config.tool_result_max_bytes,
            retries=config.tool_retries,
        ),
        kube=api,
        headers=secrets,
        effects=await EffectLedger.open(bus.js, entry_cap=bus.event_cap, create=False),
        mcp_sessions=sessions.SessionPool(),
        message_cap=bus.event_cap,
    )


def main() -> None:
    """Console script ``agentrun-worker``."""
    config = process.start(WorkerSettings, service="agentrun-worker")
    process.run(serve(config))
