"""The closed bus refuses, on a real nats-server, every attempt of issue 20's first "Done when"
bullet, and shows the refusal: an anonymous client cannot connect at all; a client with the
workers' credentials and one with a reader's credentials (namespace A) each try to list the
streams, read namespace B's events, publish an event or a TurnRequest for B's run, write the
ledger and the effect ledger, change or delete a stream or a consumer, and read monitoring.
Every attempt that is not the identity's own work is refused with a permissions violation
naming the subject, and nothing changed on the server. What each identity's work needs still
works (``test_allowed``).

Left to the workers by design (they run every tenant's turns; a stolen worker credential is
bounded by what follows, not by these): reading any run's events, appending an event to any
run, writing a tenant's ledger totals and run entries and the effect ledger (not its admission
queue: the operator's alone). Their contents are checked by the
operator and the workers themselves (signed run configs), not by NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable

import nats
import nats.errors
import nats.js.errors
import pytest
from kv_support import live_keys
from nats.js import api

from agentrun import protocol
from agentrun.natsauth import Role, jwt
from agentrun.natsauth.jwt import KeyKind, NKey
from agentrun.natsclient import NatsAuth, connect_options
from agentrun_dev import natsserver

from .conftest import (
    NAMESPACE_A,
    NAMESPACE_B,
    REFUSAL_WAIT,
    TENANT_B,
    Client,
    RunB,
    connect,
    event_subject_b,
    forged_admitted,
)

Attempt = Callable[[Client, RunB], Awaitable[object]]
EVENTS, TURNS = protocol.STREAM_EVENTS, protocol.STREAM_TURNS


async def list_streams(c: Client, run: RunB) -> object:
    return await c.js()._jsm.streams_info()


async def list_stream_names(c: Client, run: RunB) -> object:
    return await c.js()._jsm.find_stream_name_by_subject(protocol.EVENT_SUBJECTS)


async def read_b_last_event(c: Client, run: RunB) -> object:
    return await c.js()._jsm.get_last_msg(EVENTS, event_subject_b(run), direct=True)


async def follow_b_events(c: Client, run: RunB) -> object:
    js = c.js()
    return await js.subscribe(
        f"agentrun.event.{NAMESPACE_B}.>",
        stream=EVENTS,
        ordered_consumer=True,
        config=api.ConsumerConfig(name="snoop"),
    )


async def consume_whole_event_stream(c: Client, run: RunB) -> object:
    return await c.js()._jsm.add_consumer(EVENTS, api.ConsumerConfig(name="all-events"))


async def repoint_operator_consumer(c: Client, run: RunB) -> object:
    """Create-or-update the operator's durable with a filter of the caller's own namespace:
    the operator would stop seeing every other namespace's events."""
    config = api.ConsumerConfig(
        name=protocol.OPERATOR_CONSUMER,
        durable_name=protocol.OPERATOR_CONSUMER,
        filter_subject=f"agentrun.event.{NAMESPACE_A}.>",
        ack_policy=api.AckPolicy.EXPLICIT,
    )
    return await c.js()._jsm.add_consumer(EVENTS, config)


async def leave_durable_consumers(c: Client, run: RunB) -> object:
    """A durable consumer of the caller's own namespace under a name of its choosing: one
    that outlives the caller, as many as it likes."""
    config = api.ConsumerConfig(
        name="hog", durable_name="hog", filter_subject=f"agentrun.event.{NAMESPACE_A}.>"
    )
    return await c.js()._jsm.add_consumer(EVENTS, config)


async def subscribe_event_subjects(c: Client, run: RunB) -> object:
    sub = await c.nc.subscribe(protocol.EVENT_SUBJECTS)
    await c.nc.flush()
    return sub


async def subscribe_other_inboxes(c: Client, run: RunB) -> object:
    sub = await c.nc.subscribe("_INBOX.>")
    await c.nc.flush()
    return sub


async def publish_b_event(c: Client, run: RunB) -> object:
    return await c.js().publish(event_subject_b(run), forged_admitted(run))


async def publish_b_turn_request(c: Client, run: RunB) -> object:
    request = protocol.TurnRequest(run.uid, NAMESPACE_B, run.name, 1, 1)
    return await c.js().publish(
        protocol.turn_subject(TENANT_B), protocol.encode_turn_request(request)
    )


