"""``collector.settle``, run by ``process.start`` in the operator and every worker: what the
process imported is frozen out of the cyclic collector's walks, its youngest generation is
collected every ``YOUNG_COLLECTION_THRESHOLD`` allocations, what each whole-heap collection
leaves alive is frozen too (``SurvivorFreezer``), and garbage is still collected — a cycle made
after start-up at once, one among frozen objects at the first whole walk after
``WHOLE_WALK_SECONDS``. The cases that freeze run in a fresh interpreter (freezing the test
runner's own objects would keep them for the rest of the session)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from agentrun import collector

START_UP = """
import gc, json, os, weakref
from agentrun import process, settings
import kopf, kubernetes_asyncio.client, openai  # what the two processes import
before = len(gc.get_objects())
process.start(settings.ProcessSettings, service="collector-test")

class Node:
    pass

a, b = Node(), Node()
a.peer, b.peer = b, a  # a cycle made after start-up: only the collector frees it
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({
    "before": before,
    "frozen": gc.get_freeze_count(),
    "walked": len(gc.get_objects()),
    "threshold": gc.get_threshold(),
    "cycle_collected": gone() is None,
}))
"""

SURVIVORS = """
import gc, json, time, weakref
from agentrun import collector
freezer = collector.settle()

class Node:
    pass

kept = []
for _ in range(1000):  # cycles alive at the next whole-heap collection
    a, b = Node(), Node()
    a.peer, b.peer = b, a
    kept.append(a)
first = weakref.ref(kept[0])
frozen_before = gc.get_freeze_count()
gc.collect()
frozen_after = gc.get_freeze_count()
del kept, a, b  # now garbage, in cycles, frozen
gc.collect()
kept_while_frozen = first() is not None
freezer.clock = lambda: time.monotonic() + collector.WHOLE_WALK_SECONDS
gc.collect()  # past the interval: the frozen objects are given back
gc.collect()  # and this walk covers everything
print(json.dumps({
    "survivors_frozen": frozen_after - frozen_before,
    "kept_while_frozen": kept_while_frozen,
    "collected_after_whole_walk": first() is None,
    "frozen_again": gc.get_freeze_count(),
    "freezers": sum(isinstance(c, collector.SurvivorFreezer) for c in gc.callbacks),
}))
"""


def _run(script: str) -> dict[str, object]:
    env = {"AGENTRUN_METRICS_PORT": "0", "OTEL_SDK_DISABLED": "true", "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    found = _run(START_UP)
    before, frozen, walked = (int(str(found[k])) for k in ("before", "frozen", "walked"))
    assert before > 50_000  # the libraries' objects, as in the two processes
    assert frozen >= before * 0.9  # what start-up left is out of every later walk
    assert walked < frozen / 10  # a full collection now walks a small fraction of it
    assert found["threshold"][0] == collector.YOUNG_COLLECTION_THRESHOLD  # type: ignore[index]
    assert found["cycle_collected"] is True


def test_what_a_whole_walk_leaves_is_frozen_until_the_interval_gives_it_back() -> None:
    found = _run(SURVIVORS)
    assert int(str(found["survivors_frozen"])) >= 2_000  # the 1,000 cycles' 2,000 nodes
    assert found["kept_while_frozen"] is True  # out of the walks until the interval passed
    assert found["collected_after_whole_walk"] is True
    assert int(str(found["frozen_again"])) > 0  # that walk's survivors frozen in turn
    assert found["freezers"] == 1


class FakeGc:
    """``gc``'s freeze functions, recorded instead of done (the test runner's heap stays)."""

    def __init__(self, frozen: int) -> None:
        self.frozen = frozen
        self.calls: list[str] = []

    def get_freeze_count(self) -> int:
        return self.frozen

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")


@pytest.fixture
def fake_gc(monkeypatch: pytest.MonkeyPatch) -> FakeGc:
    fake = FakeGc(frozen=100)
    for name in ("get_freeze_count", "freeze", "unfreeze"):
        monkeypatch.setattr(gc, name, getattr(fake, name))
    return fake


def test_the_freezer_acts_only_when_a_whole_heap_collection_stopped(fake_gc: FakeGc) -> None:
    freezer = collector.SurvivorFreezer(interval=60.0, clock=lambda: 0.0)
    freezer("start", {"generation": 2})
    freezer("stop", {"generation": 0})
    freezer("stop", {"generation": 1})
    assert fake_gc.calls == []
    freezer("stop", {"generation": 2})
    assert fake_gc.calls == ["freeze"]


def test_the_freezer_gives_back_once_the_interval_passed_then_freezes_after_a_whole_walk(
    fake_gc: FakeGc,
) -> None:
    now = [0.0]
    freezer = collector.SurvivorFreezer(interval=60.0, clock=lambda: now[0])
    now[0] = 59.9
    freezer("stop", {"generation": 2})  # a walk of the unfrozen part, within the interval
    now[0] = 60.0
    freezer("stop", {"generation": 2})
    assert fake_gc.calls == ["freeze", "unfreeze"]
    fake_gc.frozen = 0  # the next whole-heap collection walked every object
    now[0] = 61.0
    freezer("stop", {"generation": 2})
    assert freezer.walked == 61.0
    assert fake_gc.calls == ["freeze", "unfreeze", "freeze"]
    fake_gc.frozen = 100
    now[0] = 120.9  # 59.9 s after that whole walk: still frozen
    freezer("stop", {"generation": 2})
    assert fake_gc.calls[-1] == "freeze"
