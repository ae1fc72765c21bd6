"""How CPython's cyclic garbage collector runs in a long-lived process (the operator, a worker).

CPython collects container objects in three generations; a collection of the oldest one (a
*whole-heap* collection) walks every object the collector tracks, which in the operator grows
with the AgentRuns it knows of: kopf keeps its memory of each object, finished ones included.
With 10,000 finished runs present such a walk took a few hundred milliseconds of CPU, during
which the event loop serves nothing, and came about once every 400 runs admitted.

So the objects a walk finds alive are frozen right after it (``gc.freeze``: out of every later
walk, still freed by reference counting), and the next walks look only at what was made since.
Every ``WHOLE_WALK_SECONDS`` the frozen objects are given back (``gc.unfreeze``), so the next
walk covers the whole heap once and collects any cycle among them that died meanwhile: garbage
in a cycle waits at most that long, plus the time to that walk.

Frozen objects are still freed by reference counting. The rules are CPython 3.11's (three
generations, a callback told each collection's ``generation``), which the images run.

What belongs here: when the collector walks what. What does not: the rest of a process's
start-up (``process``). The ``gc`` functions used are CPython's (the ``gc`` module's
documentation: ``freeze``, ``unfreeze``, ``set_threshold``, ``callbacks``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping

YOUNG_COLLECTION_THRESHOLD = 5_000
"""Allocations of container objects (net of those freed) between two collections of the
cyclic garbage collector's youngest generation; CPython's default is 700. Each AgentRun
object, watch event and API answer a process decodes is a few hundred dicts and lists, so at
700 the operator collected about once per run admitted, and every tenth of those collected the
middle generation too."""
WHOLE_WALK_SECONDS = 600.0
"""Most seconds between two whole-heap walks that include the frozen objects: how long a cycle
among objects once frozen may stay after it died (plus the time to the next walk)."""
OLDEST = 2
"""The oldest generation's number (``gc.collect``'s and the callbacks' ``generation``)."""


class SurvivorFreezer:
    """A ``gc.callbacks`` entry: freezes what each whole-heap collection leaves alive, except
    that once ``interval`` seconds have passed since the last walk that covered everything, it
    gives the frozen objects back instead (the next whole-heap collection then covers them).

    ``clock`` is monotonic seconds. Called by CPython with ``phase`` ``"start"`` or ``"stop"``
    and ``info`` holding ``generation``; it acts only when a collection of the oldest
    generation stopped, and never raises."""

    def __init__(
        self,
        *,
        interval: float = WHOLE_WALK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.clock = clock
        self.walked = clock()
        """When the last whole-heap collection that walked every object ended."""

    def __call__(self, phase: str, info: Mapping[str, int]) -> None:
        if phase != "stop" or info.get("generation") != OLDEST:
            return
        now = self.clock()
        if gc.get_freeze_count() == 0:  # nothing was frozen: this one walked every object
            self.walked = now
        if now - self.walked >= self.interval:
            gc.unfreeze()  # the next whole-heap collection walks everything again
        else:
            gc.freeze()


def settle() -> SurvivorFreezer:
    """Collect once and freeze what is left (what start-up imported: kopf, the Kubernetes and
    ``openai`` clients' model classes, pydantic's validators; about 130,000 tracked objects in
    the operator, 150,000 in a worker); collect the youngest generation every
    ``YOUNG_COLLECTION_THRESHOLD`` allocations; and from now on freeze what each whole-heap
    collection leaves (``SurvivorFreezer``, installed once). Returns the freezer installed.

    Without the first two, every whole-heap collection walked start-up's objects again and a
    young one ran about once per run admitted: during a bulk admission the operator spent 0.8
    ms of CPU a run in the collector, 0.3 ms with them; with 10,000 finished runs present, 0.87
    ms without the freezer, 0.31 with it (bench/README.md, "The garbage collector's share")."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)
    for callback in gc.callbacks:
        if isinstance(callback, SurvivorFreezer):
            return callback
    freezer = SurvivorFreezer()
    gc.callbacks.append(freezer)
    return freezer
