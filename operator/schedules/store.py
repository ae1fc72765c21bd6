"""The CronAgentRun controller's API calls: its port (``CronStore``) and the adapter over the
API server port (``KubeCronStore``).

What belongs here: listing (``slim_run``: what the controller reads of each), creating,
cancelling and deleting a CronAgentRun's runs and patching its status, each translating the API
server's answers (AlreadyExists: done; NotFound: gone).
What does not: any decision (``plan``, ``controller``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .. import runs
from ..platform.kubeapi import ApiError, KubeApi, Ref
from .spec import CRON_LABEL, CRONS, SCHEDULED_ANNOTATION


class CronStore(Protocol):
    """The API calls of the controller; each raises ``ApiError`` on a failed request."""

    async def get_cron(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The CronAgentRun ``namespace/name``; ``None`` when there is none."""

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        """The AgentRuns labelled as created by ``cron``."""

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        """Create the run; ``False`` when it exists already."""

    async def cancel_run(self, namespace: str, name: str) -> None:
        """Set the run's cancel annotation (a run gone already is no error)."""

    async def delete_run(self, namespace: str, name: str) -> None:
        """Delete the run (a run gone already is no error)."""

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
        """Merge ``body`` into the CronAgentRun's status; ``False`` when it is gone (a
        conflict, a new object of its name, is no error either)."""

    async def release_run(self, namespace: str, name: str, uid: str) -> None:
        """Remove the run's ``runs.HOLD_ANNOTATION`` (its end is in the status: its TTL may
        delete it now); a run gone, or replaced by a newer one of its name, is no error."""


KEPT_ANNOTATIONS = frozenset({SCHEDULED_ANNOTATION, runs.HOLD_ANNOTATION})
"""The annotations of a run the controller reads (its schedule time, whether it is held)."""
RUN_STATUS_READ = ("phase", "terminalReason", "completionTime")
"""The fields of a run's ``.status`` the controller reads (``status.OwnedRun.of``)."""


def slim_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """What the controller reads of a listed run (``status.OwnedRun.of`` and the owner check):
    its name, uid, schedule-time and hold annotations and owner references, and its status's phase,
    terminal reason and completion time. A schedule keeps up to 1,000 runs not ended and
    1,000 finished of each kind, each holding its template's goal, parameters and annotations
    (a megabyte, within the API server's object size): held whole, one reconcile's list held
    every one of them decoded."""
    meta = run.get("metadata") or {}
    found = run.get("status") or {}
    annotations = meta.get("annotations") or {}
    return {
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "annotations": {k: v for k, v in annotations.items() if k in KEPT_ANNOTATIONS},
            "ownerReferences": meta.get("ownerReferences") or [],
        },
        "status": {k: found[k] for k in RUN_STATUS_READ if k in found},
    }


class KubeCronStore:
    """``CronStore`` through the API server port."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api

    async def get_cron(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The CronAgentRun ``namespace/name``; ``None`` when there is none (HTTP 404)."""
        return await self.api.get(Ref(CRONS, name, namespace))

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        """The AgentRuns labelled as created by ``cron``, each as ``slim_run`` keeps it (read
        in pages, each page's runs dropped once kept)."""
        return await self.api.list_kept(
            runs.RUNS, slim_run, namespace=namespace, label_selector=f"{CRON_LABEL}={cron}"
        )

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        """Create the run; ``False`` when it exists already (HTTP 409)."""
        return await self.api.create(runs.RUNS, manifest)

    async def cancel_run(self, namespace: str, name: str) -> None:
        """Set ``agentrun.dev/cancel: "true"``, as ``kubectl agentrun cancel`` does."""
        body = {"metadata": {"annotations": {runs.CANCEL_ANNOTATION: "true"}}}
        await self.api.patch(Ref(runs.RUNS, name, namespace), body)

    async def delete_run(self, namespace: str, name: str) -> None:
        """Delete the run in the background (the operator stops it if it is still going)."""
        await self.api.delete(Ref(runs.RUNS, name, namespace))

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> bool:
        """Merge ``body`` into ``.status``; ``False`` when the object is gone (HTTP 404)."""
        meta = cron.get("metadata") or {}
        ref = Ref(CRONS, str(meta.get("name")), str(meta.get("namespace")))
        try:
            await self.api.patch_status(ref, body, uid=str(meta.get("uid") or ""))
        except ApiError as err:
            if err.status == 404:
                return False
            if err.status != 409:
                raise
        return True

    async def release_run(self, namespace: str, name: str, uid: str) -> None:
        """Remove the run's ``runs.HOLD_ANNOTATION`` (``runs.release_hold``)."""
        await runs.release_hold(self.api, runs.RunKey(namespace, name, uid))
