"""Zero trust in what a run's subject holds, on the operator's side: seal what the operator
appends, judge what it reads, re-seal the runs admitted before seals, report refusals.

The operator is the only holder of the run-signing key. It seals every ``admitted`` event (the
run's whole config) and every reviewer's ``approval`` it appends, and it follows a run only
through a config whose seal verifies for that run's subject (``trust.Verifier``): an event it
did not seal — a forged admission on a new subject, a second admission of a running run with
another config, a forged approval — is refused. A refused run ends ``checkpoint_failed`` (its
checkpoint, the event stream, holds what the operator did not write; no other reason of the
closed vocabulary says so), with a ``MessageRefused`` Warning Event on the AgentRun and
``agentrun_messages_refused_total{reason}`` counting the message.

Runs admitted before seals existed (an upgrade from an open bus) have an unsealed first
admission. Such a run is re-sealed once — the operator appends the same config under its seal,
and the run goes on — only when the API server vouches for it: the AgentRun with that uid exists
and its status, which only the operator writes, shows it admitted on this stream and running
(``vouched``). Anything else unsealed is refused.

What belongs here: those judgements and their report. What does not: consuming events and
acting on them (``dispatch``), the signature arithmetic (``agentrun.trust``).
"""

from __future__ import annotations

import logging

from agentrun import metrics
from agentrun.protocol import RunEvent
from agentrun.trust import SealFault, Signer, Untrusted, Verifier, refusal

from ..platform.events import EventRecorder, EventType
from ..platform.kubeapi import KubeApi
from .keys import RunKey
from .news import involved

log = logging.getLogger(__name__)

REFUSED_REASON = "MessageRefused"
"""The Warning Event's reason when a run's event is refused."""
VOUCHING_PHASES = frozenset({"Running", "AwaitingApproval"})
"""Phases of an AgentRun's status that show an admitted run still going."""


class RunSeals:
    """The operator's seals: signing, judging, vouching for runs from before seals, reporting."""

    def __init__(
        self, signer: Signer, verifier: Verifier, *, api: KubeApi, events: EventRecorder
    ) -> None:
        """``signer``: seals with the operator's key; ``verifier``: the trusted keys; ``api``:
        reads an AgentRun's status (``vouched``); ``events``: where refusals are told."""
        self.signer = signer
        self.verifier = verifier
        self.api = api
        self.events = events

    def seal(self, event: RunEvent) -> RunEvent:
        """``event`` (``admitted`` or ``approval``) with the operator's seal."""
        return self.signer.seal_event(event)

    def fault(self, event: RunEvent, *, key: RunKey) -> SealFault | None:
        """Why ``event`` is not the operator's for run ``key`` (its subject's namespace and
        name, its uid), or ``None``. Events of kinds that carry no seal are never refused."""
        if event.kind not in ("admitted", "approval"):
            return None
        if event.run_uid != key.uid:
            return SealFault.WRONG_RUN
        return self.verifier.event_fault(event, namespace=key.namespace, name=key.name)

    def readmission_fault(
        self, event: RunEvent, *, key: RunKey, first: RunEvent | None
    ) -> SealFault | None:
        """Why an ``admitted`` event after the run's ``first`` is refused: unless it is the
        operator's seal of the very config of ``first`` (a re-seal), it is."""
        fault = self.fault(event, key=key)
        if fault is not None:
            return fault
        if first is None or first.config != event.config:
            return SealFault.CHANGED_CONFIG
        return None

    async def vouched(self, key: RunKey, first: RunEvent) -> bool:
        """Whether the API server vouches for ``first``, an unsealed admission of run ``key``
        written before seals existed: the AgentRun with that uid exists, its status shows it
        running (``VOUCHING_PHASES``), of the config's tenant, with events up to at least
        ``first``'s sequence. Raises ``ApiError`` when the API server cannot be asked."""
        obj = await self.api.get(key.ref)
        if obj is None or (obj.get("metadata") or {}).get("uid") != key.uid:
            return False
        status = obj.get("status") or {}
        tenant = first.config.tenant if first.config is not None else None
        try:
            seen = int(status.get("lastEventSequence") or 0)
        except (TypeError, ValueError):
            return False
        return (
            status.get("phase") in VOUCHING_PHASES
            and status.get("tenant") == tenant
            and seen >= first.seq > 0
        )

    def report(self, key: RunKey, error: Untrusted) -> str:
        """Count the refused message and tell it as a Warning Event on the AgentRun; returns
        the message the run ends with."""
        metrics.record_refusal(error.fault)
        message = f"refused: {error}; nothing of it was acted on"
        log.warning("run %s/%s: %s", key.namespace, key.name, message)
        self.events.record(
            involved(key),
            type=EventType.WARNING,
            reason=REFUSED_REASON,
            message=message,
            key=(key.uid, REFUSED_REASON, error.fault.value),
        )
        return message


def untrusted(event: RunEvent, fault: SealFault) -> Untrusted:
    """The refusal of ``event`` for ``fault``."""
    return Untrusted(fault, refusal(event, fault))
