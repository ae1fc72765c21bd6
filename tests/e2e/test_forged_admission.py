"""Issue 20's forged admission, tried on the live stack as an attacker would: tenant B's run is
in flight; the attacker copies B's run config, points the model's ``baseURL`` at its own
server, keeps B's Secret as the key, the namespace ``team-b``, an unknown tenant, and publishes
an ``admitted`` event and a TurnRequest with every credential it could hold — a reader's, a
worker's (a user the workers' signing key minted), the operator's NATS user without the
run-signing key. It also appends a forged admission to B's own running run and rolls B's
``used`` back to 0 in the ledger.

No model request reaches the attacker's server, no Secret is read (the API server's audit
log), the forged run and B's run end ``checkpoint_failed`` with a ``MessageRefused`` Event,
``agentrun_messages_refused_total`` counts each refusal, and B's ``used`` is restored."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import secrets
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from nats.aio.client import Client as NATS
from prometheus_client.parser import text_string_to_metric_families

from agentrun import natsclient, protocol
from agentrun.bus import Bus, BusSettings
from agentrun.ledger import codec
from agentrun.ledger.store import book_key
from agentrun.natsauth import Role
from agentrun.protocol import RunEvent, TurnRequest
from agentrun_dev import components, stack
from agentrun_dev.kubectl import create_namespace, delete_namespace
from agentrun_dev.natsserver import NatsServer

from .conftest import LEDGER_SWEEP, E2EStack, http_get, run_manifest
from .events import read_book, read_events

pytestmark = pytest.mark.e2e


@dataclasses.dataclass
class Tenants:
    """Tenant B (namespace ``ns_b``, a model whose key is in a Secret there) and namespace A."""

    ns_a: str
    ns_b: str
    tenant: str
    model: str
    key: str


@pytest.fixture
def tenants(stack_: E2EStack) -> Iterator[Tenants]:
    ns_a = create_namespace(stack_.kubectl, prefix="trust-a-")
    ns_b = create_namespace(stack_.kubectl, prefix="trust-b-")
    tenant, model, key = f"{ns_b}-tenant", f"{ns_b}-model", f"sk-b-{secrets.token_hex(16)}"
    stack_.kubectl("create", "secret", "generic", "provider-key", "-n", ns_b,
                   f"--from-literal=apiKey={key}")  # fmt: skip
    manifests = [
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentTenant",
            "metadata": {"name": tenant},
            "spec": {"namespaces": [ns_b], "budget": {"tokens": 1_000_000, "costUSD": "10"}},
        },
        {
            "apiVersion": "agentrun.dev/v1alpha1",
            "kind": "AgentModel",
            "metadata": {"name": model},
            "spec": {
                "baseURL": stack_.mock_url,
                "model": "scripted",
                "credentials": {"secretRef": {"name": "provider-key", "namespace": ns_b}},
                "pricing": {"inputPerMillionUSD": "1", "outputPerMillionUSD": "2"},
            },
        },
    ]
    for manifest in manifests:
        stack_.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))
    try:
        yield Tenants(ns_a, ns_b, tenant, model, key)
    finally:
        stack_.kubectl("delete", "agenttenant", tenant, "--ignore-not-found")
        stack_.kubectl("delete", "agentmodel", model, "--ignore-not-found")
        delete_namespace(stack_.kubectl, ns_a)
        delete_namespace(stack_.kubectl, ns_b)


SLEEP, SLEEPS = 30, 6
"""Seconds one of B's tool calls takes (the sleep tool's most), and how many it makes: the
attack must land while B is in flight (on a loaded machine the attack's connections and
refused publishes take tens of seconds)."""


def load_scenario(stack_: E2EStack, goal: str, *, quick: bool = False) -> None:
    """B's run: `SLEEPS` turns each calling a tool that takes `SLEEP` s, then an answer: in
    flight for minutes unless refused (``quick``: the answer at once)."""
    sleeps = [{"tool_calls": [{"name": "sleep", "arguments": {"seconds": SLEEP}}]}] * SLEEPS
    turns = [*([] if quick else sleeps), {"content": "done"}]
    text = yaml.safe_dump({"scenarios": [{"name": goal, "match": {"goal": goal}, "turns": turns}]})
    base = stack_.mock_url.removesuffix("/v1")
    request = urllib.request.Request(
        f"{base}/_mock/scenarios?mode=append", data=text.encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def refused(component: components.Component, reason: str) -> float:
    """``agentrun_messages_refused_total{reason}`` of one process."""
    text = http_get(f"http://127.0.0.1:{component.ports['metrics']}/metrics")
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "agentrun_messages_refused_total" and sample.labels == {
                "reason": reason
            }:
                return sample.value
    return 0.0


def secret_reads(audit_log: Path, *, namespace: str, since: float) -> list[dict[str, Any]]:
    """The API server's audit events of requests on Secrets of ``namespace`` after ``since``."""
    found = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        stamp = event.get("requestReceivedTimestamp", "").replace("Z", "+00:00")
        at = datetime.datetime.fromisoformat(stamp).timestamp()
        if ref.get("resource") == "secrets" and ref.get("namespace") == namespace and at >= since:
            found.append(event)
    return found


