"""What the operator seals, on the wire: the ``Seal`` an event carries and the exact bytes it
covers. Signing and checking are ``agentrun.trust``'s; this module only says what is covered.

Two things are sealed, each under a domain string of its own, so a signature over one can
never pass for the other:

- an ``admitted`` event's run config, every field of it as the event carries it
  (``admitted_content``): the run's uid, namespace, name and tenant, the model's ``baseURL``,
  Secret reference and prices, the limits, the tools, each MCP tool's URL, transport, header
  Secret and the rule it is held to (private network, path prefix), the ``http_get`` URL
  rules, the deadline, the goal, the instructions and the output schema. No field is left
  out, so none can be swapped under a valid seal;
- an ``approval`` event's decision, bound to its run and turn (``approval_content``), so a
  decision cannot be replayed onto another run or a later batch of the same run; the reviewer
  who decided is covered with it, so the name recorded cannot be swapped either.

The bytes are the domain line and the value's canonical JSON (keys sorted, no spaces, UTF-8,
no NaN): a receiver recomputes them from the JSON object it received, not from the value it
parsed, so what it checks is exactly what the operator wrote.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Mapping
from typing import Any

ADMITTED_DOMAIN = b"agentrun.dev/v1alpha1 admitted run config\n"
APPROVAL_DOMAIN = b"agentrun.dev/v1alpha1 approval\n"


@dataclasses.dataclass(frozen=True, slots=True)
class Seal:
    """The operator's signature over an event's sealed content."""

    key_id: str
    """The id of the run-signing key that made it (``agentrun.trust.keys.key_id``)."""
    signature: bytes
    """Ed25519 signature (64 bytes) of the content."""

    def as_dict(self) -> dict[str, str]:
        """Its JSON shape: ``{"keyID": ..., "signature": <base64>}``."""
        return {"keyID": self.key_id, "signature": base64.b64encode(self.signature).decode()}

    @classmethod
    def from_dict(cls, data: Any) -> Seal:
        """Inverse of ``as_dict``; raises ``ValueError`` naming what is malformed."""
        if not isinstance(data, Mapping):
            raise ValueError("seal: not an object")
        key, signature = data.get("keyID"), data.get("signature")
        if not isinstance(key, str) or not isinstance(signature, str):
            raise ValueError("seal: keyID and signature must be strings")
        try:
            raw = base64.b64decode(signature, validate=True)
        except binascii.Error as err:
            raise ValueError(f"seal: signature is not base64: {err}") from None
        return cls(key, raw)


def canonical(value: Any) -> bytes:
    """``value`` as canonical JSON bytes: keys sorted, no whitespace, UTF-8, no NaN.
    Raises ``ValueError`` for a value JSON cannot hold."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def admitted_content(config: Mapping[str, Any]) -> bytes:
    """The bytes an ``admitted`` event's seal covers: its ``config`` JSON object."""
    return ADMITTED_DOMAIN + canonical(config)


def approval_content(
    run_uid: str, *, turn: int, digest: str, approved: bool, reviewer: str = "", after: int = 0
) -> bytes:
    """The bytes an ``approval`` event's seal covers: the decision, its run and its turn, the
    reviewer who decided when one is named (so the name cannot be changed under the seal;
    an approval naming none covers the same bytes as before reviewers), and the stream
    sequence of the event it was decided on when it names one (``after``: a rerun keeps the
    run's uid and its turn numbers, so only the position binds a decision to one admission
    and one held batch; one naming none covers the same bytes as before)."""
    content: dict[str, object] = {
        "runUID": run_uid,
        "turn": turn,
        "digest": digest,
        "approved": approved,
    }
    if reviewer:
        content["reviewer"] = reviewer
    if after:
        content["after"] = after
    return APPROVAL_DOMAIN + canonical(content)
