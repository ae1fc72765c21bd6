"""Process wiring of ``agentrun-operator``: logging, metrics port, kopf's operator loop."""

from __future__ import annotations

import asyncio
import logging

import kopf
from prometheus_client import start_http_server

from agentrun import telemetry
from agentrun.settings import OperatorSettings

from . import handlers, wiring


def main() -> None:
    """Console script ``agentrun-operator``: watch AgentRuns in every namespace."""
    config = OperatorSettings()
    logging.basicConfig(
        level=config.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    telemetry.setup_tracing("agentrun-operator")
    if config.metrics_port:
        start_http_server(config.metrics_port, addr=config.metrics_addr)
    assert handlers.RUN  # the import registers the handlers with kopf
    memo = wiring.OperatorMemo(config)
    asyncio.run(kopf.operator(clusterwide=True, standalone=True, memo=memo))
