"""A tenant's namespaces share one bucket of the operator's Events: a tenant spread over ten
namespaces that flood cannot take the whole rate, and another tenant's namespace, far under
its share, still has every one of its Events posted."""

from __future__ import annotations

import itertools

from kube_support import FakeKube

from agentrun.operator.platform.events import EventRecorder, EventType, Involved, standard_throttle
from agentrun.operator.tenants.registry import Tenants


async def test_a_tenant_over_ten_namespaces_floods_its_own_share_not_the_whole() -> None:
    tenants = Tenants(FakeKube(), default="fallback")
    spread = [f"big-{i}" for i in range(10)]
    tenants.put({"metadata": {"name": "fallback"}, "spec": {}})
    tenants.put({"metadata": {"name": "big"}, "spec": {"namespaces": spread}})
    tenants.put({"metadata": {"name": "small"}, "spec": {"namespaces": ["small"]}})
    for namespace in [*spread, "small", "team-x", "team-y"]:
        await tenants.resolve(namespace)  # as a run or a tool server there is admitted
    assert tenants.party("big-3") == tenants.party("big-7") == "tenant/big"
    assert tenants.party("unresolved") == "unresolved"
    assert tenants.party("team-x") == "team-x"  # the default tenant's: each its own
    clock = [1000.0]
    recorder = EventRecorder(
        FakeKube(),
        throttle=standard_throttle(),
        clock=lambda: clock[0],
        share_of=tenants.party,
    )
    names = itertools.count()

    def record(namespace: str) -> None:
        involved = Involved("AgentRun", f"r{next(names)}", namespace, "uid")
        recorder.record(involved, type=EventType.WARNING, reason="InvalidSpec", message="no")

    asked = 0
    for tick in range(600):  # 60 s in steps of 0.1 s
        clock[0] = 1000.0 + tick / 10
        for namespace in spread:  # runs failing all the time in each
            record(namespace)
        if tick % 10 == 5:  # one a second, half a namespace's share
            before = recorder.dropped
            record("small")
            asked += 1
            assert recorder.dropped == before, f"small's Event {asked} was dropped"
