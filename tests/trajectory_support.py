"""Run trajectories as a reader of committed events sees them (the ``RunEvents`` port of the
AgentEval controller): none at all, or many large turns made one at a time."""

from __future__ import annotations

from collections.abc import AsyncIterator

from agentrun import kernel
from agentrun.kernel import decision as dec
from agentrun.protocol import RunEvent


class NoEvents:
    """Every run has no committed event."""

    async def iter_events(
        self, namespace: str, name: str, *, after_seq: int = 0
    ) -> AsyncIterator[RunEvent]:
        for event in ():
            yield event


class LongRuns:
    """Every run has ``turns`` committed turns, each calling ``tool`` with an argument of
    ``chars`` characters, made as they are read (the reader alone holds them)."""

    def __init__(self, turns: int, chars: int, *, tool: str = "fetch") -> None:
        self.turns, self.chars, self.tool = turns, chars, tool

    def turn(self, step: int) -> RunEvent:
        call = kernel.CheckedCall(f"c{step}", self.tool, {"text": f"{step:08d}" + "x" * self.chars})
        record = kernel.Answered(step, dec.ToolCalls((), None), calls=(call,))
        return RunEvent("turn", "uid", kernel.RunSummary(kernel.Phase.RUNNING), record=record)

    async def iter_events(
        self, namespace: str, name: str, *, after_seq: int = 0
    ) -> AsyncIterator[RunEvent]:
        for step in range(after_seq, self.turns):
            yield self.turn(step)
