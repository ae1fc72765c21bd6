"""Stand-ins shipped for tests and demos: the scripted OpenAI-compatible model.

What belongs here: fakes that let the rest of agentrun (and its users) be exercised without a
real model provider. `scenario` is the pure script format (parse, match, render a reply);
`mockllm` serves it over HTTP (`python -m agentrun.testing.mockllm`, or `MockLLM` in-process).
Nothing in the runtime imports this package.

`MockLLM` and the other server names are loaded lazily, so that running the server module
with ``python -m`` does not import it twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .scenario import (
    After,
    Conversation,
    Fault,
    Scenario,
    ScenarioError,
    ToolCallSpec,
    Turn,
    UsageSpec,
    parse_scenarios,
)

if TYPE_CHECKING:
    from .mockllm import MockLLM, MockState, RecordedRequest, load_scenario_files

__all__ = [
    "After",
    "Conversation",
    "Fault",
    "MockLLM",
    "MockState",
    "RecordedRequest",
    "Scenario",
    "ScenarioError",
    "ToolCallSpec",
    "Turn",
    "UsageSpec",
    "load_scenario_files",
    "parse_scenarios",
]

_LAZY = frozenset({"MockLLM", "MockState", "RecordedRequest", "load_scenario_files"})


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from . import mockllm

        return getattr(mockllm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
