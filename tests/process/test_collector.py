"""``process.settle_collector``, run by ``process.start`` in the operator and every worker:
what the process imported is frozen out of the cyclic collector's walks, its youngest
generation is collected every ``YOUNG_COLLECTION_THRESHOLD`` allocations, and garbage made
afterwards is still collected. Each case runs in a fresh interpreter (freezing the test
runner's own objects would keep them for the rest of the session)."""

from __future__ import annotations

import json
import subprocess
import sys

from agentrun import process

SCRIPT = """
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


def _settled() -> dict[str, object]:
    env = {"AGENTRUN_METRICS_PORT": "0", "OTEL_SDK_DISABLED": "true", "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_start_up_objects_are_frozen_and_later_cycles_still_collected() -> None:
    found = _settled()
    before, frozen, walked = (int(str(found[k])) for k in ("before", "frozen", "walked"))
    assert before > 50_000  # the libraries' objects, as in the two processes
    assert frozen >= before * 0.9  # what start-up left is out of every later walk
    assert walked < frozen / 10  # a full collection now walks a small fraction of it
    assert found["threshold"][0] == process.YOUNG_COLLECTION_THRESHOLD  # type: ignore[index]
    assert found["cycle_collected"] is True
