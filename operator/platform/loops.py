"""The shape the operator's background loops share: do a pass, then sleep until woken or a
deadline.

What belongs here: ``sleep_until_set``, the wait every loop ends its pass with (an event set by
a kick, an observation or a stop, or the time of its next due work, whichever comes first). What
does not: the loops themselves (each part that runs one).
"""

from __future__ import annotations

import asyncio
import contextlib


async def sleep_until_set(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until ``event`` is set or ``timeout`` seconds passed (``None``: no deadline);
    whether it was set. The event is left as it is (the caller clears it where its pass
    begins)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await event.wait()
            return True
    return False
