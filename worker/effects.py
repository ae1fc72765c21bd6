"""The effect ledger: write and idempotent tool calls recorded in JetStream KV, so a turn that
is run again (its worker died after the tool answered, before the commit) never repeats one
blindly.

Each such call has one entry, keyed by the run and the call id (the call's idempotency key
``<run-uid>:<call-id>`` in KV-key form; the id is always one committed with the model's
decision before the call runs, see ``kernel.plan_answer``, so a model answering a redone turn
with new ids cannot key a second effect): ``prepared`` is written (create-only: the first writer
wins) before the call is sent, ``done`` with its result after it answered. Running the call
again finds the entry: ``done`` replays the recorded result, and ``prepared`` — sent, outcome
unknown — is never re-sent: the call's result says so with the fault ``effect_unknown``, which
ends the run with that reason. An entry records a digest of the call's name and arguments; a
different call under the same key is never given another call's result. An entry holds at most
what one message on the bus may (its server's ``max_payload``, less room for headers): a result
that would not fit is recorded cut, with the marker tool results are cut with, and that cut
result is what the call answers, first time and replayed alike.

What does not belong here: deciding the run's end (the kernel), which tools have effects (their
``ToolSpec.effect``). Ledger failures (NATS away) raise ``EffectLedgerUnavailable``: the turn is
then not committed and runs again later, which is safe at every step.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
import uuid
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from agentrun import buckets, kernel, natsclient, protocol
from agentrun.ledger import LedgerUnavailable

__all__ = [
    "BUCKET",
    "EffectEntry",
    "EffectLedger",
    "EffectLedgerUnavailable",
    "EffectState",
    "call_digest",
    "effect_key",
    "fit_entry",
    "unknown_result",
]

BUCKET = protocol.EFFECTS_BUCKET
DEFAULT_ENTRY_CAP = kernel.MESSAGE_CAP - natsclient.HEADER_ROOM
"""The most bytes one entry may take on a nats-server with the default ``max_payload``."""
MIN_ENTRY_CAP = 4096
"""The least ``entry_cap`` a ledger takes: an entry's keys, digest and a cut result's marker."""


class EffectLedgerUnavailable(LedgerUnavailable):
    """The ledger could not be read or written; the turn must not commit (it runs again, as
    for the tenant ledger: the worker redelivers it after a pause)."""


class EffectState(enum.StrEnum):
    """Where a recorded call is."""

    PREPARED = "prepared"
    """About to be sent, or sent with no recorded outcome."""
    DONE = "done"
    """Answered; its result is recorded."""


@dataclasses.dataclass(frozen=True, slots=True)
class EffectEntry:
    """One recorded call."""

    state: EffectState
    digest: str
    """``call_digest`` of the call the entry is for."""
    result: kernel.ToolResult | None = None
    """The call's result (``done`` only)."""
    writer: str = ""
    """Who wrote a ``prepared`` entry: a token of that one ``prepare`` (empty in entries of
    earlier releases). A writer whose create's answer was lost finds its own entry by it."""


def effect_key(run_uid: str, call_id: str) -> str:
    """The KV key of a call: the run uid, then the call id in base64url (call ids may hold
    characters KV keys do not allow)."""
    encoded = base64.urlsafe_b64encode(call_id.encode()).decode().rstrip("=")
    return f"{run_uid}.{encoded}"


