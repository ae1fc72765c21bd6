"""A TurnRequest's message as ``TurnConsumer._handle`` touches it, recording what it got."""

from __future__ import annotations

import dataclasses

from agentrun import protocol


@dataclasses.dataclass
class Metadata:
    timestamp: None = None
    num_delivered: int = 1


@dataclasses.dataclass
class FakeMsg:
    """What ``TurnConsumer._handle`` touches of a TurnRequest's message, with what it got."""

    data: bytes
    subject: str = protocol.turn_subject("acme")
    metadata: Metadata = dataclasses.field(default_factory=Metadata)
    outcome: list[str] = dataclasses.field(default_factory=list)

    async def ack(self) -> None:
        self.outcome.append("ack")

    async def nak(self, delay: float | None = None) -> None:
        self.outcome.append("nak" if delay is None else f"nak {delay}")

    async def in_progress(self) -> None:
        pass