async def publish_cancel(c: Client, run: RunB) -> object:
    await c.nc.publish(protocol.cancel_subject(run.uid), b"")
    return await c.nc.flush()


async def write_ledger_book(c: Client, run: RunB) -> object:
    subject = protocol.kv_subject(protocol.LEDGER_BUCKET, f"book.{TENANT_B}")
    return await c.js().publish(subject, b'{"used": 0}')


async def write_ledger_run_entry(c: Client, run: RunB) -> object:
    subject = protocol.kv_subject(protocol.LEDGER_BUCKET, f"run.{TENANT_B}.{run.uid}")
    return await c.js().publish(subject, b'{"holds": {}}')


async def write_ledger_queue(c: Client, run: RunB) -> object:
    subject = protocol.kv_subject(protocol.LEDGER_BUCKET, f"queue.{TENANT_B}")
    return await c.js().publish(subject, b"[]")


async def queue_a_run_for_b(c: Client, run: RunB) -> object:
    subject = protocol.kv_subject(protocol.LEDGER_BUCKET, f"queue.{TENANT_B}.{uuid.uuid4().hex}")
    return await c.js().publish(subject, b'{"uid": "x", "ns": "team-b", "name": "x", "at": 0}')


async def dequeue_bs_run(c: Client, run: RunB) -> object:
    subject = protocol.kv_subject(protocol.LEDGER_BUCKET, f"queue.{TENANT_B}.{run.uid}")
    return await c.js().publish(subject, b"", headers={"KV-Operation": "PURGE"})


async def write_effect(c: Client, run: RunB) -> object:
    subject = protocol.kv_subject(protocol.EFFECTS_BUCKET, f"{run.uid}.Y2FsbA")
    return await c.js().publish(subject, b'{"state": "done", "digest": "x"}')


async def shorten_event_retention(c: Client, run: RunB) -> object:
    config = api.StreamConfig(name=EVENTS, subjects=[protocol.EVENT_SUBJECTS], max_age=1.0)
    return await c.js().update_stream(config)


async def delete_event_stream(c: Client, run: RunB) -> object:
    return await c.js().delete_stream(EVENTS)


async def purge_event_stream(c: Client, run: RunB) -> object:
    return await c.js()._jsm.purge_stream(EVENTS)


async def delete_ledger_bucket(c: Client, run: RunB) -> object:
    return await c.js().delete_stream(protocol.kv_stream(protocol.LEDGER_BUCKET))


async def delete_operator_consumer(c: Client, run: RunB) -> object:
    return await c.js()._jsm.delete_consumer(EVENTS, protocol.OPERATOR_CONSUMER)


async def delete_workers_consumer(c: Client, run: RunB) -> object:
    return await c.js()._jsm.delete_consumer(TURNS, protocol.WORKERS_CONSUMER)


async def limit_workers_deliveries(c: Client, run: RunB) -> object:
    config = api.ConsumerConfig(
        name=protocol.WORKERS_CONSUMER,
        durable_name=protocol.WORKERS_CONSUMER,
        filter_subject=protocol.TURN_SUBJECTS,
        ack_policy=api.AckPolicy.EXPLICIT,
        max_deliver=1,
    )
    return await c.js()._jsm.add_consumer(TURNS, config)


async def snapshot_event_stream(c: Client, run: RunB) -> object:
    """``nats backup stream AGENTRUN_EVENTS``'s request: every run's events sent to the
    requester's inbox (the operator's identity may; no other)."""
    inbox = c.nc.new_inbox()
    body = json.dumps({"deliver_subject": inbox, "chunk_size": 65536}).encode()
    return await c.nc.request(f"$JS.API.STREAM.SNAPSHOT.{EVENTS}", body, timeout=1.0)


async def restore_ledger_bucket(c: Client, run: RunB) -> object:
    """``nats backup restore stream KV_AGENTRUN_LEDGER``'s request: a ledger of the
    requester's making (the operator's identity may; no other)."""
    stream = protocol.kv_stream(protocol.LEDGER_BUCKET)
    body = json.dumps({"config": {"name": stream, "subjects": ["$KV.AGENTRUN_LEDGER.>"]}})
    return await c.nc.request(f"$JS.API.STREAM.RESTORE.{stream}", body.encode(), timeout=1.0)