def call_digest(call: kernel.CheckedCall) -> str:
    """SHA-256 of the call's name and canonical JSON arguments (hex, 32 characters)."""
    canonical = json.dumps(
        [call.name, call.arguments], sort_keys=True, separators=(",", ":"), default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def unknown_result(call: kernel.CheckedCall) -> kernel.ToolResult:
    """The result of a call found ``prepared``: not sent again, outcome unknown."""
    return kernel.ToolResult(
        call.id,
        call.name,
        f"{call.name} ({call.id}) was sent before its worker stopped and its outcome was not "
        "recorded; it is not sent again",
        True,
        kernel.ToolFault.EFFECT_UNKNOWN,
    )


def _encode(entry: EffectEntry) -> bytes:
    data: dict[str, Any] = {"state": entry.state.value, "digest": entry.digest}
    if entry.writer:
        data["writer"] = entry.writer
    if entry.result is not None:
        r = entry.result
        data["result"] = {
            "content": r.content,
            "isError": r.is_error,
            "fault": r.fault.value if r.fault else None,
        }
    return json.dumps(data, separators=(",", ":")).encode()


def _decode(data: bytes, call: kernel.CheckedCall) -> EffectEntry:
    raw = json.loads(data)
    result = None
    if raw.get("result") is not None:
        r = raw["result"]
        fault = kernel.ToolFault(r["fault"]) if r.get("fault") else None
        result = kernel.ToolResult(call.id, call.name, str(r["content"]), bool(r["isError"]), fault)
    writer = str(raw.get("writer") or "")
    return EffectEntry(EffectState(raw["state"]), str(raw["digest"]), result, writer)


def fit_entry(entry: EffectEntry, cap: int) -> tuple[EffectEntry, bytes]:
    """``entry`` and its encoding, its result's content cut (``kernel.clip_result``, marker
    included) so the encoding takes at most ``cap`` bytes; ``entry`` itself when it fits.
    Raises ``ValueError`` when ``cap`` cannot hold the entry even with an empty result."""
    data = _encode(entry)
    result = entry.result
    if len(data) <= cap or result is None:
        return entry, data
    content = result.content
    limit = len(content.encode("utf-8", "surrogatepass"))
    while True:
        # escapes make the stored text longer than its UTF-8 bytes: shrink in proportion
        limit = max(0, limit * cap // len(data) - 64)
        cut = dataclasses.replace(result, content=kernel.clip_result(content, limit))
        fitted = dataclasses.replace(entry, result=cut)
        data = _encode(fitted)
        if len(data) <= cap:
            return fitted, data
        if limit == 0:
            raise ValueError(f"an effect entry cannot fit in {cap} bytes")


class EffectLedger:
    """The ledger over one KV bucket. Create with ``EffectLedger.open``."""

    def __init__(self, kv: KeyValue, *, entry_cap: int = DEFAULT_ENTRY_CAP) -> None:
        """``entry_cap``: the most bytes one entry may take (the bus's payload cap). Raises
        ``ValueError`` below ``MIN_ENTRY_CAP``."""
        if entry_cap < MIN_ENTRY_CAP:
            raise ValueError(f"entry_cap {entry_cap} is below {MIN_ENTRY_CAP} bytes")
        self._kv = kv
        self.entry_cap = entry_cap
        """The most bytes one entry may take; a larger result is recorded cut."""

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        *,
        bucket: str = BUCKET,
        entry_cap: int = DEFAULT_ENTRY_CAP,
        create: bool = True,
    ) -> EffectLedger:
        """Bind the bucket ``AGENTRUN_EFFECTS``, creating it when missing if ``create`` (the
        operator), else waiting for it (a worker: ``buckets.open_bucket``); ``entry_cap``:
        the most bytes one entry may take — pass the bus's (``Bus.event_cap``). Raises
        ``ValueError`` below ``MIN_ENTRY_CAP``."""
        config = buckets.effects_config(bucket)
        return cls(await buckets.open_bucket(js, config, create=create), entry_cap=entry_cap)

    async def prepare(self, run_uid: str, call: kernel.CheckedCall) -> EffectEntry | None:
        """Record ``call`` as about to be sent; ``None`` when this is its first record (send
        it), else the entry already there (do not send). A create whose answer was lost (a
        timeout, a leader that stepped down) is read back: the entry this very ``prepare``
        wrote (``writer``) is its first record — nothing was sent — not another's. Raises
        ``EffectLedgerUnavailable``."""
        key = effect_key(run_uid, call.id)
        entry = EffectEntry(EffectState.PREPARED, call_digest(call), writer=uuid.uuid4().hex)
        lost: Exception | None = None
        try:
            await self._kv.create(key, _encode(entry))
            return None
        except nats.js.errors.KeyWrongLastSequenceError:
            pass
        except Exception as err:  # it may have been stored: read it back
            lost = err
        try:
            found = await self._kv.get(key)
        except nats.js.errors.KeyNotFoundError as err:
            raise EffectLedgerUnavailable(f"cannot record {key}: {lost!r}") from err
        except Exception as err:
            raise EffectLedgerUnavailable(f"cannot read {key}: {err!r}") from err
        assert found.value is not None
        existing = _decode(found.value, call)
        if existing.state is EffectState.PREPARED and existing.writer == entry.writer:
            return None  # its own create landed; its answer was lost before the call was sent
        return existing

    async def done(
        self, run_uid: str, call: kernel.CheckedCall, result: kernel.ToolResult
    ) -> kernel.ToolResult:
        """Record ``call``'s result; the result as recorded: ``result``, or its content cut
        (``fit_entry``) when the entry would take more than ``entry_cap`` bytes. Raises
        ``EffectLedgerUnavailable``."""
        key = effect_key(run_uid, call.id)
        entry = EffectEntry(EffectState.DONE, call_digest(call), result)
        entry, data = fit_entry(entry, self.entry_cap)
        try:
            await self._kv.put(key, data)
        except Exception as err:
            raise EffectLedgerUnavailable(f"cannot record {key}: {err!r}") from err
        assert entry.result is not None
        return entry.result

    async def claim(self, run_uid: str, call: kernel.CheckedCall) -> kernel.ToolResult | None:
        """Claim ``call`` for sending, or say what to answer instead: ``None`` when it was never
        recorded (it is now ``prepared``: send it, then ``done``); the recorded result when it
        is ``done`` for this very call; an ``effect_unknown`` result otherwise (never send).
        Raises ``EffectLedgerUnavailable``."""
        existing = await self.prepare(run_uid, call)
        if existing is None:
            return None
        if (
            existing.state is EffectState.DONE
            and existing.result is not None
            and existing.digest == call_digest(call)
        ):
            return existing.result
        return unknown_result(call)
