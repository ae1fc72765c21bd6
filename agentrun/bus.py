"""The NATS JetStream adapter: streams, TurnRequests, run events, cancellation broadcasts.

What belongs here: every call into nats-py, and the translation of its errors into ours
(``CommitConflict``, ``EventTooLarge``). Deciding what to publish is not (operator, worker, kernel).

Commit rule: an event is appended with ``Nats-Expected-Last-Subject-Sequence``,
so two writers racing on one run cannot both commit on top of the same event; TurnRequests carry
``Nats-Msg-Id: <run-uid>:<turn>@<expected-seq>`` so JetStream drops a re-dispatch inside the
duplicate window (and never a rerun's turn, which builds on a new admission);
an event carries a ``Nats-Msg-Id`` unique to its append, so an append sent again because the
stream did not answer (a leader being elected) is never stored twice (``append_event``).

Delivery: a TurnRequest is redelivered for as long as it is not acked (no delivery limit: a
worker acks, naks with a delay, or ends the run itself; nothing is discarded by the server).
Connections: every connection reconnects for ever, also after the server closed it with a
protocol error (``-ERR``), which nats-py would otherwise treat as final (``natsclient``, whose
``connect_nats`` and ``reconnections`` are re-exported here); pull consumers are bound again
after each reconnect.

Reads: every read of a run's events that a decision rests on (the worker's history, the
operator's dispatch, recovery and sweeps) asks the stream's leader (``$JS.API.STREAM.MSG.GET``),
which answers only with what it has applied, everything it acknowledged. A direct get
(``allow_direct``) is answered by whichever server holding the stream gets it first (NATS
queue-group semantics, the client's own server preferred), and on a replicated stream a
follower may not have applied an append the leader already acknowledged: a worker that read
its run's history so saw the run *behind* its TurnRequest (issue 23). Direct gets stay on for
namespace readers (``last_event(any_replica=True)``: a display, and the only read whose
permission can name the run's subject).

Provisioning: the streams and the workers' durable consumer are created and configured by the
operator's bus alone (``provision=True``); a worker's bus only binds them, and on a closed bus
has no permission to do more (``agentrun.natsauth.permissions``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from agentrun import buckets, metrics, protocol, pulling
from agentrun.natsclient import EventTooLarge as EventTooLarge
from agentrun.natsclient import NatsAuth, close_nats, event_cap
from agentrun.natsclient import connect_nats as connect_nats
from agentrun.natsclient import reconnections as reconnections
from agentrun.protocol import RunEvent, TurnRequest

log = logging.getLogger(__name__)

JS_DELIVERY = "$JS.ACK."
"""The reply subject prefix of every message a JetStream consumer delivers."""


def cancelled_run(
    subject: str, reply: str | None, *, headers: Mapping[str, str] | None = None, data: bytes = b""
) -> str | None:
    """The run a message on a cancel subject cancels (its last token), or ``None`` for a
    message that is not the operator's broadcast (``broadcast_cancel``: no reply, no
    headers, no body): a push consumer's deliver subject is whatever its creator chose, so a
    message JetStream delivered there (``reply`` ``$JS.ACK.…``) is someone's events, and its
    idle heartbeats and flow control (a ``Status`` header, no ``$JS.ACK`` reply) are no
    cancellation either."""
    if (reply or "").startswith(JS_DELIVERY) or headers or data:
        return None
    return subject.rsplit(".", 1)[-1]


WRONG_LAST_SEQUENCE_CODES = frozenset({10071, 10164})
"""JetStream API error codes of a lost compare-and-set ("wrong last sequence"): 10071
(``JSStreamWrongLastSequenceErrF``, a single server and an R1 stream) and 10164
(``JSStreamWrongLastSequenceConstantErr``, what a replicated stream's leader answers; nats-server
#7281). Both mean the same: another writer appended first. nats-py maps both to
``KeyWrongLastSequenceError`` in ``kv.create``/``kv.update`` from 2.15.0 on (nats.py #883), the
floor in ``pyproject.toml``; this set is for the appends agentrun makes itself."""
APPEND_RETRY_SECONDS = 30.0
"""Seconds an event append goes on being sent again while the stream does not answer: longer
than a replicated stream takes to elect a new leader after its leader's server died (Raft
election timeouts are 4–9 s in nats-server), within the time a TurnRequest is kept in
progress."""
APPEND_RETRY_PAUSE = 0.5
"""Seconds between two sends of an unanswered append."""
UNANSWERED_CODES = frozenset({10008, 10158})
"""JetStream API error codes of an append that cannot be answered now: 10008 (``JetStream
system temporarily unavailable``, 503 while the stream's group has no leader) and 10158
(``duplicate message id is in process``: an earlier send of this append is proposed but not yet
stored, e.g. while the group has lost its quorum)."""
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
MSG_ID = "Nats-Msg-Id"


Subscribe = pulling.Subscribe
Handle = pulling.Handle


EVENTS_PER_RUN = 100_000
"""Events one run's subject may hold (``max_msgs_per_subject``): far above any run's (steps
are at most 1 000, each turn one event or two), a bound on a writer gone wrong."""


def _unanswered(err: nats.js.errors.APIError) -> bool:
    """Whether `err` is a stream without a leader now (503, ``UNANSWERED_CODES``)."""
    return err.code == 503 or err.err_code in UNANSWERED_CODES


class CommitConflict(Exception):
    """The run's subject moved on: another writer committed first; this commit is void."""


class WorkQueueMissing(Exception):
    """The work queue (``AGENTRUN_TURNS``) or the workers' consumer does not exist: nothing
    delivers a TurnRequest until a provisioning bus makes it again (the operator's start)."""


@dataclasses.dataclass(frozen=True, slots=True)
class WorkQueue:
    """One look at the work queue and the workers' consumer (``Bus.work_queue``): the figures
    nats-server reports, stream sequences and message counts."""

    delivered: int
    """The highest stream sequence the consumer has delivered (``delivered.stream_seq``)."""
    ack_floor: int
    """The stream sequence at or below which the consumer counts every message acknowledged
    (``ack_floor.stream_seq``)."""
    pending: int
    """Messages above ``delivered`` the consumer counts as still to deliver (``num_pending``)."""
    ack_pending: int
    """Messages delivered and not acknowledged yet: in a worker's hands or waiting out a nak's
    delay or ``ack_wait`` before redelivery (``num_ack_pending``)."""
    waiting: int
    """Pull requests of workers waiting for a message (``num_waiting``): idle demand."""
    messages: int
    """Messages the work-queue stream holds (its ``state.messages``)."""
    paused: bool = False
    """Whether a person paused the consumer (it delivers nothing until resumed)."""
    max_ack_pending: int = -1
    """The most messages the consumer lets await an acknowledgement at once (its config's
    ``max_ack_pending``, a JetStream account or server limit applied); 0 or less: no limit."""

    @property
    def full(self) -> bool:
        """Whether the consumer awaits as many acknowledgements as ``max_ack_pending`` allows:
        it then delivers nothing, to workers asking or not, until one comes."""
        return 0 < self.max_ack_pending <= self.ack_pending

    @property
    def unaccounted(self) -> int:
        """Messages the stream holds that the consumer counts neither to deliver nor
        awaiting an acknowledgement (0 when it accounts for all): each is a TurnRequest it
        will never deliver (a work queue keeps a message until its consumer acks it)."""
        return max(0, self.messages - self.pending - self.ack_pending)

    def describe(self) -> str:
        """The figures in one line, for a log."""
        most = f" of at most {self.max_ack_pending}" if self.max_ack_pending > 0 else ""
        return (
            f"consumer {protocol.WORKERS_CONSUMER}: delivered {self.delivered}, ack floor "
            f"{self.ack_floor}, pending {self.pending}, ack pending {self.ack_pending}{most}, "
            f"waiting pulls {self.waiting}{', paused' if self.paused else ''}; the stream holds "
            f"{self.messages} ({self.unaccounted} unaccounted)"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class BusSettings:
    """Stream and consumer tuning."""

    url: str
    auth: NatsAuth | None = None
    """The client's credentials and the server's CA (``natsclient.NatsAuth``); None: none."""
    ack_wait: float = 30.0
    """Seconds before an unacked TurnRequest is redelivered (workers heartbeat inside it)."""
    max_deliver: int = -1
    """Deliveries of one TurnRequest before JetStream stops delivering it; -1: no limit. A
    limit would silently discard a turn whose fault outlasts it (a ledger unreadable for a
    while), so the worker decides instead: it naks a transient fault with a delay and ends the
    run ``checkpoint_failed`` on a permanent one."""
    duplicate_window: float = 120.0
    """JetStream de-duplication window for ``Nats-Msg-Id`` (seconds)."""
    events_max_bytes: int = -1
    """``max_bytes`` of ``AGENTRUN_EVENTS`` (-1: the server's limits only); with
    ``discard: new`` a full stream refuses new events (``nats.js.errors.APIError``, "maximum
    bytes exceeded") and never drops committed ones."""
    replicas: int = 1
    """Servers that keep each stream (``num_replicas``, 1–5): 1 on a single server, 3 on a
    three-server cluster (``AGENTRUN_NATS_REPLICAS``); applied by a provisioning bus, which
    updates a stream that has another count (``buckets.provision_stream``)."""


class Bus:
    """A connected JetStream context with agentrun's streams. Create with ``Bus.connect``."""

    def __init__(
        self, nc: NATS, js: JetStreamContext, settings: BusSettings, *, provision: bool = True
    ) -> None:
        self.nc = nc
        self.js = js
        self.settings = settings
        self.provision = provision
        """Whether this bus creates and configures the streams and the workers' consumer
        (the operator's) or only binds them (a worker's)."""

    @classmethod
    async def connect(cls, settings: BusSettings, *, name: str, provision: bool = True) -> Bus:
        """Connect (retrying while the server starts); with ``provision``, make sure the
        streams and the workers' consumer exist as configured here.

        Raises ``nats.errors.NoServersError`` when no server answers, what
        ``natsclient.connect_nats`` raises for refused or unreadable credentials, and what
        ``ensure_streams`` raises (the connection is closed first: a failed connect leaves no
        client reconnecting behind it).
        """
        nc = await connect_nats(settings.url, name=name, auth=settings.auth)
        bus = cls(nc, nc.jetstream(timeout=10), settings, provision=provision)
        if provision:
            try:
                await bus.ensure_streams()
            except BaseException:
                await nc.close()
                raise
        return bus

    @property
    def event_cap(self) -> int:
        """The most bytes an event's payload may take (``natsclient.event_cap``)."""
        return event_cap(self.nc)

    async def close(self) -> None:
        """Drain and close the connection, within ``natsclient.DRAIN_SECONDS``
        (``natsclient.close_nats``)."""
        await close_nats(self.nc)

    async def ensure_streams(self) -> None:
        """Create (or update) ``AGENTRUN_TURNS`` and ``AGENTRUN_EVENTS``, and the workers'
        durable consumer (``workers_consumer``); idempotent. Raises
        ``buckets.ReplicasRefused`` when the servers cannot hold ``settings.replicas``."""
        configs = [
            api.StreamConfig(
                name=protocol.STREAM_TURNS,
                subjects=[protocol.TURN_SUBJECTS],
                retention=api.RetentionPolicy.WORK_QUEUE,
                storage=api.StorageType.FILE,
                duplicate_window=self.settings.duplicate_window,
                max_age=24 * 3600,
                num_replicas=self.settings.replicas,
            ),
            api.StreamConfig(
                name=protocol.STREAM_EVENTS,
                subjects=[protocol.EVENT_SUBJECTS],
                retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE,
                duplicate_window=self.settings.duplicate_window,
                allow_direct=True,
                num_replicas=self.settings.replicas,
                # bounded where they enter: one event at most the connection's max payload,
                # one run at most EVENTS_PER_RUN events, the stream at most events_max_bytes;
                # full, it refuses new events ("maximum bytes exceeded": a worker retries the
                # turn as NATS trouble until deleted runs' purges make room) and never drops
                # committed ones
                max_msg_size=self.nc.max_payload,
                max_msgs_per_subject=EVENTS_PER_RUN,
                max_bytes=self.settings.events_max_bytes,
                discard=api.DiscardPolicy.NEW,
                discard_new_per_subject=True,
            ),
        ]
        for config in configs:
            await buckets.provision_stream(self.js, config)
        await self.js._jsm.add_consumer(protocol.STREAM_TURNS, self.workers_consumer())

    async def streams_created(self, names: Sequence[str]) -> dict[str, datetime.datetime | None]:
        """Each of the streams ``names`` that exists: its name → its ``created`` time (None when
        the server does not report it); a missing stream is left out. Raises what nats-py
        raises when the server cannot be asked (timeout, no connection, refused)."""
        created: dict[str, datetime.datetime | None] = {}
        for name in names:
            try:
                created[name] = (await self.js.stream_info(name)).created
            except nats.js.errors.NotFoundError:
                continue
        return created

    def workers_consumer(self) -> api.ConsumerConfig:
        """The pull consumer shared by every worker (durable ``agentrun-workers``): explicit
        acks within ``ack_wait``, no delivery limit unless ``max_deliver`` says otherwise
        (re-applied at every start, so a consumer made by an older release loses its limit)."""
        return api.ConsumerConfig(
            name=protocol.WORKERS_CONSUMER,
            durable_name=protocol.WORKERS_CONSUMER,
            filter_subject=protocol.TURN_SUBJECTS,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait,
            max_deliver=self.settings.max_deliver,
            max_ack_pending=-1,
        )

    async def consume(
        self,
        subscribe: Subscribe,
        handle: Handle,
        *,
        stopping: asyncio.Event,
        concurrency: int = 0,
        drain: float = 0.0,
    ) -> None:
        """Pull messages from the consumer ``subscribe`` binds and pass each to ``handle``
        until ``stopping`` is set, then let handlers still running finish for ``drain``
        seconds before cancelling them (``pulling.consume``, which documents the rules)."""
        await pulling.consume(
            self, subscribe, handle, stopping=stopping, concurrency=concurrency, drain=drain
        )

    # --- TurnRequests -------------------------------------------------------------------------

    async def publish_turn(self, request: TurnRequest, *, tenant: str, attempt: int = 0) -> int:
        """Queue a TurnRequest; returns its stream sequence (the earlier copy's when JetStream
        saw it as a duplicate, which is fine).

        ``attempt`` > 0 re-dispatches a request that was lost from the queue: its
        ``Nats-Msg-Id`` gets the suffix ``:<attempt>`` so the duplicate window does not drop it.
        """
        msg_id = request.msg_id if attempt == 0 else f"{request.msg_id}:{attempt}"
        headers = {MSG_ID: msg_id}
        if request.traceparent:
            headers["traceparent"] = request.traceparent
        ack = await self.js.publish(
            protocol.turn_subject(tenant), protocol.encode_turn_request(request), headers=headers
        )
        return int(ack.seq)

    async def turn_queued(self, seq: int) -> bool:
        """Whether the TurnRequest at stream sequence ``seq`` is still in the work queue (not
        yet acked: waiting, in flight, or waiting out a nak's delay)."""
        try:
            await self.js._jsm.get_msg(protocol.STREAM_TURNS, seq=seq)
        except nats.js.errors.NotFoundError:
            return False
        return True

    async def work_queue(self) -> WorkQueue:
        """The workers' consumer's figures and the work queue's message count, read in that
        order (two requests: consumer info, then stream info; a message acked between the two
        is counted by neither). Raises ``WorkQueueMissing`` when either does not exist, and
        what nats-py raises when the server cannot be asked (timeout, no connection)."""
        try:
            info = await self.js._jsm.consumer_info(
                protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER
            )
            state = (await self.js._jsm.stream_info(protocol.STREAM_TURNS)).state
        except nats.js.errors.NotFoundError as err:
            raise WorkQueueMissing(f"{protocol.STREAM_TURNS}: {err}") from err
        return WorkQueue(
            delivered=int(info.delivered.stream_seq or 0) if info.delivered else 0,
            ack_floor=int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0,
            pending=int(info.num_pending or 0),
            ack_pending=int(info.num_ack_pending or 0),
            waiting=int(info.num_waiting or 0),
            messages=int(state.messages or 0),
            paused=bool(info.paused),
            max_ack_pending=int(info.config.max_ack_pending or -1) if info.config else -1,
        )

    async def drop_turn(self, seq: int) -> bool:
        """Delete the TurnRequest at stream sequence ``seq`` from the work queue (one the
        workers' consumer will never deliver, before it is published again); False when it was
        gone already (acked meanwhile). Raises what nats-py raises otherwise."""
        try:
            return bool(await self.js._jsm.delete_msg(protocol.STREAM_TURNS, seq))
        except nats.js.errors.NotFoundError:
            return False

    async def pending_turns(self) -> int:
        """TurnRequests not yet delivered to any worker (the work queue's backlog)."""
        return (await self.turn_backlog())[0]

    async def turn_backlog(self) -> tuple[int, int]:
        """(TurnRequests not yet delivered to any worker, the workers' pull requests waiting
        for one): the work queue's backlog and its idle demand, read from the workers'
        consumer (one request)."""
        info = await self.js._jsm.consumer_info(protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER)
        return int(info.num_pending or 0), int(info.num_waiting or 0)

    async def stats(
        self, event_consumers: Sequence[str] = (protocol.OPERATOR_CONSUMER,)
    ) -> metrics.BusStats:
        """Stored bytes and messages of agentrun's streams (the work queue, the run events, the
        ledger and effect buckets) and the lag of the workers' consumer and of
        ``event_consumers`` on the run events (the operator's: with shards, those of the
        shards this process holds); a stream or consumer that does not exist (yet) is left
        out. Needs the operator's permissions (stream and consumer info). Raises
        ``nats.errors.Error`` when NATS cannot be asked."""
        streams: dict[str, tuple[int, int]] = {}
        for stream in (
            protocol.STREAM_TURNS,
            protocol.STREAM_EVENTS,
            protocol.kv_stream(protocol.LEDGER_BUCKET),
            protocol.kv_stream(protocol.EFFECTS_BUCKET),
        ):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                state = (await self.js._jsm.stream_info(stream)).state
                streams[stream] = (int(state.bytes or 0), int(state.messages or 0))
        consumers: dict[str, tuple[int, int]] = {}
        for stream, consumer in (
            (protocol.STREAM_TURNS, protocol.WORKERS_CONSUMER),
            *((protocol.STREAM_EVENTS, name) for name in event_consumers),
        ):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                info = await self.js._jsm.consumer_info(stream, consumer)
                consumers[consumer] = (int(info.num_pending or 0), int(info.num_ack_pending or 0))
        workers = consumers.get(protocol.WORKERS_CONSUMER, (0, 0))
        return metrics.BusStats(workers[0], streams, consumers)

    async def turn_subscription(self) -> JetStreamContext.PullSubscription:
        """The pull consumer shared by every worker (durable ``agentrun-workers``). A
        provisioning bus creates or updates it first (``workers_consumer``); a worker's binds
        the consumer the operator made (a fetch fails until it exists, and is retried)."""
        if not self.provision:
            return await self.js.pull_subscribe_bind(
                durable=protocol.WORKERS_CONSUMER, stream=protocol.STREAM_TURNS
            )
        config = self.workers_consumer()
        await self.js._jsm.add_consumer(protocol.STREAM_TURNS, config)
        return await self.js.pull_subscribe(
            protocol.TURN_SUBJECTS,
            durable=protocol.WORKERS_CONSUMER,
            stream=protocol.STREAM_TURNS,
            config=config,
        )

    # --- run events ---------------------------------------------------------------------------

    async def append_event(
        self, namespace: str, name: str, event: RunEvent, *, expected_seq: int | None
    ) -> int:
        """Append ``event`` to the run's subject; returns its stream sequence.

        ``expected_seq`` is the sequence of the run's last event the writer built on (0: the
        subject must be empty); ``None`` appends unconditionally. An append the stream does not
        answer (its leader lost, a new one not yet elected: a timeout, no responders, 503) is
        sent again, the same message with the same ``Nats-Msg-Id`` (unique to this call), for
        up to ``APPEND_RETRY_SECONDS``: JetStream drops the copy if the first one landed, and a
        copy refused as "wrong last sequence" is checked against the subject's last event, so
        an append that landed is never reported lost, nor a lost one as landed.

        Raises ``CommitConflict`` if the subject has moved on, ``EventTooLarge`` (sending
        nothing) if the event's payload is over ``event_cap``, and nats-py's error when the
        stream still does not answer after ``APPEND_RETRY_SECONDS``.
        """
        msg_id = f"{event.run_uid}:e{expected_seq}:{uuid.uuid4().hex}"
        headers = {MSG_ID: msg_id}
        if expected_seq is not None:
            headers[EXPECTED_LAST_SUBJECT_SEQ] = str(expected_seq)
        if event.time == 0.0:
            event = dataclasses.replace(event, time=time.time())
        payload = event.encode()
        if len(payload) > self.event_cap:
            raise EventTooLarge(len(payload), self.event_cap)
        subject = protocol.event_subject(namespace, name)
        deadline = time.monotonic() + APPEND_RETRY_SECONDS
        while True:
            try:
                return int((await self.js.publish(subject, payload, headers=headers)).seq)
            except nats.js.errors.APIError as err:
                if err.err_code not in WRONG_LAST_SEQUENCE_CODES:
                    if not _unanswered(err) or time.monotonic() > deadline:
                        raise
                elif (mine := await self._landed(subject, msg_id)) is not None:
                    return mine  # an earlier try of this append landed; its answer was lost
                else:
                    raise CommitConflict(
                        f"{namespace}/{name}: expected last event {expected_seq}, the run moved on"
                    ) from err
            except (
                nats.errors.TimeoutError,
                nats.errors.NoRespondersError,
                nats.js.errors.NoStreamResponseError,
            ):
                if time.monotonic() > deadline:
                    raise
            log.warning("append to %s unanswered (a stream leader being elected?); again", subject)
            await asyncio.sleep(APPEND_RETRY_PAUSE)

    async def _landed(self, subject: str, msg_id: str) -> int | None:
        """The sequence of `subject`'s last event if it is the append `msg_id` (read from the
        stream's leader), else None."""
        try:
            raw = await self.js._jsm.get_last_msg(protocol.STREAM_EVENTS, subject)
        except nats.js.errors.NotFoundError:
            return None
        return int(raw.seq or 0) if (raw.headers or {}).get(MSG_ID) == msg_id else None

    async def last_event(
        self, namespace: str, name: str, *, any_replica: bool = False
    ) -> RunEvent | None:
        """The run's newest event, or ``None`` when it has none.

        Read from the stream's leader (``$JS.API.STREAM.MSG.GET``), so an event whose append
        was acknowledged is seen (read-your-writes; see "Reads" in the module docstring).
        ``any_replica``: a direct get any server holding the stream may answer — on a
        replicated stream it may miss events acknowledged a moment ago; only for a display (a
        namespace reader, whose permission names the run's subject in the direct get's).
        """
        raw = await self._last(namespace, name, any_replica=any_replica)
        if raw is None:
            return None
        assert raw.data is not None
        return RunEvent.decode(raw.data, seq=int(raw.seq or 0))

    async def last_sequence(self, namespace: str, name: str, *, any_replica: bool = False) -> int:
        """The stream sequence of the run's newest event, 0 when it has none; the event itself
        is not decoded (``last_event`` for ``any_replica``)."""
        raw = await self._last(namespace, name, any_replica=any_replica)
        return 0 if raw is None else int(raw.seq or 0)

    async def _last(
        self, namespace: str, name: str, *, any_replica: bool
    ) -> api.RawStreamMsg | None:
        try:
            return await self.js._jsm.get_last_msg(
                protocol.STREAM_EVENTS,
                protocol.event_subject(namespace, name),
                direct=any_replica,
            )
        except nats.js.errors.NotFoundError:
            return None

    async def first_event(self, namespace: str, name: str) -> RunEvent | None:
        """The run's oldest event (normally its admission), or ``None`` when it has none (read
        from the stream's leader)."""
        raw = await self._next_event(protocol.event_subject(namespace, name), 1)
        return None if raw is None else RunEvent.decode(raw[1], seq=raw[0])

    async def read_events(self, namespace: str, name: str, *, after_seq: int = 0) -> list[RunEvent]:
        """Every event of the run with a sequence above ``after_seq``, oldest first (read from
        the stream's leader: every event acknowledged before the call is among them)."""
        return [e async for e in self.iter_events(namespace, name, after_seq=after_seq)]

    async def iter_events(
        self, namespace: str, name: str, *, after_seq: int = 0
    ) -> AsyncGenerator[RunEvent, None]:
        """``read_events``, one event at a time: a reader that folds them (the tools a run
        called) holds one event, not the run's whole trajectory (thousands of turns, each
        with tool results of up to 16 KiB)."""
        subject = protocol.event_subject(namespace, name)
        seq = after_seq + 1
        while (raw := await self._next_event(subject, seq)) is not None:
            yield RunEvent.decode(raw[1], seq=raw[0])
            seq = raw[0] + 1

    async def _next_event(self, subject: str, seq: int) -> tuple[int, bytes] | None:
        """(sequence, payload) of the first event on ``subject`` at or after ``seq``, asked of
        the stream's leader; ``None`` when there is none."""
        try:
            raw = await self.js._jsm.get_msg(
                protocol.STREAM_EVENTS, seq=seq, subject=subject, next=True, direct=False
            )
        except nats.js.errors.NotFoundError:
            return None
        assert raw.seq is not None
        return int(raw.seq), raw.data or b""

    async def follow_events(
        self, namespace: str, name: str, *, consumer: str | None = None
    ) -> AsyncIterator[RunEvent]:
        """Every event of the run, oldest first, then each new one as it is committed, until
        the caller stops iterating (``follow_payloads``, each payload decoded)."""
        payloads = self.follow_payloads(namespace, name, consumer=consumer)
        async with contextlib.aclosing(payloads):
            async for seq, payload in payloads:
                yield RunEvent.decode(payload, seq=seq)

    async def follow_payloads(
        self, namespace: str, name: str, *, consumer: str | None = None
    ) -> AsyncGenerator[tuple[int, bytes], None]:
        """``(stream sequence, payload)`` of every event of the run, oldest first, then of
        each new one as it is committed, until the caller stops iterating; the payloads as
        stored, not decoded (a display that forwards them holds their bytes alone). An ordered
        push consumer: ephemeral, no acks, re-created by nats-py after a gap, so nothing is
        skipped or repeated; only reads the stream. ``consumer`` names it, as a namespace
        reader must (its permission names the filter in the subject of a *named* consumer's
        creation, ``natsauth.permissions.reader``)."""
        sub = await self.js.subscribe(
            protocol.event_subject(namespace, name),
            stream=protocol.STREAM_EVENTS,
            ordered_consumer=True,
            deliver_policy=api.DeliverPolicy.ALL,
            config=None if consumer is None else api.ConsumerConfig(name=consumer),
        )
        try:
            async for msg in sub.messages:
                yield int(msg.metadata.sequence.stream), msg.data
                del msg  # not kept while the next is awaited: a follow may wait for hours
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def purge_run(self, namespace: str, name: str, *, through: int = 0) -> None:
        """Delete the events of a run (on deletion of the AgentRun); missing stream is fine.
        ``through``: only those up to this stream sequence (a run's last event), so the events
        of a new AgentRun of the same name, appended after it, stay (JetStream's purge request
        with a subject filter and ``seq``: every message before ``seq``); 0: every event."""
        try:
            await self.js._jsm.purge_stream(
                protocol.STREAM_EVENTS,
                subject=protocol.event_subject(namespace, name),
                seq=through + 1 if through > 0 else None,
            )
        except nats.js.errors.NotFoundError:
            log.info("events stream missing while purging %s/%s", namespace, name)

    async def purge_effects(self, run_uid: str) -> None:
        """Delete the effect ledger's records of run ``run_uid`` (its keys
        ``<run-uid>.<call-id>``): before a rerun, which keeps the uid and may key its calls as
        the first life did (a call with no id, or one reused, is keyed
        ``<turn>:<tool>:<ordinal>``); a record left would answer the rerun's call with the
        first life's result instead of sending it, or end the rerun ``effect_unknown``. A
        missing bucket is fine."""
        try:
            await self.js._jsm.purge_stream(
                protocol.kv_stream(protocol.EFFECTS_BUCKET),
                subject=protocol.kv_subject(protocol.EFFECTS_BUCKET, f"{run_uid}.>"),
            )
        except nats.js.errors.NotFoundError:
            log.info("effect ledger missing while purging run %s", run_uid)

    async def event_subjects(self) -> list[str]:
        """Every run subject that holds events (one per run with a checkpoint); empty when the
        events stream is missing."""
        try:
            info = await self.js._jsm.stream_info(
                protocol.STREAM_EVENTS, subjects_filter=protocol.EVENT_SUBJECTS
            )
        except nats.js.errors.NotFoundError:
            return []
        return sorted((info.state.subjects or {}).keys())

    async def event_subscription(
        self, durable: str = protocol.OPERATOR_CONSUMER, *, seated_after: str = ""
    ) -> JetStreamContext.PullSubscription:
        """An operator's durable consumer ``durable`` on every run's events
        (``agentrun-operator``, or one per shard: ``protocol.operator_consumer``). Made anew,
        it starts after the ack floor of consumer ``seated_after`` if that one exists (the
        events the operator already handled with it, e.g. before it was sharded, are not
        handled again), else at the stream's first event."""
        config = api.ConsumerConfig(
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait,
            deliver_policy=api.DeliverPolicy.ALL,
            max_ack_pending=-1,
        )
        start = await self._seat(durable, seated_after) if seated_after else 0
        if start:
            config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = start
        sub = await self.js.pull_subscribe(
            protocol.EVENT_SUBJECTS,
            durable=durable,
            stream=protocol.STREAM_EVENTS,
            config=config,
        )
        await self._refilter(durable)
        return sub

    async def _refilter(self, durable: str) -> None:
        """Put consumer ``durable``'s filter back to every run's events if it was changed
        (binding to an existing durable keeps its config): a consumer filtered to fewer
        subjects would skip every other event, for good, without an error."""
        info = await self.js._jsm.consumer_info(protocol.STREAM_EVENTS, durable)
        config = info.config
        if config.filter_subject in (None, "", protocol.EVENT_SUBJECTS) and not (
            config.filter_subjects and config.filter_subjects != [protocol.EVENT_SUBJECTS]
        ):
            return
        log.error(
            "the event consumer %s was filtered to %s; filtering it to every run's events again",
            durable,
            config.filter_subjects or config.filter_subject,
        )
        config.filter_subject, config.filter_subjects = protocol.EVENT_SUBJECTS, None
        await self.js._jsm.add_consumer(protocol.STREAM_EVENTS, config)

    async def _seat(self, durable: str, after: str) -> int:
        """0 when consumer ``durable`` exists or ``after`` does not; else the stream sequence
        after ``after``'s ack floor."""
        try:
            await self.js._jsm.consumer_info(protocol.STREAM_EVENTS, durable)
            return 0
        except nats.js.errors.NotFoundError:
            pass
        try:
            info = await self.js._jsm.consumer_info(protocol.STREAM_EVENTS, after)
        except nats.js.errors.NotFoundError:
            return 0
        return int(info.ack_floor.stream_seq or 0) + 1 if info.ack_floor else 0

    # --- cancellation -------------------------------------------------------------------------

    async def broadcast_cancel(self, run_uid: str) -> None:
        """Tell every worker to abandon ``run_uid``'s turn in flight (core NATS, best effort)."""
        await self.nc.publish(protocol.cancel_subject(run_uid), b"")

    async def on_cancel(self, callback: Callable[[str], Awaitable[None]]) -> None:
        """Call ``callback(run_uid)`` for every cancellation broadcast. A message JetStream
        delivered there (its reply subject ``$JS.ACK.…``) is not one: a push consumer's
        deliver subject is its creator's to choose, unchecked by the server, so a namespace
        reader could aim its own consumer's events at another tenant's cancel subject."""

        async def handler(msg: Msg) -> None:
            uid = cancelled_run(msg.subject, msg.reply, headers=msg.headers, data=msg.data)
            if uid is None:
                log.warning("ignoring a JetStream delivery on %s: not a cancellation", msg.subject)
                return
            await callback(uid)

        await self.nc.subscribe(protocol.CANCEL_SUBJECTS, cb=handler)
