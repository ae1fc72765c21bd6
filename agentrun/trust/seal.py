"""Sealing and checking what the operator admits: Ed25519 signatures over the content
``protocol.sealed`` defines, made with the operator's signing key, checked against the keys a
process trusts.

A worker acts on a run only through its config, and the config reaches it as a message anyone
holding a NATS credential that may append run events could have written. So nothing in it is
taken on the message's word: the ``admitted`` event must carry a seal that verifies, with a
trusted key, over exactly the config it carries, for the run it claims to be (its uid) — and,
where the caller knows it, on that run's own subject (``check_admitted``'s ``namespace`` and
``name``). A reviewer's ``approval`` is sealed the same way, bound to its run and turn.

Refusals are values of ``SealFault`` (the ``reason`` label of
``agentrun_messages_refused_total``), raised as ``Untrusted`` with a message that names the
event, never the key material.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import ed25519

from agentrun.protocol import RunEvent, Seal
from agentrun.trust.keys import SigningKeys, TrustedKeys

SIGNATURE_BYTES = 64
"""The size of an Ed25519 signature (RFC 8032)."""


class SealFault(enum.StrEnum):
    """Why a message was refused (the metric's ``reason``)."""

    UNSIGNED = "unsigned"
    """No seal where one is required."""
    UNKNOWN_KEY = "unknown_key"
    """The seal names a key this process does not trust (never trusted, or retired)."""
    BAD_SIGNATURE = "bad_signature"
    """The signature does not verify over the content (a field changed, or a seal copied)."""
    WRONG_RUN = "wrong_run"
    """Sealed for another run: its uid, namespace or name is not the run's it arrived as."""
    REPLAYED = "replayed"
    """An ``approval`` sealed for another turn or another event of the run than the one it
    follows (a decision copied onto a later batch, or onto a rerun that holds the same call),
    or an ``admitted`` event of an earlier life of the run than its object shows (a copy of
    the first life's admission appended while its rerun waits to be admitted)."""
    CHANGED_CONFIG = "changed_config"
    """A second ``admitted`` event of a run with another config than the run's."""
    LEDGER_ROLLBACK = "ledger_rollback"
    """A tenant's ledger book showed less use than the operator had seen in its window."""


class Untrusted(Exception):
    """A message refused: ``fault`` says why, the message which event."""

    def __init__(self, fault: SealFault, message: str) -> None:
        super().__init__(message)
        self.fault = fault


class Signer:
    """Seals content with the operator's active key (``SigningKeys.active``)."""

    def __init__(
        self, keys: Callable[[], SigningKeys], *, clock: Callable[[], float] = time.time
    ) -> None:
        """``keys``: the current signing file (read again when it changes: ``files``);
        ``clock``: epoch seconds."""
        self.keys = keys
        self.clock = clock

    def seal(self, content: bytes) -> Seal:
        """The seal of ``content``. Raises ``keys.NoSigningKey`` when no key may sign now,
        ``keys.KeyFileError``/``OSError`` when the signing file cannot be read."""
        key = self.keys().active(self.clock())
        return Seal(key.id, key.sign(content))

    def seal_event(self, event: RunEvent) -> RunEvent:
        """``event`` (an ``admitted`` or ``approval`` event) with its seal. Raises
        ``ValueError`` for a kind that carries none, and what ``seal`` raises."""
        content = event.sealed_content()
        if content is None:
            raise ValueError(f"a {event.kind} event carries no seal")
        return dataclasses.replace(event, seal=self.seal(content))


class Verifier:
    """Checks seals against the trusted keys (``TrustedKeys``)."""

    def __init__(self, keys: Callable[[], TrustedKeys]) -> None:
        """``keys``: the current trust file (read again when it changes: ``files``)."""
        self.keys = keys

    def fault(self, content: bytes, seal: Seal | None) -> SealFault | None:
        """Why ``seal`` does not seal ``content``, or ``None`` when it does."""
        if seal is None:
            return SealFault.UNSIGNED
        if not seal.key_id or len(seal.signature) != SIGNATURE_BYTES:
            return SealFault.BAD_SIGNATURE  # malformed: it verifies nothing
        public = self.keys().public(seal.key_id)
        if public is None:
            return SealFault.UNKNOWN_KEY
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(public).verify(seal.signature, content)
        except InvalidSignature:
            return SealFault.BAD_SIGNATURE
        return None

    def event_fault(
        self, event: RunEvent, *, namespace: str | None = None, name: str | None = None
    ) -> SealFault | None:
        """Why ``event`` (``admitted`` or ``approval``) is not the operator's for its run, or
        ``None`` when it is. An ``admitted`` event's config must name the event's run uid and,
        when given, ``namespace`` and ``name`` (the subject it was read from)."""
        content = event.sealed_content()
        if content is None:
            return SealFault.UNSIGNED
        config = event.config
        if config is not None and (
            config.uid != event.run_uid
            or (namespace is not None and config.namespace != namespace)
            or (name is not None and config.name != name)
        ):
            return SealFault.WRONG_RUN
        return self.fault(content, event.seal)

    def check(
        self, event: RunEvent, *, namespace: str | None = None, name: str | None = None
    ) -> None:
        """Raise ``Untrusted`` unless ``event`` is the operator's (``event_fault``)."""
        fault = self.event_fault(event, namespace=namespace, name=name)
        if fault is not None:
            raise Untrusted(fault, refusal(event, fault))


def refusal(event: RunEvent, fault: SealFault) -> str:
    """What a refused ``event`` was and why, in one line (no key material)."""
    what = {
        SealFault.UNSIGNED: "carries no seal of the operator",
        SealFault.UNKNOWN_KEY: "is sealed with a key this process does not trust",
        SealFault.BAD_SIGNATURE: "has a seal that does not match its content",
        SealFault.WRONG_RUN: "was sealed for another run",
        SealFault.REPLAYED: "was sealed for another turn, event or life of the run",
        SealFault.CHANGED_CONFIG: "admits the run again with another config",
        SealFault.LEDGER_ROLLBACK: "rolls the tenant ledger back",
    }[fault]
    return f"the {event.kind} event at sequence {event.seq} of run {event.run_uid} {what}"