def b_requests(stack_: E2EStack, goal: str) -> list[dict[str, Any]]:
    """The model requests of B's run so far (its goal is unique to the test)."""
    return [r for r in stack_.mock_requests() if goal in json.dumps(r["body"])]


def write_creds(directory: Path, name: str, text: str) -> natsclient.NatsAuth:
    path = directory / f"{name}.creds"
    path.touch(mode=0o600)
    path.write_text(text)
    return natsclient.NatsAuth(creds_file=path, ca_file=None)


@dataclasses.dataclass
class Attempt:
    """What one credential tried and what the server said."""

    who: str
    what: str
    outcome: str


class Attacker:
    """A nats-py client with some credentials, as a stolen file gives them."""

    def __init__(self, server: NatsServer, auth: natsclient.NatsAuth, who: str) -> None:
        self.server, self.auth, self.who = server, auth, who
        self.errors: list[Exception] = []
        self.nc: NATS | None = None
        self.log: list[Attempt] = []

    async def __aenter__(self) -> Attacker:
        async def record(err: Exception) -> None:
            self.errors.append(err)

        assert self.server.auth_dir is not None
        auth = dataclasses.replace(self.auth, ca_file=self.server.auth_dir / "ca.crt")
        self.nc = await nats.connect(
            self.server.url, error_cb=record, allow_reconnect=False,
            **natsclient.connect_options(auth),
        )  # fmt: skip
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.nc is not None
        await self.nc.close()

    async def publish(self, what: str, subject: str, payload: bytes, **headers: str) -> str:
        """Publish through JetStream (an ack, or the refusal) and record the outcome."""
        assert self.nc is not None
        before = len(self.errors)
        try:
            ack = await self.nc.jetstream(timeout=2).publish(
                subject, payload, headers=headers or None
            )
            outcome = f"stored at {ack.seq}"
        except Exception as err:  # a refused publish gets no ack
            await asyncio.sleep(0.3)
            said = [str(e) for e in self.errors[before:]] or [repr(err)]
            outcome = f"refused: {said[0]}"
        self.log.append(Attempt(self.who, what, outcome))
        return outcome


def forged_payloads(b: RunEvent, attacker_url: str, name: str) -> tuple[RunEvent, RunEvent]:
    """B's config with the model at ``attacker_url`` and an unknown tenant: as a new run
    ``name`` (unsealed), and as B again (B's seal copied onto the changed config)."""
    assert b.config is not None
    model = dataclasses.replace(b.config.model, base_url=attacker_url)
    changed = dataclasses.replace(
        b.config, model=model, tenant="unknown", tools=("kubernetes_get",)
    )
    new = dataclasses.replace(changed, uid=uuid.uuid4().hex, name=name)
    summary = b.summary
    fresh = RunEvent("admitted", new.uid, summary, config=new, time=time.time())
    on_b = RunEvent("admitted", b.run_uid, summary, config=changed, time=time.time(), seal=b.seal)
    return fresh, on_b


