"""Process wiring of ``agentrun-operator``: probes, the CRD check, the leader Lease, then kopf.

Order at start-up: serve ``/healthz`` and ``/readyz`` (``AGENTRUN_HEALTH_PORT``); wait until
the installed CRDs serve what this operator writes (not ready until then, touching nothing);
wait for the leader Lease (a standby stops here); then run kopf, whose start-up handler starts
every other part (event consumer, queue pumps, ledger sweep). So a standby runs no handler, no
consumer and no loop. A leader that cannot renew its Lease exits at once (status 70) without
flushing anything: the next leader rebuilds its view from the run event streams. A graceful
stop (SIGTERM) ends kopf, then releases the Lease so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time

import kopf

from agentrun import metrics, process, trust
from agentrun.settings import OperatorSettings

from . import crdcheck, handlers, wiring
from .platform import health, leadership
from .platform.kubeapi import Kube

log = logging.getLogger(__name__)

LOST_LEADERSHIP_EXIT = 70
"""Exit status of a leader that lost its Lease (EX_SOFTWARE): its supervisor restarts it."""


def main() -> None:
    """Console script ``agentrun-operator``: watch AgentRuns in every namespace.

    kopf installs its own SIGTERM/SIGINT handling (a graceful stop of every handler) once this
    process leads; before that, a stop signal ends the process at once.
    """
    config = process.start(OperatorSettings, service="agentrun-operator")
    # the run-signing keys are read before anything else: no operator runs without them
    trust.signing_file(config.signing_path())
    trust.trust_file(config.trust_path())
    metrics.export_operator()  # agentrun_operator_leader 0 until it leads
    metrics.export_store_limit(config.jetstream_store_bytes)
    assert handlers.REGISTERED  # the import registers the handlers with kopf
    process.run(run(config))


def identity(settings: OperatorSettings) -> str:
    """This process's name in the Lease: ``AGENTRUN_IDENTITY``, else ``<hostname>-<pid>``."""
    return settings.identity or f"{socket.gethostname()}-{os.getpid()}"


async def run(settings: OperatorSettings) -> None:
    """Probes, CRD check, leader election, kopf; returns after a graceful stop."""
    probes = health.Health()
    server = None
    if settings.health_port:
        server = await health.serve(probes, host=settings.metrics_addr, port=settings.health_port)
    current = asyncio.current_task()
    assert current is not None
    process.stop_on_signals(functools.partial(_cancel, current))  # kopf's replaces it
    api = await Kube.connect()
    try:
        await crdcheck.wait_until_served(
            api, interval=settings.crd_check_interval, on_ready=probes.set_ready, clock=time.time
        )
        elector = leadership.LeaderElector(
            leadership.KubeLeases(
                api, namespace=settings.lease_namespace, name=settings.lease_name
            ),
            identity=identity(settings),
            timing=leadership.LeaseTiming(
                settings.lease_duration, settings.lease_renew_deadline, settings.lease_retry
            ),
        )
        await elector.acquire()
        probes.role = "leader"
        metrics.lead()
        await _lead(settings, elector)
    except asyncio.CancelledError:
        log.info("stopped before leading")
    finally:
        await api.close()
        if server is not None:
            server.close()


def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()


async def _lead(settings: OperatorSettings, elector: leadership.LeaderElector) -> None:
    memo = wiring.OperatorMemo(settings)
    operator = asyncio.create_task(
        kopf.operator(clusterwide=True, standalone=True, memo=memo), name="kopf"
    )
    holding = asyncio.create_task(elector.hold(), name="lease")
    done, _ = await asyncio.wait({operator, holding}, return_when=asyncio.FIRST_COMPLETED)
    if holding in done:
        log.critical("lost the leader Lease; exiting so that only the new leader acts")
        logging.shutdown()
        os._exit(LOST_LEADERSHIP_EXIT)
    holding.cancel()  # and wait for it: a renewal in flight must not race the release
    await asyncio.gather(holding, return_exceptions=True)
    await elector.release()
    operator.result()  # kopf's own failure, if any, ends the process with it
