"""Every message on the bus says which wire schema it is written in, and every reader checks
it: a message without the field is version 1 (what releases before the field wrote), a newer
version than the reader knows is refused by name and left for a newer process — a worker naks
it with a delay, never terms it and never ends the run over it."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import pytest

from agentrun import kernel, protocol
from agentrun.protocol import RunEvent, TurnRequest, versions
from agentrun.worker.consumer import NEWER_SCHEMA_DELAY, TurnConsumer, is_transient

REQUEST = TurnRequest("uid-1", "ns", "run", 3, 17)
TURN = protocol.encode_turn_request(REQUEST)
EVENT = RunEvent("stop", "uid-1", kernel.initial_state(goal="g").summary(), time=1.0)


def test_what_this_release_writes_carries_its_schema_version() -> None:
    for payload in (protocol.encode_turn_request(REQUEST), EVENT.encode()):
        assert json.loads(payload)[versions.FIELD] == protocol.SCHEMA_VERSION


def test_a_message_without_a_version_is_read_as_version_one() -> None:
    request = json.loads(protocol.encode_turn_request(REQUEST))
    del request[versions.FIELD]
    assert protocol.decode_turn_request(json.dumps(request).encode()) == REQUEST
    event = json.loads(EVENT.encode())
    del event[versions.FIELD]
    assert RunEvent.decode(json.dumps(event).encode()) == EVENT


def newer(payload: bytes) -> bytes:
    data = json.loads(payload)
    data[versions.FIELD] = protocol.SCHEMA_VERSION + 1
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "decode",
    [
        pytest.param(lambda: protocol.decode_turn_request(newer(TURN)), id="turn-request"),
        pytest.param(lambda: RunEvent.decode(newer(EVENT.encode())), id="run-event"),
    ],
)  # fmt: skip
def test_a_newer_version_is_refused_naming_both_versions(decode: Any) -> None:
    with pytest.raises(protocol.UnsupportedSchema) as refused:
        decode()
    message = str(refused.value)
    assert f"schema {protocol.SCHEMA_VERSION + 1}" in message
    assert f"reads up to {protocol.SCHEMA_VERSION}" in message


@pytest.mark.parametrize("bad", ["2", 0, -1, True, None], ids=repr)
def test_a_version_that_is_not_a_positive_integer_is_malformed(bad: object) -> None:
    with pytest.raises(ValueError, match=versions.FIELD) as refused:
        versions.check({versions.FIELD: bad}, what="TurnRequest")
    assert not isinstance(refused.value, protocol.UnsupportedSchema)


@dataclasses.dataclass
class FakeMsg:
    """What ``TurnConsumer._handle`` touches of a message before it decodes it."""

    data: bytes
    naks: list[float | None] = dataclasses.field(default_factory=list)
    terms: int = 0

    async def nak(self, delay: float | None = None) -> None:
        self.naks.append(delay)

    async def term(self) -> None:
        self.terms += 1


def test_a_worker_leaves_a_newer_turn_request_for_a_newer_worker() -> None:
    consumer = TurnConsumer.__new__(TurnConsumer)  # decoding comes first: nothing else is used
    msg = FakeMsg(newer(protocol.encode_turn_request(REQUEST)))
    asyncio.run(consumer._handle(msg))  # type: ignore[arg-type]
    assert (msg.naks, msg.terms) == ([NEWER_SCHEMA_DELAY], 0)
    malformed = FakeMsg(b'{"runUID": 1}')
    asyncio.run(consumer._handle(malformed))  # type: ignore[arg-type]
    assert (malformed.naks, malformed.terms) == ([], 1)  # malformed is dropped; newer is not


def test_a_run_whose_events_are_newer_waits_rather_than_fails() -> None:
    """Reading the run's events raised UnsupportedSchema: the turn is retried however long,
    like any transient fault, never ended ``checkpoint_failed`` on its second delivery."""
    assert is_transient(protocol.UnsupportedSchema(2, what="run event"))
    assert not is_transient(ValueError("malformed"))