def test_a_forged_admission_makes_no_model_request_and_reads_no_secret(
    stack_: E2EStack,
    tenants: Tenants,
    nats_server: NatsServer,
    control_plane: Any,
    tmp_path: Path,
) -> None:
    assert control_plane.audit_log is not None, "needs the dev control plane's audit log"
    goal = f"E2E-TRUST-B {uuid.uuid4().hex[:8]}"
    load_scenario(stack_, goal)
    attacker_server = stack.start_mockllm(
        [Path(__file__).with_name("scenarios.yaml")], launch=stack_.launch, name="attacker"
    )
    manifest = run_manifest("b", goal, tools=["sleep"])
    manifest["spec"]["model"] = tenants.model
    stack_.apply(tenants.ns_b, manifest)
    # B's first turn is charged (its status shows steps only at its next write: the ledger)
    end = time.monotonic() + 60
    while (used_before := read_book(nats_server, tenants.tenant)) is None or (
        used_before.used_tokens == 0
    ):
        assert time.monotonic() < end, "B's first turn was not charged"
        time.sleep(0.25)
    (admitted, *_) = read_events(nats_server, tenants.ns_b, "b")
    before = {
        (c.name, reason): refused(c, reason)
        for c in [stack_.operator, *stack_.workers]
        for reason in ("unsigned", "bad_signature", "ledger_rollback")
    }
    # B's first turn commits after its first SLEEP s tool call, when B starts its second model
    # call (reading B's key): the attack starts once that read is done, SLEEP s before the next
    end = time.monotonic() + 60
    while len(b_requests(stack_, goal)) < 2:
        assert time.monotonic() < end, "B did not make its second model call"
        time.sleep(0.25)
    time.sleep(1.0)
    started = time.time()
    b_calls = len(b_requests(stack_, goal))
    forged_name = f"forged-{uuid.uuid4().hex[:6]}"
    fresh, on_b = forged_payloads(admitted, stack.mockllm_url(attacker_server), forged_name)
    authority = nats_server.authority()
    reader = authority.mint(Role.READER, name="stolen-reader", namespace=tenants.ns_a)
    worker = authority.mint(Role.WORKER, name="stolen-worker")
    stack_.attackers |= {reader.public, worker.public}

    async def attack() -> list[Attempt]:
        """The forged new run from a reader and a worker."""
        subject = protocol.event_subject(tenants.ns_b, forged_name)
        request = TurnRequest(fresh.run_uid, tenants.ns_b, forged_name, 0, 1)
        turn = protocol.encode_turn_request(request)
        reader_auth = write_creds(tmp_path, "reader", reader.text())
        worker_auth = write_creds(tmp_path, "worker", worker.text())
        log: list[Attempt] = []
        async with Attacker(nats_server, reader_auth, "reader") as a:
            await a.publish("admitted event", subject, fresh.encode())
            await a.publish("TurnRequest", turn_subject, turn, **{"Nats-Msg-Id": "x:0"})
            log += a.log
        async with Attacker(nats_server, worker_auth, "worker") as a:
            stored = await a.publish("admitted event (new run)", subject, fresh.encode())
            request = dataclasses.replace(request, expected_seq=int(stored.split()[-1]))
            turn = protocol.encode_turn_request(request)
            await a.publish("TurnRequest", turn_subject, turn, **{"Nats-Msg-Id": "x:1"})
            log += a.log
        return log

    async def erase() -> None:
        """B's book rolled back to 0 used, with a worker's credentials."""
        async with Attacker(nats_server, write_creds(tmp_path, "worker", worker.text()), "w") as a:
            assert a.nc is not None
            kv = await a.nc.jetstream().key_value(protocol.LEDGER_BUCKET)
            entry = codec.decode_book((await kv.get(book_key(tenants.tenant))).value or b"")
            entry.used_tokens, entry.used_cost = 0, entry.used_cost * 0
            await kv.put(book_key(tenants.tenant), codec.encode_book(entry))

    async def forge_b() -> list[Attempt]:
        """B's own run given a forged admission carrying B's seal (first: B is ended before
        its next model call, whose key read would be B's own)."""
        async with Attacker(
            nats_server, write_creds(tmp_path, "worker", worker.text()), "worker"
        ) as a:
            await a.publish(
                "admitted event (B's run, B's seal)",
                protocol.event_subject(tenants.ns_b, "b"),
                on_b.encode(),
            )
            return a.log

    async def operator_turn() -> list[Attempt]:
        """The forged run's turn asked for with the operator's NATS user (without the
        run-signing key)."""
        operator_auth = nats_server.auth("operator")
        assert operator_auth is not None
        request = TurnRequest(fresh.run_uid, tenants.ns_b, forged_name, 0, 1)
        turn = protocol.encode_turn_request(request)
        async with Attacker(nats_server, operator_auth, "operator NATS user") as a:
            await a.publish("TurnRequest", turn_subject, turn, **{"Nats-Msg-Id": "x:2"})
            return a.log

    def delta(c: components.Component, reason: str) -> float:
        return refused(c, reason) - before[(c.name, reason)]

    turn_subject = protocol.turn_subject(tenants.tenant)
    try:
        attempts = asyncio.run(forge_b())
        attempts += asyncio.run(attack())
        attempts += asyncio.run(operator_turn())
        for attempt in attempts:
            print(f"{attempt.who}: {attempt.what}: {attempt.outcome}")
        by = {(a.who, a.what): a.outcome for a in attempts}
        assert by[("reader", "admitted event")].startswith("refused")
        assert by[("reader", "TurnRequest")].startswith("refused")
        assert by[("worker", "TurnRequest")].startswith("refused")
        assert by[("worker", "admitted event (new run)")].startswith("stored")
        assert by[("operator NATS user", "TurnRequest")].startswith("stored")

        # B's run ends checkpoint_failed, told by a MessageRefused Event
        status = stack_.wait_terminal(tenants.ns_b, "b", timeout=SLEEP + 60)
        assert status["terminalReason"] == "checkpoint_failed", status
        assert "refused" in status["message"] and "seal" in status["message"]
        # the forged run ends so on its own subject
        end = time.monotonic() + 30
        while (last := read_events(nats_server, tenants.ns_b, forged_name)[-1]).kind != "stop":
            assert time.monotonic() < end, "the forged run was not refused"
            time.sleep(0.25)
        assert last.phase.value == "checkpoint_failed"
        events = json.loads(
            stack_.kubectl("get", "events", "-n", tenants.ns_b, "-o", "json").stdout
        )["items"]
        refusals = {e["involvedObject"]["name"] for e in events if e["reason"] == "MessageRefused"}
        assert refusals == {"b", forged_name}
        # B ended and settled: its book rolled back now is restored by the sweep's floor (a
        # charge landing between a rollback and the sweep's next read would hide it; see
        # docs/trust.md), and the rollback counted
        used_before = read_book(nats_server, tenants.tenant) or used_before
        time.sleep(4 * LEDGER_SWEEP)  # the sweep has read B's settled book: its floor
        asyncio.run(erase())
        end = time.monotonic() + 30
        while (book := read_book(nats_server, tenants.tenant)) is None or (
            book.used_tokens < used_before.used_tokens
        ):
            assert time.monotonic() < end, "B's used was not restored"
            time.sleep(0.25)
        assert delta(stack_.operator, "ledger_rollback") >= 1
        assert delta(stack_.operator, "unsigned") >= 1  # the new run
        assert delta(stack_.operator, "bad_signature") >= 1  # B's copied seal
        assert sum(delta(w, "unsigned") for w in stack_.workers) >= 1  # the TurnRequest
        # no model request reached the attacker, no Secret was read
        seen = json.loads(
            http_get(stack.mockllm_url(attacker_server).removesuffix("/v1") + "/_mock/requests")
        )
        assert (seen["requests"] if isinstance(seen, dict) else seen) == []
        # B's own model calls meanwhile (one every SLEEP s) read B's key; nothing else does
        legit = len(b_requests(stack_, goal)) - b_calls
        reads = secret_reads(control_plane.audit_log, namespace=tenants.ns_b, since=started)
        assert len(reads) <= legit, (reads, legit)
    finally:
        components.stop_component(attacker_server)


