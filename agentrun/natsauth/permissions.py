"""Who may do what on the bus: the NATS permissions of each agentrun identity.

Three identities, each allowed exactly the subjects it uses and nothing else (NATS permissions
are allow lists: what is not listed is refused, the server answering a permissions violation):

- ``operator``: creates and configures every stream, KV bucket and the workers' durable
  consumer (nobody else may), publishes TurnRequests, run events and cancellations, consumes
  every run's events through its durable consumer, reads the work queue's backlog, purges a
  deleted run's events and a rerun's effect records, reads and writes the whole tenant ledger
  (books and queues), and snapshots and restores the streams that hold state (`BACKED_UP`:
  backups for disaster recovery, taken and restored by a person with this identity's
  ``nats.creds``).
- ``worker``: pulls TurnRequests from the workers' durable consumer and acknowledges them,
  reads run events and appends them (committing turns), writes the ledger's totals and run
  entries (holds and settlements: ``book.<tenant>``, ``run.<tenant>.<run-uid>``, one atomic
  batch of both) but not its admission queues, writes the effect ledger, and hears
  cancellations. It cannot create, change or delete a stream, consumer or bucket, publish a
  TurnRequest or a cancellation, or purge anything.
- ``reader`` (one per namespace, minted at run time): follows the events of runs in its
  namespace (``agentrun.event.<namespace>.>``) through an ordered consumer it names, and reads
  a run's last event there; nothing else.

Every identity has an inbox subtree of its own (``_INBOX.<role>`` and, for a reader,
``_INBOX.reader.<namespace>``) for the replies of the JetStream API: it cannot subscribe to
another identity's replies. The subjects of the JetStream API are the server's
(``$JS.API.STREAM.*``, ``$JS.API.CONSUMER.*``, ``$JS.API.DIRECT.GET.*``, acknowledgements on
``$JS.ACK.<stream>.<consumer>.>``, flow control on ``$JS.FC.<stream>.>``; NATS docs, "JetStream
wire API reference"); the names come from ``agentrun.protocol``. The system account and its
``$SYS`` subjects (server monitoring over NATS) are no identity's.

What belongs here: the lists, as data. Signing them into tokens is ``authority``.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from agentrun import protocol

JS_API = "$JS.API"
NAMESPACE_TAG = "namespace"
"""The tag (``namespace:<name>``) that binds a reader to its namespace."""
ROLE_TAG = "role"
"""The tag (``role:<role>``) every minted user carries; it picks the client's inbox subtree."""


BACKED_UP = (
    protocol.STREAM_EVENTS,
    protocol.kv_stream(protocol.LEDGER_BUCKET),
    protocol.kv_stream(protocol.EFFECTS_BUCKET),
)
"""The streams that hold state, which the operator's identity may snapshot and restore
(``nats backup stream`` / ``nats backup restore stream``); the work queue holds nothing durable."""


class Role(enum.StrEnum):
    """An agentrun identity on NATS."""

    OPERATOR = "operator"
    WORKER = "worker"
    READER = "reader"


@dataclasses.dataclass(frozen=True, slots=True)
class Permissions:
    """What one identity may publish and subscribe to (NATS subjects, wildcards allowed;
    ``{{tag(namespace)}}`` is filled in by the server from the user's tags)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    max_subscriptions: int = -1
    """Subscriptions one connection may hold; -1: no limit."""

    def template(self) -> dict[str, Any]:
        """The ``template`` of a scoped signing key (nats-io/jwt ``UserPermissionLimits``)."""
        return {
            "pub": {"allow": list(self.publish)},
            "sub": {"allow": list(self.subscribe)},
            "subs": self.max_subscriptions,
            "data": -1,
            "payload": -1,
        }


def inbox_prefix(role: Role | str, *, namespace: str | None = None) -> str:
    """The inbox subtree a client of ``role`` uses: ``_INBOX.<role>`` (a reader's:
    ``_INBOX.reader.<namespace>``)."""
    role = Role(role)
    if role is Role.READER:
        if not namespace:
            raise ValueError("a reader's inbox needs its namespace")
        return f"_INBOX.reader.{namespace}"
    return f"_INBOX.{role.value}"


def _stream_admin(stream: str) -> list[str]:
    return [f"{JS_API}.STREAM.{verb}.{stream}" for verb in ("CREATE", "UPDATE", "INFO")]


def _durable(stream: str, consumer: str) -> list[str]:
    """Pulling from and acknowledging on one durable consumer."""
    return [
        f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{consumer}",
        f"$JS.ACK.{stream}.{consumer}.>",
    ]


def _backup(stream: str) -> list[str]:
    """Taking a snapshot of `stream` (``nats backup stream``: the request, then acks of the
    chunks the server sends to the client's inbox) and restoring one (``nats backup restore
    stream``: the request, then chunks sent to the subject the server names)."""
    return [
        f"{JS_API}.STREAM.SNAPSHOT.{stream}",
        f"$JS.SNAPSHOT.ACK.{stream}.>",
        f"{JS_API}.STREAM.RESTORE.{stream}",
        f"$JS.SNAPSHOT.RESTORE.{stream}.>",
    ]


def _kv_read(bucket: str) -> list[str]:
    stream = protocol.kv_stream(bucket)
    return [f"{JS_API}.STREAM.INFO.{stream}", f"{JS_API}.STREAM.MSG.GET.{stream}"]


def _direct_get(stream: str) -> list[str]:
    """Direct gets of ``stream``, which this release's operator and workers no longer make (a
    replica may answer them behind the leader: they read from the leader), kept for the
    previous release's processes while a rolling upgrade replaces them."""
    return [f"{JS_API}.DIRECT.GET.{stream}", f"{JS_API}.DIRECT.GET.{stream}.>"]


