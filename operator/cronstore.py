"""The CronAgentRun controller's API calls: its port (``CronStore``), the adapter over the API
server (``KubeCronStore``) and a run as read back (``OwnedRun``).

What belongs here: listing, creating, cancelling and deleting a CronAgentRun's runs and patching
its status, each translating the API server's answers (AlreadyExists: done; NotFound: gone).
What does not: any decision (``cronplan``, ``schedules``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import kube

from . import cronspec
from .runs import CANCEL_ANNOTATION
from .statuswriter import MERGE_PATCH


def epoch(text: Any) -> float | None:
    """An RFC 3339 timestamp as epoch seconds; ``None`` for anything else."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class OwnedRun:
    """A run a CronAgentRun created, as read back."""

    name: str
    uid: str
    scheduled: float
    ended: bool
    succeeded: bool
    completed_at: float | None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> OwnedRun | None:
        """A run object as a dict; ``None`` if it lacks its schedule-time annotation."""
        meta = obj.get("metadata") or {}
        scheduled = epoch((meta.get("annotations") or {}).get(cronspec.SCHEDULED_ANNOTATION))
        if scheduled is None:
            return None
        run_status = obj.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            uid=str(meta.get("uid", "")),
            scheduled=scheduled,
            ended=bool(run_status.get("terminalReason")),
            succeeded=run_status.get("phase") == "Succeeded",
            completed_at=epoch(run_status.get("completionTime")),
        )


class CronStore(Protocol):
    """The API calls of the controller; each raises ``ApiException`` on a failed request."""

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        """The AgentRuns labelled as created by ``cron``."""

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        """Create the run; ``False`` when it exists already."""

    async def cancel_run(self, namespace: str, name: str) -> None:
        """Set the run's cancel annotation (a run gone already is no error)."""

    async def delete_run(self, namespace: str, name: str) -> None:
        """Delete the run (a run gone already is no error)."""

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        """Merge ``body`` into the CronAgentRun's status (a CronAgentRun gone or replaced by
        a new object of its name is no error)."""


class KubeCronStore:
    """``CronStore`` over the API server."""

    def __init__(self, api: client.ApiClient) -> None:
        self.objects = client.CustomObjectsApi(api)

    async def list_runs(self, namespace: str, cron: str) -> list[dict[str, Any]]:
        """The AgentRuns labelled as created by ``cron``."""
        listed: dict[str, Any] = await self.objects.list_namespaced_custom_object(
            kube.GROUP,
            kube.VERSION,
            namespace,
            kube.RUNS,
            label_selector=f"{cronspec.CRON_LABEL}={cron}",
        )
        return list(listed.get("items", []))

    async def create_run(self, manifest: Mapping[str, Any]) -> bool:
        """Create the run; ``False`` when it exists already (HTTP 409)."""
        try:
            await self.objects.create_namespaced_custom_object(
                kube.GROUP, kube.VERSION, manifest["metadata"]["namespace"], kube.RUNS, manifest
            )
        except ApiException as err:
            if err.status == 409:
                return False
            raise
        return True

    async def cancel_run(self, namespace: str, name: str) -> None:
        """Set ``agentrun.dev/cancel: "true"``, as ``kubectl agentrun cancel`` does."""
        body = {"metadata": {"annotations": {CANCEL_ANNOTATION: "true"}}}
        with _unless_gone():
            await self.objects.patch_namespaced_custom_object(
                kube.GROUP, kube.VERSION, namespace, kube.RUNS, name, body, **MERGE_PATCH
            )

    async def delete_run(self, namespace: str, name: str) -> None:
        """Delete the run in the background (its own finalizer, if any, still runs)."""
        with _unless_gone():
            await self.objects.delete_namespaced_custom_object(
                kube.GROUP, kube.VERSION, namespace, kube.RUNS, name
            )

    async def patch_status(self, cron: Mapping[str, Any], body: Mapping[str, Any]) -> None:
        """Merge ``body`` into ``.status``, only while the object has ``cron``'s uid."""
        meta = cron.get("metadata") or {}
        patch = {"metadata": {"uid": meta.get("uid")}, "status": dict(body)}
        try:
            await self.objects.patch_namespaced_custom_object_status(
                kube.GROUP,
                kube.VERSION,
                str(meta.get("namespace")),
                cronspec.CRONS,
                str(meta.get("name")),
                patch,
                **MERGE_PATCH,
            )
        except ApiException as err:
            if err.status not in (404, 409):
                raise


@contextlib.contextmanager
def _unless_gone() -> Iterator[None]:
    try:
        yield
    except ApiException as err:
        if err.status != 404:
            raise
