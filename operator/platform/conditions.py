"""Status vocabulary every kind shares: RFC 3339 times, CamelCase reasons, ``metav1.Condition``.

Pure. Conditions follow the Kubernetes API conventions (type, status, reason in CamelCase,
message, lastTransitionTime, observedGeneration). What does not belong here: any kind's status
body (each kind's ``status`` module).
"""

from __future__ import annotations

import datetime
from typing import Any


def rfc3339(epoch: float) -> str:
    """UTC RFC 3339 timestamp with second precision (the ``date-time`` format of the CRDs)."""
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def camel(reason: str) -> str:
    """``max_steps`` → ``MaxSteps`` (condition reasons are CamelCase)."""
    return "".join(part.capitalize() for part in reason.split("_"))


def condition(
    type_: str, *, status: bool, reason: str, message: str, at: float, generation: int
) -> dict[str, Any]:
    """One ``metav1.Condition`` (the message cut at 1024 characters)."""
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message[:1024],
        "lastTransitionTime": rfc3339(at),
        "observedGeneration": generation,
    }
