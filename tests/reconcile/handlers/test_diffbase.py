"""What kopf compares between watch events of an AgentRun: labels and annotations only."""

from __future__ import annotations

import json
from typing import Any

import kopf
import pytest

from agentrun.operator import runs
from agentrun.operator.handlers import startup as handlers

SPEC = {"model": "mock", "goal": "add numbers", "tools": ["calculate"]}
STATUS = {"phase": "Running", "usage": {"steps": 3}, "conditions": [{"type": "Admitted"}]}


def run_object(annotations: dict[str, str], labels: dict[str, str] | None = None) -> kopf.Body:
    """An AgentRun as the API server sends it: managed fields, spec and status included."""
    metadata: dict[str, Any] = {
        "name": "r",
        "namespace": "default",
        "uid": "u-1",
        "resourceVersion": "42",
        "finalizers": [handlers.LEGACY_FINALIZER],
        "annotations": annotations,
        "managedFields": [{"manager": "agentrun", "subresource": "status", "fieldsV1": {}}],
    }
    if labels is not None:
        metadata["labels"] = labels
    return kopf.Body(
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentRun",
            "metadata": metadata,
            "spec": SPEC,
            "status": STATUS,
        }
    )


def storage() -> handlers.MetadataDiffBaseStorage:
    return handlers.MetadataDiffBaseStorage(
        prefix="kopf.agentrun.dev", key="last-handled-configuration"
    )


def kopf_essence(body: kopf.Body) -> dict[str, Any]:
    """kopf's own essence of ``body``, less the spec and kubectl's copy of the object."""
    essence = dict(kopf.AnnotationsDiffBaseStorage.build(storage(), body=body))
    essence.pop("spec", None)
    annotations = essence.get("metadata", {}).get("annotations", {})
    annotations.pop(handlers.KUBECTL_LAST_APPLIED, None)
    annotations.pop("agentrun.dev/admitted-uid", None)
    return essence


BODIES = {
    "no user annotations": run_object(
        {
            handlers.KUBECTL_LAST_APPLIED: json.dumps({"spec": SPEC}),
            "kopf.agentrun.dev/last-handled-configuration": "{}",
        }
    ),
    "a cancel annotation and labels": run_object(
        {
            "agentrun.dev/cancel": "true",
            "kopf.agentrun.dev/last-handled-configuration": "{}",
            "kopf.agentrun.dev/admit_run": "{}",
        },
        labels={"team": "a"},
    ),
    "an approval": run_object({runs.APPROVE_ANNOTATION: "sha256:abc"}),
}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_the_essence_is_kopfs_own_without_spec_or_status(body: kopf.Body) -> None:
    essence = storage().build(body=body)
    assert essence == kopf_essence(body)
    assert "spec" not in essence and "status" not in essence


def test_labels_and_user_annotations_are_in_the_essence_and_the_stored_essence_is_not() -> None:
    essence = storage().build(body=BODIES["a cancel annotation and labels"])
    assert essence["metadata"]["labels"] == {"team": "a"}
    annotations = essence["metadata"]["annotations"]
    assert annotations["agentrun.dev/cancel"] == "true"
    assert "kopf.agentrun.dev/last-handled-configuration" not in annotations


def test_extra_fields_asked_by_a_handler_are_kept() -> None:
    body = BODIES["an approval"]
    essence = storage().build(body=body, extra_fields=["status.phase"])
    assert essence["status"] == {"phase": "Running"}
    assert "spec" not in essence


def test_the_operators_admission_record_is_no_change_to_kopf() -> None:
    """The operator records ``agentrun.dev/admitted-uid`` when it admits a run; were it in the
    essence, kopf would see a change and write its last-handled-configuration again (one more
    PATCH of every run: seen as 5 PATCHes a run where 4 are kopf's and ours)."""
    before = run_object({"kopf.agentrun.dev/last-handled-configuration": "{}"})
    after = run_object(
        {
            "kopf.agentrun.dev/last-handled-configuration": "{}",
            "agentrun.dev/admitted-uid": "u-1",
        }
    )
    assert storage().build(body=after) == storage().build(body=before)
    with_cancel = run_object({"agentrun.dev/admitted-uid": "u-1", "agentrun.dev/cancel": "true"})
    assert storage().build(body=with_cancel)["metadata"]["annotations"] == {
        "agentrun.dev/cancel": "true"
    }