async def read_server_monitoring(c: Client, run: RunB) -> object:
    return await c.nc.request("$SYS.REQ.SERVER.PING.VARZ", b"", timeout=1.0)


async def read_account_connections(c: Client, run: RunB) -> object:
    return await c.nc.request("$SYS.REQ.ACCOUNT.PING.CONNZ", b"", timeout=1.0)


async def read_jetstream_monitoring(c: Client, run: RunB) -> object:
    return await c.nc.request("$SYS.REQ.SERVER.PING.JSZ", b"", timeout=1.0)


ATTEMPTS: dict[str, Attempt] = {
    "list streams": list_streams,
    "list stream names": list_stream_names,
    "read B's last event": read_b_last_event,
    "follow B's events": follow_b_events,
    "consume the whole event stream": consume_whole_event_stream,
    "re-point the operator's consumer at its own namespace": repoint_operator_consumer,
    "leave a durable consumer of its own namespace": leave_durable_consumers,
    "subscribe to event subjects": subscribe_event_subjects,
    "subscribe to every inbox": subscribe_other_inboxes,
    "publish an event for B's run": publish_b_event,
    "publish a TurnRequest for B's run": publish_b_turn_request,
    "cancel B's run": publish_cancel,
    "set B's ledger book": write_ledger_book,
    "set B's run's ledger entry": write_ledger_run_entry,
    "rewrite B's admission queue": write_ledger_queue,
    "queue a run in B's admission queue": queue_a_run_for_b,
    "take B's run out of its admission queue": dequeue_bs_run,
    "mark an effect done": write_effect,
    "set max_age 1s on the event stream": shorten_event_retention,
    "delete the event stream": delete_event_stream,
    "purge the event stream": purge_event_stream,
    "delete the ledger bucket": delete_ledger_bucket,
    "delete the operator's consumer": delete_operator_consumer,
    "limit the workers' deliveries": limit_workers_deliveries,
    "delete the workers' consumer": delete_workers_consumer,
    "snapshot the event stream": snapshot_event_stream,
    "restore a ledger bucket": restore_ledger_bucket,
    "read server monitoring": read_server_monitoring,
    "read the account's connections": read_account_connections,
    "read JetStream monitoring": read_jetstream_monitoring,
}
WORKERS_OWN = {
    "read B's last event",
    "publish an event for B's run",
    "set B's ledger book",
    "set B's run's ledger entry",
    "mark an effect done",
}
"""The workers' work (see the module docstring); tested as allowed in ``test_allowed``."""

CASES = [
    pytest.param(identity, name, id=f"{identity}: {name}")
    for identity in ("worker", "reader")
    for name in ATTEMPTS
    if not (identity == "worker" and name in WORKERS_OWN)
]


@pytest.mark.parametrize(("identity", "attempt"), CASES)
async def test_the_attempt_is_refused_with_a_permissions_violation(
    identity: str, attempt: str, worker: Client, reader: Client, run_b: RunB, admin: Client
) -> None:
    client = {"worker": worker, "reader": reader}[identity]
    before_state = await snapshot(admin, run_b)
    before = len(client.errors)
    # a refused request goes unanswered; the refusal is the server's error below
    with contextlib.suppress(nats.errors.TimeoutError, TimeoutError, nats.errors.NoRespondersError):
        await ATTEMPTS[attempt](client, run_b)
    refusal = await client.refusal(before)
    print(f"{identity}: {attempt}: {refusal}")  # the refusal, for the reader of the log
    assert "permissions violation for" in refusal.lower()
    assert not client.nc.is_closed  # refused, not disconnected: nothing else is disturbed
    assert await snapshot(admin, run_b) == before_state


