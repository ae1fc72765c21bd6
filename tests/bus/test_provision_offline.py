"""Provisioning a stream while a server of the cluster is offline (error 10005 with "peer
offline" in its description, as nats-server words it while a peer restarts): tried again
until the server is back, refused as ``ReplicasRefused`` once the wait is over; a placement
refused for another reason is refused at once. A scripted JetStream context answers as the
server does (the same error codes and descriptions)."""

from __future__ import annotations

from typing import Any

import nats.js.errors
import pytest
from nats.js import api

from agentrun import buckets

OFFLINE = {
    "code": 400,
    "err_code": 10005,
    "description": "no suitable peers for placement, peer offline",
}
TOO_FEW = {"code": 400, "err_code": 10005, "description": "insufficient resources"}
EXISTS = {
    "code": 400,
    "err_code": 10058,
    "description": "stream name already in use with a different configuration",
}


class ScriptedJetStream:
    """``add_stream`` raises the scripted errors in turn, then succeeds; ``update_stream``
    records its call."""

    def __init__(self, *errors: dict[str, Any]) -> None:
        self.errors = list(errors)
        self.calls: list[str] = []

    async def add_stream(self, config: api.StreamConfig) -> None:
        self.calls.append("add")
        if self.errors:
            nats.js.errors.APIError.from_error(self.errors.pop(0))

    async def update_stream(self, config: api.StreamConfig) -> None:
        self.calls.append("update")


CONFIG = api.StreamConfig(name="AGENTRUN_EVENTS", num_replicas=3)


async def test_an_offline_peer_is_waited_for() -> None:
    js = ScriptedJetStream(OFFLINE, OFFLINE)
    await buckets.provision_stream(js, CONFIG, offline_wait=30)  # type: ignore[arg-type]
    assert js.calls == ["add", "add", "add"]


async def test_a_peer_offline_past_the_wait_is_refused_saying_what_to_set() -> None:
    js = ScriptedJetStream(OFFLINE, OFFLINE, OFFLINE)
    with pytest.raises(buckets.ReplicasRefused, match="AGENTRUN_NATS_REPLICAS"):
        await buckets.provision_stream(js, CONFIG, offline_wait=0.5)  # type: ignore[arg-type]
    assert js.calls[:2] == ["add", "add"]  # tried again once within the wait


async def test_too_few_servers_are_refused_at_once() -> None:
    js = ScriptedJetStream(TOO_FEW)
    with pytest.raises(buckets.ReplicasRefused):
        await buckets.provision_stream(js, CONFIG, offline_wait=30)  # type: ignore[arg-type]
    assert js.calls == ["add"]


async def test_a_stream_configured_otherwise_is_updated() -> None:
    js = ScriptedJetStream(EXISTS)
    await buckets.provision_stream(js, CONFIG)  # type: ignore[arg-type]
    assert js.calls == ["add", "update"]