def operator() -> Permissions:
    """The operator's permissions (see the module docstring)."""
    ledger = protocol.kv_stream(protocol.LEDGER_BUCKET)
    streams = [
        protocol.STREAM_TURNS,
        protocol.STREAM_EVENTS,
        ledger,
        protocol.kv_stream(protocol.EFFECTS_BUCKET),
    ]
    turns, events = protocol.STREAM_TURNS, protocol.STREAM_EVENTS
    publish = [
        *(subject for stream in streams for subject in _stream_admin(stream)),
        # the workers' durable consumer: created, configured and watched here only
        f"{JS_API}.CONSUMER.CREATE.{turns}.{protocol.WORKERS_CONSUMER}.>",
        f"{JS_API}.CONSUMER.INFO.{turns}.{protocol.WORKERS_CONSUMER}",
        # deleted by hand with the operator's identity (the NATS pod's `nats` CLI) when its
        # state no longer matches the work queue; the orphan watch makes it again
        f"{JS_API}.CONSUMER.DELETE.{turns}.{protocol.WORKERS_CONSUMER}",
        f"{JS_API}.STREAM.MSG.GET.{turns}",  # is a TurnRequest still queued
        # a TurnRequest the workers' consumer will never deliver, taken out before it is
        # published again (``runs.orphans``)
        f"{JS_API}.STREAM.MSG.DELETE.{turns}",
        # its own durable consumers on every run's events: ``agentrun-operator``, or one per
        # shard (``agentrun-operator-<i>``; a subject permission cannot match a name's prefix,
        # so any consumer name on this stream, whose every event the operator may read anyway)
        f"{JS_API}.CONSUMER.CREATE.{events}.*.>",
        f"{JS_API}.CONSUMER.DURABLE.CREATE.{events}.*",
        f"{JS_API}.CONSUMER.INFO.{events}.*",
        *_durable(events, "*"),
        f"{JS_API}.STREAM.MSG.GET.{events}",  # a run's events, from the stream's leader
        *_direct_get(events),
        f"{JS_API}.STREAM.PURGE.{events}",  # a deleted run's events
        # a rerun's effect records (its uid's keys: the rerun keeps the uid)
        f"{JS_API}.STREAM.PURGE.{protocol.kv_stream(protocol.EFFECTS_BUCKET)}",
        protocol.TURN_SUBJECTS,
        protocol.EVENT_SUBJECTS,
        protocol.CANCEL_SUBJECTS,
        # the tenant ledger, every key; its keys are listed from the stream's info (no
        # consumer: ``LedgerStore`` creates none, so a listing cannot exhaust the account's)
        protocol.kv_subject(protocol.LEDGER_BUCKET, ">"),
        f"{JS_API}.STREAM.MSG.GET.{ledger}",
        # backups of the streams that hold state (docs/operations.md), with this identity
        *(subject for stream in BACKED_UP for subject in _backup(stream)),
    ]
    return Permissions(tuple(publish), (f"{inbox_prefix(Role.OPERATOR)}.>",))


def worker() -> Permissions:
    """The workers' permissions (see the module docstring)."""
    events = protocol.STREAM_EVENTS
    publish = [
        *_durable(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER),
        protocol.EVENT_SUBJECTS,  # committing turns, with the expected last sequence
        f"{JS_API}.STREAM.MSG.GET.{events}",  # a run's events, from the stream's leader
        *_direct_get(events),
        *_kv_read(protocol.LEDGER_BUCKET),
        protocol.kv_subject(protocol.LEDGER_BUCKET, f"{protocol.LEDGER_TOTALS}.>"),
        protocol.kv_subject(protocol.LEDGER_BUCKET, f"{protocol.LEDGER_RUNS}.>"),
        *_kv_read(protocol.EFFECTS_BUCKET),
        protocol.kv_subject(protocol.EFFECTS_BUCKET, ">"),
    ]
    subscribe = [f"{inbox_prefix(Role.WORKER)}.>", protocol.CANCEL_SUBJECTS]
    return Permissions(tuple(publish), tuple(subscribe))


def reader() -> Permissions:
    """A namespace reader's permissions, as a template: ``{{tag(namespace)}}`` is the reader's
    namespace tag, so one scoped signing key mints readers of any namespace, each bound to
    its own. The ordered consumer must be named, so that its filter is part of the subject
    the server checks (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``, NATS ADR-31),
    and its name is the reader's own public key (``{{subject()}}``, ``U…``: ``Creds.public``):
    a create of a consumer that exists updates it, so a reader allowed any name could re-point
    another's — the operator's — at its own namespace, and leave as many durable consumers
    behind as it liked. The key, unlike a user name, is not the minter's to choose: whoever
    holds the readers' signing key cannot mint a reader named after another consumer."""
    events = protocol.STREAM_EVENTS
    own = f"agentrun.event.{{{{tag({NAMESPACE_TAG})}}}}.>"
    publish = [
        f"{JS_API}.CONSUMER.CREATE.{events}.{{{{subject()}}}}.{own}",
        f"{JS_API}.DIRECT.GET.{events}.{own}",
        f"$JS.FC.{events}.>",
    ]
    subscribe = [f"_INBOX.reader.{{{{tag({NAMESPACE_TAG})}}}}.>"]
    return Permissions(tuple(publish), tuple(subscribe), max_subscriptions=100)


def for_role(role: Role) -> Permissions:
    """The permissions of ``role``."""
    match role:
        case Role.OPERATOR:
            return operator()
        case Role.WORKER:
            return worker()
        case Role.READER:
            return reader()
