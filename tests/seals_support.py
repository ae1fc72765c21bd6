"""Run-signing keys for tests that write run events as the operator would: one key pair per
test process, its ``Signer`` and its ``Verifier``, and ``sealed`` to seal an event with it."""

from __future__ import annotations

from agentrun.protocol import RunEvent
from agentrun.trust import Signer, Verifier, keys

SIGNING, TRUSTED = keys.generate(now=0.0)
SIGNER = Signer(lambda: SIGNING)
VERIFIER = Verifier(lambda: TRUSTED)


def sealed(event: RunEvent) -> RunEvent:
    """``event`` (``admitted`` or ``approval``) sealed with the test key, as the operator does."""
    return SIGNER.seal_event(event)
