"""A long pass shows its progress: when a raised ``maxConcurrentRuns`` lets one pass admit
thousands of queued runs (minutes at 10,000), the queue board, and so the AgentTenant's
``queuedRuns``, follows the count as runs leave the queue, batch by batch, instead of showing
the count the pass started from until it ends. Against the real nats-server's ledger; the
smallest size that shows it is two admission batches and one run more."""

from __future__ import annotations

import time
import uuid

from kube_support import FakeKube
from nats.aio.client import Client as NATS

from agentrun.ledger import LedgerStore
from agentrun.operator.admission.pump import ADMIT_BATCH, PumpDeps, QueuePump
from agentrun.operator.admission.queue import QueueBoard
from agentrun.operator.admission.queuestatus import QueueStatus
from agentrun.operator.admission.settlement import RunSettlement
from agentrun.operator.admission.storage import EventStorage
from agentrun.operator.platform.events import EventRecorder, Throttle
from agentrun.operator.tenants import TenantPolicy
from agentrun.protocol import RunConfig

from .test_poison import Configs, Runs, enqueue, registry


async def test_a_pass_admitting_batch_after_batch_shows_the_queue_shrinking_as_it_goes(
    client: NATS,
) -> None:
    obj = {
        "metadata": {"name": f"t-{uuid.uuid4().hex[:8]}", "generation": 1},
        "spec": {"namespaces": ["ns"], "maxConcurrentRuns": 1000},
    }
    tenant = TenantPolicy.of(obj)
    board = QueueBoard()
    seen: dict[str, int] = {}

    def note(config: RunConfig) -> None:  # what the board says while this run starts
        seen[config.name] = board.queued(tenant.name)

    runs, api = Runs(lambda config: note(config)), FakeKube()
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    store = await LedgerStore.open(client.jetstream())
    pump = QueuePump(
        PumpDeps(
            store=store,
            tenants=registry(api, obj),
            configs=Configs(lambda name: None),  # type: ignore[arg-type]
            runs=runs,
            shown=QueueStatus(runs, runs, events, time.time),
            settlement=RunSettlement(store, board),
            board=board,
            api=api,
            events=events,
            storage=EventStorage(limit=256 * 1024 * 1024),
        )
    )
    total = 2 * ADMIT_BATCH + 1
    names = [f"r{i:03d}" for i in range(total)]
    await enqueue(pump, tenant, *names)
    await pump.pump_queue(tenant.name)  # one pass admits all three batches
    assert runs.started == names
    assert {seen[n] for n in names[:ADMIT_BATCH]} == {0}  # never pumped yet: nothing shown
    assert {seen[n] for n in names[ADMIT_BATCH : 2 * ADMIT_BATCH]} == {total - ADMIT_BATCH}
    assert seen[names[-1]] == 1
    assert board.queued(tenant.name) == 0 and board.blocked(tenant.name) is None
