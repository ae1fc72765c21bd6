"""A least-recently-used cache bounded by the weight of what it holds, not by a count: the
operator's caches of what tenants wrote (a queued run's spec and config, an AgentEval's
checked spec) hold bounded memory whatever those objects are. Everything cached can be read
or built again, so forgetting costs time, never a result."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import cachetools

K = TypeVar("K")
V = TypeVar("V")


class WeighedCache(cachetools.LRUCache[K, V]):
    """At most ``maxsize`` of weight (``getsizeof`` of each value), the least recently used
    forgotten first. A value heavier than ``maxsize`` alone is not kept (nor the key's
    earlier one): the next look-up misses."""

    def __init__(self, maxsize: int, getsizeof: Callable[[V], int]) -> None:
        super().__init__(maxsize, getsizeof)

    def __setitem__(self, key: K, value: V) -> None:
        if self.getsizeof(value) > self.maxsize:
            self.pop(key, None)
            return
        super().__setitem__(key, value)