async def snapshot(admin: Client, run: RunB) -> dict[str, object]:
    """What the attempts could have changed: streams and their retention, B's events and
    TurnRequest, the ledger's entries, the effect ledger, the consumers."""
    js = admin.js()
    # each stream's last sequence, not its message count: any write moves it, and a purge
    # marker expiring meanwhile (``Nats-TTL``: a ledger's making guard, deleted) does not
    streams = {s.config.name: (s.config.max_age, s.state.last_seq) for s in await js.streams_info()}
    ledger = await js.key_value(protocol.LEDGER_BUCKET)
    # the effect ledger's keys from its stream's subjects (a KV key listing is a consumer that
    # may come back before it has seen every key)
    prefix = f"$KV.{protocol.EFFECTS_BUCKET}."
    kept = await js.stream_info(protocol.kv_stream(protocol.EFFECTS_BUCKET), subjects_filter=">")
    effect_keys = sorted(s.removeprefix(prefix) for s in (kept.state.subjects or {}))
    workers = await js.consumer_info(TURNS, protocol.WORKERS_CONSUMER)
    durable = [c.name for c in await js._jsm.consumers_info(EVENTS) if c.config.durable_name]
    return {
        "streams": streams,
        "book": (await ledger.get(f"book.{TENANT_B}")).value,
        "run entry": (await ledger.get(f"run.{TENANT_B}.{run.uid}")).value,
        "queued run": (await ledger.get(f"queue.{TENANT_B}.{run.uid}")).value,
        "queues": await live_keys(ledger, "queue.>"),
        "effects": effect_keys,
        "workers max_deliver": workers.config.max_deliver,
        "durable event consumers": sorted(durable),  # ephemeral ones come and go
    }


async def test_an_anonymous_client_cannot_even_connect(
    closed_server: natsserver.NatsServer,
) -> None:
    plain = closed_server.url.replace("tls://", "nats://")
    with pytest.raises(Exception) as no_tls:  # the server requires TLS; this client has none
        await nats.connect(plain, allow_reconnect=False, max_reconnect_attempts=0, tls=None)
    print(f"plain text: {no_tls.value!r}")
    tls_only = connect_options(NatsAuth(ca_file=closed_server.auth().ca_file))  # type: ignore[union-attr]
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(closed_server.url, allow_reconnect=False, **tls_only)


async def test_credentials_not_signed_by_the_installation_are_refused(
    closed_server: natsserver.NatsServer, tmp_path: object
) -> None:
    """A user the attacker signs with an account key of its own (naming the real account, or
    the system account), and a reader signed by a key that is not the account's."""
    from pathlib import Path

    authority = closed_server.authority()
    for issuer_account in (authority.account.public, authority.system):
        forged = NKey.generate(KeyKind.ACCOUNT)
        user = NKey.generate(KeyKind.USER)
        nats_claims = jwt.user_claims(account=issuer_account, tags=["role:operator"])
        token = jwt.encode(nats_claims, issuer=forged, subject=user.public, name="x", issued_at=1)
        creds = Path(str(tmp_path)) / f"forged-{issuer_account[:6]}.creds"
        from agentrun.natsauth import Creds

        creds.write_text(Creds(jwt=token, seed=user.seed).text())
        options = connect_options(NatsAuth(creds_file=creds, ca_file=closed_server.auth().ca_file))  # type: ignore[union-attr]
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(closed_server.url, allow_reconnect=False, **options)


async def test_a_reader_without_a_namespace_tag_reads_nothing(
    closed_server: natsserver.NatsServer, tmp_path: object, run_b: RunB
) -> None:
    """Signed by the readers' real key but with no namespace: the server drops every
    permission the template cannot fill in (fail closed), so it can read no namespace."""
    from pathlib import Path

    from agentrun.natsauth import Creds

    from .conftest import connect

    authority = closed_server.authority()
    user = NKey.generate(KeyKind.USER)
    claims = jwt.user_claims(account=authority.account.public, tags=["role:reader"])
    token = jwt.encode(
        claims, issuer=authority.signers[Role.READER], subject=user.public, name="x", issued_at=1
    )
    creds = Path(str(tmp_path)) / "untagged.creds"
    creds.write_text(Creds(jwt=token, seed=user.seed).text())
    ca = closed_server.auth().ca_file  # type: ignore[union-attr]
    client = await connect(closed_server, NatsAuth(creds_file=creds, ca_file=ca))
    try:
        for attempt in (read_b_last_event, follow_b_events, subscribe_event_subjects):
            before = len(client.errors)
            with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
                await attempt(client, run_b)
                await asyncio.sleep(REFUSAL_WAIT)
                raise TimeoutError  # a subscription is refused asynchronously
            assert "permissions violation" in (await client.refusal(before)).lower()
    finally:
        await client.nc.close()


