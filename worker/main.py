"""Process wiring of ``agentrun-worker``: settings from the environment, signals, serve."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

import nats
import nats.aio.client
from prometheus_client import start_http_server

from agentrun import kube, telemetry
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import LedgerStore
from agentrun.settings import WorkerSettings
from agentrun.tools import default_catalog

from .consumer import ConsumerSettings, TurnConsumer
from .model import ModelClient
from .secrets import KubeSecrets
from .toolrunner import ToolRunSettings
from .turn import TurnDeps

log = logging.getLogger("agentrun.worker")


async def _connect(url: str, role: str) -> nats.aio.client.Client:
    return await nats.connect(
        url,
        name=f"agentrun-worker-{os.getpid()}-{role}",
        connect_timeout=5,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
    )


async def serve(config: WorkerSettings) -> None:
    """Run one worker until SIGTERM/SIGINT."""
    url = config.nats_url
    ack_wait = config.turn_ack_wait
    bus = await Bus.connect(
        BusSettings(url=url, ack_wait=ack_wait), name=f"agentrun-worker-{os.getpid()}"
    )
    api = None
    try:
        api = await kube.api_client()
    except Exception as err:  # a worker without cluster access can still run cluster-free tools
        log.warning(
            "no Kubernetes access (%s): kubernetes_get and Secret credentials are unavailable", err
        )
    model = ModelClient()
    deps = TurnDeps(
        model=model,
        catalog=default_catalog(kube=api),
        secrets=KubeSecrets(api),
        tool_settings=ToolRunSettings(
            concurrency=config.tool_concurrency,
            call_timeout=config.tool_timeout,
            max_result_bytes=config.tool_result_max_bytes,
        ),
        kube=api,
    )
    hold_ttl = config.hold_ttl
    consumer = TurnConsumer(
        bus,
        deps,
        ConsumerSettings(
            concurrency=config.worker_concurrency,
            # one beat refreshes both the JetStream delivery and the ledger hold
            heartbeat=max(0.5, min(ack_wait, hold_ttl) / 3),
            hold_ttl=hold_ttl,
        ),
        # its own connection: 30 KB ledger writes must not queue ahead of fetches and acks
        ledger=await LedgerStore.open((await _connect(url, "ledger")).jetstream()),
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, consumer.stop)
    log.info("worker %d serving turns from %s", os.getpid(), url)
    try:
        await consumer.run()
    finally:
        await model.close()
        await bus.close()
        if api is not None:
            with contextlib.suppress(Exception):
                await api.close()


def main() -> None:
    """Console script ``agentrun-worker``."""
    config = WorkerSettings()
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    telemetry.setup_tracing("agentrun-worker")
    if config.metrics_port:
        start_http_server(config.metrics_port, addr=config.metrics_addr)
    asyncio.run(serve(config))
