"""The operator's HTTP probe endpoints: ``/healthz`` (the process serves) and ``/readyz``.

``/readyz`` answers 200 only once the installed CRDs serve what this operator writes (see
``crdcheck``), 503 with the reason before; a standby that waits for the leader Lease is ready
(it takes over without a restart). The body names the role (``leader`` or ``standby``).

What belongs here: the state the probes report. The HTTP server is ``agentrun.healthserver``,
served by the operator's own event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses

from agentrun import healthserver, metrics


@dataclasses.dataclass
class Health:
    """What the probes report; mutated by ``main`` as start-up proceeds."""

    ready: bool = False
    reason: str = "checking the installed CRDs"
    role: str = "standby"

    def set_ready(self, ready: bool) -> None:
        """Record the outcome of the CRD check (and show it as ``agentrun_crd_mismatch``)."""
        metrics.CRD_MISMATCH.set(0 if ready else 1)
        self.ready = ready
        self.reason = "" if ready else "the installed CRDs do not serve what this operator writes"

    def answer(self, path: str) -> tuple[int, str]:
        """(HTTP status, body) for a GET of ``path``."""
        if path == "/healthz":
            return 200, f"ok {self.role}\n"
        if path == "/readyz":
            if self.ready:
                return 200, f"ready {self.role}\n"
            return 503, f"not ready: {self.reason}\n"
        return 404, "not found\n"


async def serve(health: Health, *, host: str, port: int) -> asyncio.Server:
    """Serve ``health`` on ``host:port`` from the operator's event loop
    (``agentrun.healthserver``); raises ``OSError`` if the port cannot be bound."""
    return await healthserver.serve(health.answer, host=host, port=port)