async def test_the_readers_key_mints_no_more_than_a_reader(
    closed_server: natsserver.NatsServer, tmp_path: object, run_b: RunB
) -> None:
    """A user signed by the readers' scoped key that claims to be allowed everything gets the
    readers' template, or nothing: it cannot publish a TurnRequest."""
    from pathlib import Path

    from agentrun.natsauth import Creds

    authority = closed_server.authority()
    user = NKey.generate(KeyKind.USER)
    claims = {
        **jwt.user_claims(account=authority.account.public, tags=["namespace:team-b"]),
        "pub": {"allow": [">"]},
        "sub": {"allow": [">"]},
    }
    token = jwt.encode(
        claims, issuer=authority.signers[Role.READER], subject=user.public, name="x", issued_at=1
    )
    creds = Path(str(tmp_path)) / "greedy.creds"
    creds.write_text(Creds(jwt=token, seed=user.seed).text())
    options = connect_options(NatsAuth(creds_file=creds, ca_file=closed_server.auth().ca_file))  # type: ignore[union-attr]
    errors: list[Exception] = []

    async def record(err: Exception) -> None:
        errors.append(err)

    try:
        nc = await nats.connect(
            closed_server.url, allow_reconnect=False, error_cb=record, **options
        )
    except nats.errors.Error as refused:
        assert "Authorization Violation" in str(refused)
        return
    try:
        with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
            await nc.jetstream(timeout=1).publish(protocol.turn_subject(TENANT_B), b"{}")
        await asyncio.sleep(0.2)
        assert any("permissions violation" in str(e).lower() for e in errors), errors
    finally:
        await nc.close()


def test_the_monitoring_port_listens_on_loopback_only(
    closed_server: natsserver.NatsServer,
) -> None:
    import urllib.request

    with urllib.request.urlopen(f"{closed_server.monitor_url}/varz", timeout=10) as response:
        varz = json.load(response)
    assert varz["http_host"] == "127.0.0.1"
    assert varz["tls_required"] is True
    assert varz["auth_required"] is True


@pytest.mark.parametrize("name", [protocol.OPERATOR_CONSUMER, "*"])
async def test_a_reader_minted_with_any_name_creates_only_the_consumer_of_its_key(
    closed_server: natsserver.NatsServer, admin: Client, run_b: RunB, name: str
) -> None:
    """The consumer a reader may create is named after its public key, not its user name:
    whoever holds the readers' signing key (the trajectory API's pods) cannot mint a reader
    named after the operator's consumer, or ``*``, to re-point it."""
    client = await connect(closed_server, closed_server.mint_reader(NAMESPACE_A, name=name))
    try:
        before_state = await snapshot(admin, run_b)
        before = len(client.errors)
        with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):
            await repoint_operator_consumer(client, run_b)
        assert "permissions violation for" in (await client.refusal(before)).lower()
        assert await snapshot(admin, run_b) == before_state
    finally:
        await client.nc.close()


ROLLUPS = {
    "the ledger, from a book": protocol.kv_subject(protocol.LEDGER_BUCKET, f"book.{TENANT_B}"),
    "the ledger, from a run entry": protocol.kv_subject(
        protocol.LEDGER_BUCKET, f"run.{TENANT_B}.{uuid.uuid4().hex}"
    ),
    "the effect ledger": protocol.kv_subject(protocol.EFFECTS_BUCKET, f"{uuid.uuid4().hex}.Y2FsbA"),
}


@pytest.mark.parametrize("subject", ROLLUPS.values(), ids=ROLLUPS.keys())
async def test_a_worker_cannot_roll_a_bucket_up_to_a_key_it_may_write(
    worker: Client, admin: Client, run_b: RunB, subject: str
) -> None:
    """A key the workers may write, written with ``Nats-Rollup: all``, would purge every other
    key of its bucket, which no subject permission sees: every tenant's admission queue (the
    operator's alone), books and run entries, or every effect. The buckets take no rollup
    (a deleted value's purge marker needs none: a bucket keeps one message a key)."""
    before_state = await snapshot(admin, run_b)
    with pytest.raises(nats.js.errors.APIError) as refused:
        await worker.js().publish(subject, b"{}", headers={"Nats-Rollup": "all"})
    print(f"worker: roll up {subject}: {refused.value}")
    assert await snapshot(admin, run_b) == before_state
