"""What a person reads in ``kubectl describe``: an Event's message quotes model and tool text
with its terminal controls neutralised, and the cluster-scoped AgentModel's warning says
nothing of the run that failed."""

from __future__ import annotations

from kube_support import FakeKube

from agentrun import kernel
from agentrun.operator.platform.events import EventRecorder, EventType, Involved, Throttle
from agentrun.operator.runs import news
from agentrun.operator.runs.keys import RunKey


async def test_an_events_message_cannot_steer_the_terminal() -> None:
    api = FakeKube()
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    run = Involved("AgentRun", "r", "team-a", "uid-r")
    events.record(run, type=EventType.WARNING, reason="X", message="a\x1b[2Jb\u009b\r\nc")
    await events.drain()
    (posted,) = api.events
    assert posted["message"] == "a\\x1b[2Jb\\x9b\\x0d\nc"


async def test_a_model_error_warns_its_agentmodel_without_naming_the_run() -> None:
    api = FakeKube()
    events = EventRecorder(api, throttle=Throttle(repeat_after=0, rate=1000, burst=1000))
    summary = kernel.RunSummary(
        phase=kernel.Phase.MODEL_ERROR, message="provider said: 'the secret plan' \x1b[31m"
    )
    news.record_end(events, RunKey("team-a", "secret-run", "uid-r"), summary, model="mock")
    await events.drain()
    on_model = [e for e in api.events if e["involvedObject"]["kind"] == "AgentModel"]
    (warning,) = on_model
    assert warning["reason"] == "ModelCallsFailing"
    for private in ("secret", "team-a", "provider", "\x1b"):
        assert private not in warning["message"]
    on_run = [e for e in api.events if e["involvedObject"]["kind"] == "AgentRun"]
    assert "the secret plan" in on_run[0]["message"] and "\x1b" not in on_run[0]["message"]


def test_an_end_counts_one_of_a_kind_in_the_singular() -> None:
    summary = kernel.RunSummary(phase=kernel.Phase.COMPLETED, steps=1, tool_calls=1)
    assert news.usage_line(summary).startswith("1 step, 1 tool call, 0 tokens, ")
    summary = kernel.RunSummary(phase=kernel.Phase.COMPLETED, steps=2, tool_calls=0)
    assert news.usage_line(summary).startswith("2 steps, 0 tool calls, 0 tokens, ")
