"""Tool faults: who caused a failed tool call, whether to retry it, when a tool is unavailable.

Pure classification, no I/O. A failed call is either an observation for the model (it sent bad
arguments, asked for something that does not exist, or the remote service refused the request:
the model can correct itself from the error text) or an infrastructure failure (the tool could
not be reached or broke: the model can do nothing about it). Only infrastructure failures may
be retried, and only they count toward ``tool_unavailable`` — and only when the same tool keeps
failing across turns (``next_unavailable``), so one bad batch never ends a run. A model that
repeats the same failing call is the no-progress breaker's job, not this module's.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping


class ToolFault(enum.StrEnum):
    """Why a tool call failed: a closed set, stored with the result in the run's history."""

    ARGUMENTS = "arguments"
    """The arguments failed the tool's schema or could not be parsed (the model's fault)."""
    DOMAIN = "domain"
    """The tool ran and refused the input: division by zero, not found, not allowed by policy
    (the model's fault)."""
    REJECTED = "rejected"
    """The remote service refused the request: HTTP 4xx, an MCP result with ``isError``
    (the model's fault)."""
    TIMEOUT = "timeout"
    """The call did not answer within its timeout (infrastructure)."""
    CONNECTION = "connection"
    """The connection was refused, reset or dropped (infrastructure)."""
    SERVER = "server"
    """The remote service failed: HTTP 5xx, an MCP JSON-RPC internal error (infrastructure)."""
    TRANSPORT = "transport"
    """The protocol broke: an unreadable response, a terminated MCP session (infrastructure)."""
    CRASHED = "crashed"
    """The tool's own code raised unexpectedly (infrastructure; a bug, never retried)."""
    EFFECT_UNKNOWN = "effect_unknown"
    """A write or idempotent call was sent before its worker stopped and its outcome was not
    recorded: it is not sent again, and the run ends ``effect_unknown``."""

    @property
    def infrastructure(self) -> bool:
        """True when the model cannot have caused it (it counts toward ``tool_unavailable``)."""
        return self not in _MODEL_FAULTS


_MODEL_FAULTS = frozenset({ToolFault.ARGUMENTS, ToolFault.DOMAIN, ToolFault.REJECTED})
_RETRYABLE = frozenset(
    {ToolFault.TIMEOUT, ToolFault.CONNECTION, ToolFault.SERVER, ToolFault.TRANSPORT}
)


def may_retry(fault: ToolFault, *, effect: str) -> bool:
    """Whether a call that failed with ``fault`` may be sent again within the same turn.

    Infrastructure failures other than a crash may be retried for ``read`` and ``idempotent``
    tools. A ``write`` call is never re-sent: a timeout or reset may have come after the effect
    happened, and repeating it blindly could do it twice.
    """
    return fault in _RETRYABLE and effect in ("read", "idempotent")


def backoff(attempt: int, *, base: float = 0.5, cap: float = 5.0) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = the first retry): ``base``
    doubled per attempt, at most ``cap``. Raises ValueError for ``attempt < 1``."""
    if attempt < 1:
        raise ValueError(f"attempt {attempt} < 1")
    return float(min(cap, base * 2 ** (attempt - 1)))


def next_unavailable(
    streaks: Mapping[str, int], outcomes: Iterable[tuple[str, ToolFault | None]]
) -> dict[str, int]:
    """Per tool, the consecutive turns in which every call of it failed for infrastructure
    reasons, after one more turn whose calls ended as ``outcomes`` (``(tool, fault)``, fault
    ``None`` for a success).

    A tool that answered at all this turn (a success, or an error the model caused) is
    reachable: its count is dropped. A tool not called this turn keeps its count.
    """
    reachable: set[str] = set()
    failing: set[str] = set()
    for name, fault in outcomes:
        if fault is not None and fault.infrastructure:
            failing.add(name)
        else:
            reachable.add(name)
    after = {name: n for name, n in streaks.items() if name not in reachable}
    for name in failing - reachable:
        after[name] = after.get(name, 0) + 1
    return after
