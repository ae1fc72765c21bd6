"""Which failed tool calls may be sent again within their turn (``kernel.may_retry``): the
runner's retries (``tests/worker/test_tool_faults.py``) follow this table."""

from __future__ import annotations

import pytest

from agentrun import kernel
from agentrun.kernel import ToolFault

RETRIED = {ToolFault.TIMEOUT, ToolFault.CONNECTION, ToolFault.SERVER, ToolFault.TRANSPORT}
"""The infrastructure faults that may be retried (a crash is a bug: never)."""
RETRYABLE = [
    # (fault, effect, may it be sent again within the turn): only an infrastructure failure
    # other than a crash, and only of a tool whose repeat does no harm
    *(
        pytest.param(fault, effect, fault in RETRIED and effect != "write", id=f"{fault}-{effect}")
        for fault in ToolFault
        for effect in ("read", "idempotent", "write")
    ),
]


@pytest.mark.parametrize(("fault", "effect", "retried"), RETRYABLE)
def test_only_reads_and_idempotent_calls_are_retried_and_only_after_infrastructure_faults(
    fault: ToolFault, effect: str, retried: bool
) -> None:
    assert kernel.may_retry(fault, effect=effect) is retried


def test_backoff_doubles_from_its_base_up_to_its_cap_and_needs_a_first_retry() -> None:
    assert [kernel.backoff(n, base=0.5, cap=3) for n in (1, 2, 3, 4, 5)] == [
        0.5,
        1.0,
        2.0,
        3.0,
        3.0,
    ]
    assert kernel.backoff(1) == 0.5 and kernel.backoff(4) == 4.0 and kernel.backoff(5) == 5.0
    with pytest.raises(ValueError, match=r"^attempt 0 < 1$"):
        kernel.backoff(0)
