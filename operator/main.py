"""Process wiring of ``agentrun-operator``: the shared start-up, then kopf's operator loop."""

from __future__ import annotations

import asyncio

import kopf

from agentrun import process
from agentrun.settings import OperatorSettings

from . import handlers, wiring


def main() -> None:
    """Console script ``agentrun-operator``: watch AgentRuns in every namespace.

    kopf installs its own SIGTERM/SIGINT handling (a graceful stop of every handler).
    """
    config = process.start(OperatorSettings, service="agentrun-operator")
    assert handlers.RUN  # the import registers the handlers with kopf
    memo = wiring.OperatorMemo(config)
    asyncio.run(kopf.operator(clusterwide=True, standalone=True, memo=memo))
