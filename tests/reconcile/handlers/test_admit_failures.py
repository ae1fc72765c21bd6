"""The AgentRun create handler ends a run whose admission can never succeed, instead of kopf
retrying it for ever: a resolved spec the API server refuses to record ends ``invalid_spec``;
a failure that passes is retried by kopf."""

from __future__ import annotations

import types
from typing import Any

import kopf
import pytest
from kube_support import FakeKube

from agentrun import kernel
from agentrun.operator.admission.fairgate import AdmissionGate
from agentrun.operator.handlers import admission as handlers
from agentrun.operator.platform.shards import ALL_OF_ONE, Ownership, shard_of
from agentrun.operator.runs import RunKey

RUN = RunKey("ns", "r", "uid-r")
AGENT = {
    "metadata": {"name": "calc", "namespace": "ns", "generation": 1},
    "spec": {"model": "mock", "instructions": "Use calculate.", "tools": ["calculate"]},
}


class Shown:
    def __init__(self) -> None:
        self.ended: list[tuple[kernel.Phase, str]] = []
        self.handed: list[tuple[RunKey, str]] = []

    def end_unadmitted(self, key: RunKey, phase: kernel.Phase, message: str, **_: Any) -> None:
        self.ended.append((phase, message))

    def hand_over(self, key: RunKey, tenant: str, *, generation: int, since: float) -> None:
        self.handed.append((key, tenant))


class Tenants:
    async def resolve(self, namespace: str) -> Any:
        return types.SimpleNamespace(name="t")

    def falls_back(self, policy: Any, namespace: str) -> bool:
        return False


def parts(api: FakeKube) -> tuple[Any, Shown]:
    shown = Shown()
    handling = types.SimpleNamespace(api=api, shown=shown, tenants=Tenants(), ownership=ALL_OF_ONE)
    return handling, shown


async def admit(handling: Any) -> None:
    spec = {"agentRef": {"name": "calc"}, "goal": "add"}
    await handlers._validate_and_enqueue(handling, RUN, spec=spec, meta={}, status={})  # type: ignore[arg-type]


async def test_a_resolution_the_api_server_refuses_to_record_ends_invalid_spec() -> None:
    api = FakeKube()
    api.put("agents", AGENT)
    api.fail("patch_status", 413, "Request Entity Too Large")
    handling, shown = parts(api)
    await admit(handling)
    ((phase, message),) = shown.ended
    assert phase is kernel.Phase.INVALID_SPEC
    assert message.startswith("spec.agentRef: the resolved spec cannot be recorded")
    assert "HTTP 413" in message


async def test_a_resolution_that_cannot_be_recorded_now_is_retried_by_kopf() -> None:
    api = FakeKube()
    api.put("agents", AGENT)
    api.fail("patch_status", 503, "Unavailable")
    handling, shown = parts(api)
    with pytest.raises(kopf.TemporaryError):
        await admit(handling)
    assert shown.ended == []


class Broken:
    """Live runs whose recovery raises ``error`` (a bug, or NATS away)."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def recover(
        self, namespace: str, name: str, uid: str, *, generation: int, reruns: int = 0
    ) -> bool:
        raise self.error


async def create(error: Exception, *, retry: int) -> Shown:
    shown = Shown()
    handling = types.SimpleNamespace(runs=Broken(error), shown=shown, gate=AdmissionGate())
    memo = types.SimpleNamespace(running=lambda: types.SimpleNamespace(runs=handling))
    await handlers.admit_run(
        spec={"model": "mock", "goal": "g"},  # type: ignore[arg-type]
        meta={"generation": 1},  # type: ignore[arg-type]
        status={},  # type: ignore[arg-type]
        namespace=RUN.namespace,
        name=RUN.name,
        uid=RUN.uid,
        retry=retry,
        memo=memo,  # type: ignore[arg-type]
    )
    return shown


async def test_a_create_that_fails_for_good_is_retried_once_then_ends_checkpoint_failed() -> None:
    with pytest.raises(kopf.TemporaryError):
        await create(KeyError("phase"), retry=0)
    shown = await create(KeyError("phase"), retry=1)
    ((phase, message),) = shown.ended
    assert phase is kernel.Phase.CHECKPOINT_FAILED
    assert message == "admission failed twice, not for a passing reason: KeyError: 'phase'"


async def test_a_create_that_fails_for_a_passing_reason_is_retried_by_kopf_for_ever() -> None:
    for retry in (0, 1, 50):
        with pytest.raises(kopf.TemporaryError):
            await create(ConnectionResetError("NATS away"), retry=retry)


def elsewhere() -> Any:
    """Parts of a process that does not own tenant ``t``'s shard (it owns ``was``'s)."""
    shards = next(n for n in range(2, 64) if shard_of("t", n) != shard_of("was", n))
    handling, _ = parts(FakeKube())
    handling.ownership = Ownership(shards=shards, owned=frozenset({shard_of("was", shards)}))
    return handling


async def test_a_resumed_queued_run_bound_to_another_shards_tenant_is_handed_over() -> None:
    """Its queue's pump stopped before it handed the run over (``QueuePump._hand_over``): the
    status naming ``was`` keeps the run here, where kopf retried it for ever."""
    handling = elsewhere()
    status = {"phase": "Queued", "tenant": "was", "queuePosition": 1}
    spec = {"agentRef": {"name": "calc"}, "goal": "add"}
    await handlers._validate_and_enqueue(
        handling,
        RUN,
        spec=spec,  # type: ignore[arg-type]
        meta={},  # type: ignore[arg-type]
        status=status,  # type: ignore[arg-type]
    )
    assert handling.shown.handed == [(RUN, "t")] and handling.shown.ended == []


async def test_a_new_run_whose_namespace_binds_another_shards_tenant_waits_for_its_owner() -> None:
    handling = elsewhere()
    with pytest.raises(kopf.TemporaryError, match="another operator shard"):
        await admit(handling)
    assert handling.shown.handed == []
