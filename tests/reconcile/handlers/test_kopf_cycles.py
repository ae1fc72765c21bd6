"""An AgentRun's watch events through kopf's own processing (``process_resource_event``) with
the operator's storages (``startup.RunDiffBaseStorage`` over ``runs.handled``, kopf's
annotations for a handler's progress): which handlers kopf calls, and what it writes to the
object. Handlers shaped as the operator's (``admit_run`` on create and resume, ``cancel_run``
on update with ``agentrun.dev/cancel: "true"``) record their calls; kopf's PATCHes are
recorded and applied to the object."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import patching
from kopf._cogs.structs import ephemera, references
from kopf._core.actions import application, lifecycles
from kopf._core.engines import indexing
from kopf._core.reactor import inventory, processing

from agentrun.operator.handlers.startup import RunDiffBaseStorage
from agentrun.operator.runs.handled import HandledActions

RESOURCE = references.Resource(
    group="agentrun.dev", version="v1alpha1", plural="agentruns", namespaced=True
)
CANCEL = "agentrun.dev/cancel"
RUNNING = {"phase": "Running", "tenant": "t"}
ENDED = {"phase": "Failed", "terminalReason": "cancelled", "tenant": "t"}


class Cycles:
    """One AgentRun object, the operator's kopf settings and two recording handlers."""

    def __init__(self, obj: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
        self.obj = obj
        self.calls: list[str] = []
        self.patches: list[dict[str, Any]] = []
        self.on_admit: Callable[[], None] | None = None
        self.registry = kopf.OperatorRegistry()
        self.settings = kopf.OperatorSettings()
        self.settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix="kopf.agentrun.dev"
        )
        self.handled = HandledActions()
        self.settings.persistence.diffbase_storage = RunDiffBaseStorage(self.handled)
        self.memories = inventory.ResourceMemories()
        group, version, plural = RESOURCE.group, RESOURCE.version, RESOURCE.plural

        @kopf.on.create(group, version, plural, registry=self.registry, id="admit_run")
        @kopf.on.resume(group, version, plural, registry=self.registry, id="admit_run")
        async def admit_run(retry: int, **_: Any) -> None:
            self.calls.append(f"admit_run retry={retry}")
            act, self.on_admit = self.on_admit, None
            if act is not None:
                act()

        @kopf.on.update(
            group, version, plural, registry=self.registry, annotations={CANCEL: "true"}
        )
        async def cancel_run(**_: Any) -> None:
            self.calls.append("cancel_run")

        async def patch_obj(*, patch: kopf.Patch, **_: Any) -> tuple[dict[str, Any], None]:
            self.patches.append(copy.deepcopy(dict(patch)))
            annotations = self.obj["metadata"]["annotations"]
            for key, value in patch.get("metadata", {}).get("annotations", {}).items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
            return copy.deepcopy(self.obj), None

        monkeypatch.setattr(patching, "patch_obj", patch_obj)
        monkeypatch.setattr(application.patching, "patch_obj", patch_obj)

    async def event(self, type: str | None = "MODIFIED") -> None:
        """kopf handles the object as it is now (``type`` None: as listed at start-up)."""
        async with asyncio.timeout(5):
            await processing.process_resource_event(
                lifecycle=lifecycles.asap,
                indexers=indexing.OperatorIndexers(),
                registry=self.registry,
                settings=self.settings,
                memories=self.memories,
                memobase=ephemera.Memo(),
                resource=RESOURCE,
                raw_event={"type": type, "object": copy.deepcopy(self.obj)},  # type: ignore[typeddict-item]
                event_queue=asyncio.Queue(),
            )


def run(annotations: dict[str, str] | None = None, status: dict[str, Any] | None = None) -> Any:
    obj: dict[str, Any] = {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "AgentRun",
        "metadata": {
            "name": "r",
            "namespace": "ns",
            "uid": "u-1",
            "resourceVersion": "1",
            "annotations": dict(annotations or {}),
        },
        "spec": {"model": "m", "goal": "g"},
    }
    if status is not None:
        obj["status"] = status
    return obj


async def test_a_run_admitted_at_once_is_never_written_by_kopf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kopf_ = Cycles(run(), monkeypatch)
    await kopf_.event("ADDED")
    await kopf_.event()  # the operator's admission record
    kopf_.obj["status"] = RUNNING
    await kopf_.event()
    assert kopf_.calls == ["admit_run retry=0"]
    assert kopf_.patches == []
    assert len(kopf_.handled) == 0


async def test_an_admission_retried_after_it_wrote_a_status_without_a_phase_runs_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``resolve_run`` records the resolved spec, then the AgentModel cannot be read: kopf
    must still take the next event for the creation it has not finished."""
    kopf_ = Cycles(run(), monkeypatch)

    def resolved_then_failed() -> None:
        kopf_.obj["status"] = {"resolvedSpec": {"goal": "g"}, "agent": {"name": "a"}}
        raise kopf.TemporaryError("cannot read the AgentModel", delay=0)

    kopf_.on_admit = resolved_then_failed
    await kopf_.event("ADDED")
    await kopf_.event()
    kopf_.obj["status"] = {**kopf_.obj["status"], **RUNNING}
    await kopf_.event()
    assert kopf_.calls == ["admit_run retry=0", "admit_run retry=1"]
    assert not [k for k in kopf_.obj["metadata"]["annotations"] if k.startswith("kopf.")]


async def test_a_cancel_is_handled_once_and_nothing_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kopf_ = Cycles(run(), monkeypatch)
    await kopf_.event("ADDED")
    kopf_.obj["status"] = RUNNING
    await kopf_.event()
    kopf_.obj["metadata"]["annotations"][CANCEL] = "true"
    await kopf_.event()
    await kopf_.event()  # the run's next status write
    kopf_.obj["status"] = ENDED
    await kopf_.event()
    assert kopf_.calls == ["admit_run retry=0", "cancel_run"]
    assert kopf_.patches == []


async def test_a_cancel_set_while_no_operator_ran_is_handled_at_the_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kopf_ = Cycles(run({CANCEL: "true"}, RUNNING), monkeypatch)
    await kopf_.event(None)
    for _ in range(3):  # kopf's lifecycle runs one handler a cycle; the next event, the other
        await kopf_.event()
    assert sorted(kopf_.calls) == ["admit_run retry=0", "cancel_run"]
    assert not [k for k in kopf_.obj["metadata"]["annotations"] if k.startswith("kopf.")]


async def test_a_cancelled_run_that_ended_is_only_resumed_at_a_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It keeps its cancel annotation: one handler, nothing written, at every restart."""
    kopf_ = Cycles(run({CANCEL: "true"}, ENDED), monkeypatch)
    await kopf_.event(None)
    await kopf_.event()
    assert kopf_.calls == ["admit_run retry=0"]
    assert kopf_.patches == []
    assert len(kopf_.handled) == 0
