"""Tool errors are observations: each error class, what the model sees, what is retried, and
what counts toward ``tool_unavailable`` (the runner and the kernel together)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

import pytest

from agentrun import kernel
from agentrun.kernel import Phase, ToolFault
from agentrun.tools import ToolContext, ToolError, ToolSpec
from agentrun.worker import toolrunner

CTX = ToolContext(namespace="ns", run_name="run", run_uid="uid", call_id="")
FAST = toolrunner.ToolRunSettings(call_timeout=0.2, retries=2, retry_backoff=0.01)


class Failing:
    """A tool that fails ``failures`` times with ``error`` (an exception to raise, or
    ``"hang"``), then answers "fine"; counts its attempts."""

    def __init__(self, error: BaseException | str, *, effect: str = "read", failures: int = 99):
        self.error = error
        self.failures = failures
        self.attempts = 0
        self._spec = ToolSpec(
            "flaky",
            "fails as told",
            {"type": "object", "properties": {}, "additionalProperties": False},
            effect,  # type: ignore[arg-type]
            False,
        )

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def run(self, arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        self.attempts += 1
        if self.attempts > self.failures:
            return "fine"
        if self.error == "hang":
            await asyncio.sleep(10)
        assert isinstance(self.error, BaseException)
        raise self.error


def run_one(tool: Failing, *, deadline: float | None = None) -> kernel.ToolResult:
    call = kernel.CheckedCall("c1", "flaky", {})
    (result,) = asyncio.run(
        toolrunner.run_batch(
            [call],
            tools={"flaky": tool},
            context=CTX,
            settings=FAST,
            deadline=deadline if deadline is not None else time.time() + 60,
        )
    )
    return result


ERROR_CLASSES = [
    # (error raised by the tool, the fault recorded, attempts made, counts as unavailable)
    pytest.param(ToolError("division by zero"), ToolFault.DOMAIN, 1, False, id="domain"),
    pytest.param(
        ToolError("HTTP 404 not found", fault=ToolFault.REJECTED),
        ToolFault.REJECTED,
        1,
        False,
        id="4xx-rejected",
    ),
    # one deadline per call, retries included: a call that used it up is not sent again
    pytest.param("hang", ToolFault.TIMEOUT, 1, True, id="timeout"),
    pytest.param(
        ToolError("connection refused", fault=ToolFault.CONNECTION),
        ToolFault.CONNECTION,
        3,
        True,
        id="connection-refused",
    ),
    pytest.param(
        ToolError("HTTP 503", fault=ToolFault.SERVER), ToolFault.SERVER, 3, True, id="5xx-server"
    ),
    pytest.param(
        ToolError("session terminated", fault=ToolFault.TRANSPORT),
        ToolFault.TRANSPORT,
        3,
        True,
        id="mcp-transport",
    ),
    pytest.param(RuntimeError("bug"), ToolFault.CRASHED, 1, True, id="tool-bug"),
]


@pytest.mark.parametrize(("error", "fault", "attempts", "infrastructure"), ERROR_CLASSES)
def test_each_error_class_is_classified_retried_and_counted_as_its_own(
    error: BaseException | str, fault: ToolFault, attempts: int, infrastructure: bool
) -> None:
    tool = Failing(error)
    result = run_one(tool)
    assert result.is_error and result.fault is fault
    assert tool.attempts == attempts
    assert result.infrastructure_failure is infrastructure
    assert ("after 3 attempts" in result.content) is (attempts == 3)
    # what the kernel makes of it: a model-caused error never moves toward tool_unavailable
    state = kernel.initial_state(goal="g")
    limits = kernel.Limits(unavailable_turns=1)
    record = kernel.Answered(
        0,
        kernel.ToolCalls((), None),
        calls=(kernel.CheckedCall("c1", "flaky", {}),),
        results=(result,),
    )
    after = kernel.advance(state, record, limits)
    assert (after.phase is Phase.TOOL_UNAVAILABLE) is infrastructure
    assert after.messages[-1]["content"].startswith("ERROR: ")  # the model sees the error


def test_a_flaky_read_tool_that_recovers_within_its_retries_answers() -> None:
    tool = Failing(ToolError("reset", fault=ToolFault.CONNECTION), failures=2)
    result = run_one(tool)
    assert (result.content, result.is_error, tool.attempts) == ("fine", False, 3)


@pytest.mark.parametrize("effect", ["read", "idempotent"])
def test_read_and_idempotent_tools_are_retried(effect: str) -> None:
    tool = Failing(ToolError("HTTP 502", fault=ToolFault.SERVER), effect=effect, failures=1)
    assert run_one(tool).content == "fine"


def test_a_write_tool_is_never_sent_twice() -> None:
    tool = Failing(ToolError("reset", fault=ToolFault.CONNECTION), effect="write", failures=1)
    result = run_one(tool)
    assert result.fault is ToolFault.EFFECT_UNKNOWN and tool.attempts == 1


WRITE_FAILURES = [
    # (error raised by a write tool, the fault recorded): a failure that may have come after
    # the write was sent leaves its outcome unknown; one known to be unsent, or an answer the
    # model caused, stays what it is. Every one is sent exactly once: a write is never retried,
    # not even when it is known to be unsent (the retry could be the one that lands twice if
    # "unsent" was wrong; the next turn's model decides).
    pytest.param("hang", ToolFault.EFFECT_UNKNOWN, id="timeout"),
    pytest.param(
        ToolError("reset", fault=ToolFault.CONNECTION), ToolFault.EFFECT_UNKNOWN, id="reset"
    ),
    pytest.param(ToolError("HTTP 502", fault=ToolFault.SERVER), ToolFault.EFFECT_UNKNOWN, id="5xx"),
    pytest.param(
        ToolError("unreadable", fault=ToolFault.TRANSPORT), ToolFault.EFFECT_UNKNOWN, id="transport"
    ),
    pytest.param(RuntimeError("bug"), ToolFault.EFFECT_UNKNOWN, id="crashed"),
    pytest.param(
        ToolError("refused", fault=ToolFault.CONNECTION, unsent=True),
        ToolFault.CONNECTION,
        id="connect-refused-unsent",
    ),
    pytest.param(ToolError("no such row"), ToolFault.DOMAIN, id="domain"),
    pytest.param(
        ToolError("HTTP 409", fault=ToolFault.REJECTED), ToolFault.REJECTED, id="4xx-rejected"
    ),
]


@pytest.mark.parametrize(("error", "fault"), WRITE_FAILURES)
def test_a_write_that_may_have_been_sent_has_an_unknown_outcome(
    error: BaseException | str, fault: ToolFault
) -> None:
    tool = Failing(error, effect="write")
    result = run_one(tool)
    assert result.fault is fault
    assert tool.attempts == 1  # FAST allows 2 retries: none is used for a write
    assert "attempts" not in result.content
    if fault is ToolFault.EFFECT_UNKNOWN:
        assert "flaky (c1)" in result.content and "not sent again" in result.content
        record = kernel.Answered(
            0,
            kernel.ToolCalls((), None),
            calls=(kernel.CheckedCall("c1", "flaky", {}),),
            results=(result,),
        )
        after = kernel.advance(kernel.initial_state(goal="g"), record, kernel.Limits())
        assert (after.phase, after.message) == (Phase.EFFECT_UNKNOWN, result.content)


def test_retries_stop_at_the_runs_deadline() -> None:
    tool = Failing(ToolError("HTTP 503", fault=ToolFault.SERVER))
    settings = toolrunner.ToolRunSettings(retries=5, retry_backoff=2.0)
    call = kernel.CheckedCall("c1", "flaky", {})
    started = time.monotonic()
    (result,) = asyncio.run(
        toolrunner.run_batch(
            [call], tools={"flaky": tool}, context=CTX, settings=settings, deadline=time.time() + 1
        )
    )
    assert time.monotonic() - started < 1
    assert tool.attempts == 1 and result.fault is ToolFault.SERVER


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [kernel.backoff(n, base=0.5, cap=3) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        kernel.backoff(0)


def test_only_a_tool_failing_in_every_call_of_a_turn_is_unreachable() -> None:
    down, bad = ToolFault.TIMEOUT, ToolFault.ARGUMENTS
    streaks = kernel.next_unavailable({"b": 2, "c": 1}, [("a", down), ("b", None), ("c", down)])
    assert streaks == {"a": 1, "c": 2}
    # one answer of any kind (even an error the model caused) shows the tool is reachable
    assert kernel.next_unavailable({"a": 2}, [("a", down), ("a", bad)]) == {}
    assert kernel.next_unavailable({"a": 2}, []) == {"a": 2}  # not called: unchanged


def test_a_tools_own_timeout_is_clamped_to_the_platforms_most() -> None:
    """An AgentToolServer's ``spec.timeouts.call`` is the tenant's to set; a turn holds its
    worker slot while its tools run, so no call outlasts ``max_call_timeout``."""
    tool = Failing("hang")
    tool._spec = ToolSpec(
        "flaky",
        "hangs",
        {"type": "object"},
        "read",
        False,
        timeout=3_600.0,  # type: ignore[arg-type]
    )
    settings = toolrunner.ToolRunSettings(call_timeout=0.1, max_call_timeout=0.3, retries=0)
    call = kernel.CheckedCall("c1", "flaky", {})
    started = time.monotonic()
    (result,) = asyncio.run(
        toolrunner.run_batch(
            [call],
            tools={"flaky": tool},
            context=CTX,
            settings=settings,
            deadline=time.time() + 60,
        )
    )
    assert result.fault is ToolFault.TIMEOUT and "timed out after 0.3s" in result.content
    assert time.monotonic() - started < 5


SECRET = "hdr-known-0123456789abcdef"


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(RuntimeError(f"sent 'Authorization: Bearer {SECRET}'"), id="tool-bug"),
        pytest.param(ToolError(f"gateway refused {SECRET}", fault=ToolFault.SERVER), id="error"),
    ],
)
def test_a_failure_quoting_a_secret_the_worker_read_reaches_the_model_redacted(
    error: Exception,
) -> None:
    """Whatever a tool raised, a secret this worker read (another tool server's header, a
    model key: ``display.KNOWN``) that its text quotes reaches neither the model nor the run's
    events."""
    from agentrun import display

    display.KNOWN.add(SECRET)
    result = run_one(Failing(error))
    assert result.is_error and SECRET not in result.content
    assert display.REDACTED in result.content, result.content