def raw_admission(server: NatsServer, namespace: str, name: str) -> bytes:
    """The bytes of the run's ``admitted`` event as stored (its seal verifies over them)."""

    async def read() -> bytes:
        bus = await Bus.connect(BusSettings(url=server.url, auth=server.auth()), name="e2e-copy")
        try:
            subject = protocol.event_subject(namespace, name)
            raw = await bus.js._jsm.get_msg(
                protocol.STREAM_EVENTS, seq=1, next=True, subject=subject
            )
            return raw.data or b""
        finally:
            await bus.close()

    return asyncio.run(read())


def test_a_copy_of_the_first_lifes_admission_does_not_start_its_rerun(
    stack_: E2EStack, tenants: Tenants, nats_server: NatsServer, tmp_path: Path
) -> None:
    """A rerun keeps its run's uid. While it waits in its tenant's queue (a run holds the one
    slot), a holder of a worker's credential appends a copy of the first life's sealed
    admission to its purged subject: the operator does not follow it (no model request, a
    ``MessageRefused`` Event, ``reason="replayed"`` counted); once the slot frees, the rerun
    is admitted under its own admission, which seals its life (``status.reruns``: 1)."""
    ns, tag = tenants.ns_b, uuid.uuid4().hex[:8]
    again, gate = f"E2E-TRUST-AGAIN {tag}", f"E2E-TRUST-GATE {tag}"
    load_scenario(stack_, again, quick=True)
    load_scenario(stack_, gate)
    patch = json.dumps({"spec": {"maxConcurrentRuns": 1}})
    stack_.kubectl("patch", "agenttenant", tenants.tenant, "--type=merge", "-p", patch)
    manifest = run_manifest("again", again, tools=["sleep"])
    manifest["spec"]["model"] = tenants.model
    stack_.apply(ns, manifest)
    assert stack_.wait_terminal(ns, "again")["terminalReason"] == "completed"
    copy = raw_admission(nats_server, ns, "again")
    held = run_manifest("gate", gate, tools=["sleep"])
    held["spec"]["model"] = tenants.model
    stack_.apply(ns, held)
    stack_.wait_for(ns, "gate", lambda s: s.get("phase") == "Running")
    stack_.kubectl("annotate", "agentrun", "again", "-n", ns, "agentrun.dev/rerun=true")
    stack_.wait_for(ns, "again", lambda s: s.get("phase") == "Queued" and s.get("reruns") == 1)
    asked, replayed = len(b_requests(stack_, again)), refused(stack_.operator, "replayed")
    worker = nats_server.authority().mint(Role.WORKER, name="stolen-worker")
    stack_.attackers |= {worker.public}

    async def replay() -> str:
        auth = write_creds(tmp_path, "worker", worker.text())
        async with Attacker(nats_server, auth, "worker") as a:
            return await a.publish("copy", protocol.event_subject(ns, "again"), copy)

    assert asyncio.run(replay()).startswith("stored")
    end = time.monotonic() + 30
    while refused(stack_.operator, "replayed") == replayed:  # refused, or followed
        assert len(b_requests(stack_, again)) == asked, "turn 0 was asked under the copy"
        assert time.monotonic() < end, "the copy was neither refused nor followed"
        time.sleep(0.25)
    time.sleep(3.0)  # a turn dispatched under the copy would have reached the model now
    assert len(b_requests(stack_, again)) == asked
    events = json.loads(stack_.kubectl("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    assert "again" in {
        e["involvedObject"]["name"] for e in events if e["reason"] == "MessageRefused"
    }

    stack_.kubectl("annotate", "agentrun", "gate", "-n", ns, "agentrun.dev/cancel=true")
    status = stack_.wait_terminal(ns, "again", timeout=60)
    assert (status["terminalReason"], status["reruns"]) == ("completed", 1)
    (admitted, *_) = read_events(nats_server, ns, "again")
    assert admitted.config is not None and admitted.config.reruns == 1
    assert len(b_requests(stack_, again)) == asked + 1
