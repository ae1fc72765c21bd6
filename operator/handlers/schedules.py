"""kopf entry points of the CronAgentRun controller: they only tell it what changed.

Every CronAgentRun as listed and on each change goes to ``ScheduleController.observe``; a
deleted one to ``forget``; a run it created that ends or is deleted goes to ``run_changed``
(``runs.owned_run_changed``, shared with the AgentEval controller). None of
these handlers adds a finalizer or writes to the object: a CronAgentRun deletes with no operator
running, and its runs follow through their ownerReferences.
"""

from __future__ import annotations

from typing import Any

import kopf

from agentrun import kube

from ..schedules.spec import CRONS
from ..wiring import OperatorMemo

CRON = (kube.GROUP, kube.VERSION, CRONS)


@kopf.on.event(*CRON)
async def cron_changed(
    *,
    type: str | None,
    body: kopf.Body,
    namespace: str | None,
    name: str,
    memo: OperatorMemo,
    **_: Any,
) -> None:
    """A CronAgentRun appeared, changed or was deleted; its namespace's tenant is learnt first
    (``Tenants.learn``): its schedules take their tenant's turns (``Tenants.party``)."""
    parts = memo.running()
    if type == "DELETED":
        parts.schedules.forget(str(namespace), name)
        return
    await parts.tenants.tenants.learn(str(namespace))
    parts.schedules.observe(body)
