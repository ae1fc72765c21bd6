"""What ``make demo`` prints of the ``default`` tenant: its use once the demo's runs are
settled, on top of an earlier demo's on a stack still up (README, "What make demo shows").
No cluster: kubectl is a stand-in answering the tenant's status in turn."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agentrun_dev import demo, state

WINDOW = "2026-12-07T00:00:00Z"


class Statuses:
    """kubectl answering ``get agenttenant default -o json`` with each status in turn (the
    last one again once they are used up), counting the reads."""

    def __init__(self, *statuses: dict[str, Any]) -> None:
        self.statuses = list(statuses)
        self.reads = 0

    def __call__(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert args[:2] == ("get", "agenttenant")
        status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return subprocess.CompletedProcess(args, 0, json.dumps({"status": status}), "")


def tenant(used: int, *, active: int = 0, window: str = WINDOW) -> dict[str, Any]:
    return {"windowStart": window, "activeRuns": active, "budget": {"tokens": {"used": used}}}


def runs(*tokens: int) -> list[dict[str, Any]]:
    return [{"status": {"usage": {"totalTokens": t}}} for t in tokens]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(*statuses: dict[str, Any]) -> Statuses:
        kc = Statuses(*statuses)
        monkeypatch.setattr(demo, "kubectl_for", lambda current: kc)
        monkeypatch.setattr(demo.time, "sleep", lambda seconds: None)
        return kc

    return install


def test_a_second_demo_waits_for_its_own_runs_on_top_of_the_first(fake: Any) -> None:
    """The first demo's 2491 tokens already cover the second's 2491: the status is settled
    only once it shows both (4982), not at its first read."""
    before = fake(tenant(2491))
    current = state.StackState(Path("/nonexistent/.agentrun/dev"))
    assert demo.tenant_use(current) == (WINDOW, 2491)
    kc = fake(tenant(2491), tenant(2491), tenant(4982))
    demo.wait_tenant_settled(current, items=runs(525, 1396, 570), before=(WINDOW, 2491))
    assert (before.reads, kc.reads) == (1, 3)


def test_a_new_window_counts_only_the_demos_runs(fake: Any) -> None:
    """The window reset between: the earlier use is not in the new window's."""
    kc = fake(tenant(100, active=1, window="2026-12-08T00:00:00Z"), tenant(2491, window="x"))
    current = state.StackState(Path("/nonexistent/.agentrun/dev"))
    demo.wait_tenant_settled(current, items=runs(2491), before=(WINDOW, 2491))
    assert kc.reads == 2
