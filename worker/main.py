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
from agentrun.tools import default_catalog

from .consumer import ConsumerSettings, TurnConsumer
from .model import ModelClient
from .secrets import KubeSecrets
from .toolrunner import ToolRunSettings
from .turn import TurnDeps

log = logging.getLogger("agentrun.worker")


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


async def _connect(url: str, role: str) -> nats.aio.client.Client:
    return await nats.connect(
        url,
        name=f"agentrun-worker-{os.getpid()}-{role}",
        connect_timeout=5,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
    )


async def serve() -> None:
    """Run one worker until SIGTERM/SIGINT."""
    url = os.environ.get("AGENTRUN_NATS_URL", "nats://127.0.0.1:4222")
    ack_wait = _env_float("AGENTRUN_TURN_ACK_WAIT", 30.0)
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
            concurrency=int(_env_float("AGENTRUN_TOOL_CONCURRENCY", 4)),
            call_timeout=_env_float("AGENTRUN_TOOL_TIMEOUT", 60.0),
            max_result_bytes=int(_env_float("AGENTRUN_TOOL_RESULT_MAX_BYTES", 16_384)),
        ),
        kube=api,
    )
    hold_ttl = _env_float("AGENTRUN_HOLD_TTL", 60.0)
    consumer = TurnConsumer(
        bus,
        deps,
        ConsumerSettings(
            concurrency=int(_env_float("AGENTRUN_WORKER_CONCURRENCY", 64)),
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
    logging.basicConfig(
        level=os.environ.get("AGENTRUN_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    telemetry.setup_tracing("agentrun-worker")
    port = int(os.environ.get("AGENTRUN_METRICS_PORT", "0") or 0)
    if port:
        start_http_server(port, addr=os.environ.get("AGENTRUN_METRICS_ADDR", "0.0.0.0"))
    asyncio.run(serve())
