"""Process wiring of ``agentrun-operator``: logging, metrics port, kopf's operator loop."""

from __future__ import annotations

import asyncio
import logging
import os

import kopf
from prometheus_client import start_http_server

from agentrun import telemetry

from . import handlers


def main() -> None:
    """Console script ``agentrun-operator``: watch AgentRuns in every namespace."""
    logging.basicConfig(
        level=os.environ.get("AGENTRUN_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "httpx2", "openai"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    telemetry.setup_tracing("agentrun-operator")
    port = int(os.environ.get("AGENTRUN_METRICS_PORT", "0") or 0)
    if port:
        start_http_server(port, addr=os.environ.get("AGENTRUN_METRICS_ADDR", "0.0.0.0"))
    assert handlers.RUN  # the import registers the handlers with kopf
    asyncio.run(kopf.operator(clusterwide=True, standalone=True))
