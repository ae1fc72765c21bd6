"""A run's events through the trajectory API, with the user's kubeconfig alone.

``kubectl agentrun logs`` reads ``GET /apis/trajectory.agentrun.dev/v1alpha1/namespaces/<ns>/
agentruntrajectories/<run>`` through the kube-apiserver, which authenticates the user and
proxies to agentrun's aggregated API server (``agentrun-trajectory``); RBAC decides (``get``
on ``agentruntrajectories``, which the chart's ``agentrun-view`` grants). ``?follow=true``
streams one JSON event record a line; a stream cut short (a proxy's timeout) is opened again
and the events already seen are skipped by their stream sequence.

What belongs here: the HTTP calls and decoding the records into ``RunEvent``. Which source
``logs`` uses, and printing, is ``kubectl``'s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from agentrun.protocol import RunEvent

GROUP = "trajectory.agentrun.dev"
VERSION = "v1alpha1"
RESOURCE = "agentruntrajectories"
"""The API's names (``agentrun.trajectoryapi.access`` serves them; a test keeps both equal)."""
REOPEN_DELAY = 1.0
"""Seconds before a follow stream that ended without the run's end is opened again."""


class NotInstalled(Exception):
    """The cluster does not serve the trajectory API (its group is unknown: 404)."""


class ApiError(RuntimeError):
    """The API refused or failed; `str()` reads like kubectl's ``Error from server (…): …``."""


class TrajectoryApi:
    """One run's trajectory through the kube-apiserver (``api``: the kubeconfig's client)."""

    def __init__(self, api: client.ApiClient, namespace: str, name: str) -> None:
        self.api = api
        self.path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{RESOURCE}/{name}"

    async def read(self) -> list[RunEvent]:
        """Every event of the run's stream, oldest first. Raises NotInstalled or ApiError."""
        response = await self._open(follow=False)
        try:
            body: dict[str, Any] = await response.json(content_type=None)
        finally:
            response.release()
        return [decode(record) for record in body.get("events") or []]

    async def follow(self) -> AsyncIterator[RunEvent]:
        """Every event, then each new one, until the caller stops iterating. The first
        request is made on this call (raises NotInstalled or ApiError before any event);
        later ones when a stream ends (raising ApiError if refused then)."""
        response = await self._open(follow=True)
        return self._events(response)

    async def _events(self, response: aiohttp.ClientResponse) -> AsyncIterator[RunEvent]:
        last = 0
        while True:
            try:
                async for line in response.content:
                    if not line.strip():
                        continue
                    event = decode(json.loads(line))
                    if event.seq > last:
                        last = event.seq
                        yield event
            except aiohttp.ClientPayloadError:
                pass  # cut mid-stream: open it again
            finally:
                response.release()
            await asyncio.sleep(REOPEN_DELAY)
            response = await self._open(follow=True)

    async def _open(self, *, follow: bool) -> aiohttp.ClientResponse:
        response: aiohttp.ClientResponse = await self.api.call_api(
            self.path,
            "GET",
            query_params=[("follow", "true")] if follow else [],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _return_http_data_only=True,
        )
        if response.status == 200:
            return response
        text = await response.text()
        response.release()
        raise refusal(response.status, text)


def refusal(status: int, text: str) -> NotInstalled | ApiError:
    """What a non-200 answer means: a 404 from the kube-apiserver itself (no such group) is
    NotInstalled; anything else an ApiError with the ``Status`` body's reason and message — a
    404 too when the trajectory server answered it (its ``Status`` names the group in
    ``details.group``: a path that server does not serve, as an older server's)."""
    try:
        body = json.loads(text)
    except ValueError:
        body = {}
    body = body if isinstance(body, dict) else {}
    details = body.get("details")
    served = isinstance(details, dict) and details.get("group") == GROUP
    if status == 404 and not served:
        return NotInstalled(f"the trajectory API ({GROUP}/{VERSION}) is not installed")
    reason = body.get("reason") or f"HTTP {status}"
    message = body.get("message") or text.strip() or f"HTTP {status}"
    return ApiError(f"Error from server ({reason}): {message}")


def decode(record: dict[str, Any]) -> RunEvent:
    """A record of the API (``{"seq": …, …the event's fields}``) as a ``RunEvent``; raises
    ValueError or KeyError when it is not one."""
    seq = int(record.pop("seq", 0))
    return RunEvent.decode(json.dumps(record).encode(), seq=seq)
