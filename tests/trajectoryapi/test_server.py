"""The trajectory API's server, in process on a real aiohttp server (as ``main`` runs it, with
``handler_cancellation``): a follow whose client left gives its NATS connection up, a quiet
follow sends keep-alive lines, a whole read streams the trajectory object, and reads beyond
the server's share wait, then get 429, and neither one namespace nor one user holds
another's share. Authentication and the access review are the pure
``access`` rules, tested apart; here they let the request through, and NATS is a stand-in."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from agentrun import bytebudget, kernel, kube
from agentrun.protocol import RunEvent
from agentrun.trajectoryapi import access, server
from agentrun_dev import certs

CONSUMER = "reader-0123456789abcdef"
PATH = "/apis/trajectory.agentrun.dev/v1alpha1/namespaces/team-a/agentruntrajectories/r1"
PATH_B = "/apis/trajectory.agentrun.dev/v1alpha1/namespaces/team-b/agentruntrajectories/r1"


class FakeBus:
    """What the server reads: ``follow_payloads`` yields ``events`` (``repeat`` times over,
    counting each in ``pulled``) then waits for ever."""

    def __init__(self, events: list[RunEvent], *, repeat: int = 1) -> None:
        self.events = events
        self.repeat = repeat
        self.pulled = 0

    async def last_sequence(self, namespace: str, name: str, *, any_replica: bool = False) -> int:
        assert any_replica  # a reader's permission allows the direct get only
        return len(self.events) * self.repeat

    async def follow_payloads(
        self, namespace: str, name: str, *, consumer: str | None = None
    ) -> AsyncIterator[tuple[int, bytes]]:
        assert consumer == CONSUMER  # the one name the request's credential may create
        payloads = [event.encode() for event in self.events]
        for seq in range(1, len(payloads) * self.repeat + 1):
            self.pulled += 1
            yield seq, payloads[(seq - 1) % len(payloads)]
        await asyncio.Event().wait()


class Harness:
    def __init__(self, events: list[RunEvent]) -> None:
        self.events = events
        self.repeat = 1
        self.buses: list[FakeBus] = []
        self.open = 0
        self.opened = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.stalled: set[str] = set()
        """Namespaces whose reads wait for NATS until the gate opens."""

    @contextlib.asynccontextmanager
    async def bus(self, namespace: str) -> AsyncIterator[Any]:
        if not self.stalled or namespace in self.stalled:
            await self.gate.wait()
        self.open += 1
        self.opened += 1
        try:
            bus = FakeBus(self.events, repeat=self.repeat)
            self.buses.append(bus)
            yield server.ReaderBus(bus, CONSUMER)  # type: ignore[arg-type]
        finally:
            self.open -= 1


DEFAULT_MAX_READS = server.MAX_READS


def user_of(*_: object, header: Callable[[str], list[str]], **__: object) -> access.User:
    """The user a request names in ``X-Remote-User`` (alice when it names none): the front
    proxy's authentication is ``access``'s, tested apart."""
    return access.User(next(iter(header("X-Remote-User")), "alice"))


def as_user(name: str) -> dict[str, str]:
    return {"X-Remote-User": name}


@pytest.fixture
def max_reads() -> int:
    """Whole reads the server serves at once (a test may parametrize it)."""
    return 1


@pytest.fixture
def event_budget() -> int:
    """Bytes of event records the server holds at once (a test may parametrize it)."""
    return server.EVENT_BUDGET


@pytest.fixture
def agent_tenants() -> list[dict[str, Any]]:
    """The AgentTenants the server knows (a test may parametrize them)."""
    return []


@pytest.fixture
async def serving(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    max_reads: int,
    event_budget: int,
    agent_tenants: list[dict[str, Any]],
) -> AsyncIterator[Any]:
    harness = Harness([])
    monkeypatch.setattr(server, "MAX_READS", max_reads)
    monkeypatch.setattr(server, "EVENT_BUDGET", event_budget)
    monkeypatch.setattr(server, "READ_TIMEOUT", 5.0)
    monkeypatch.setattr(server, "KEEPALIVE", 0.1)
    monkeypatch.setattr(server, "SLOT_WAIT", 0.3)
    monkeypatch.setattr(access, "authenticate", user_of)

    async def allowed(self: server.Server, *_: object) -> dict[str, Any]:
        return {"allowed": True}

    monkeypatch.setattr(server.Server, "_review", allowed)
    monkeypatch.setattr(server.Server, "_bus", lambda self, namespace: harness.bus(namespace))
    app_server = server.Server(proxy=None, api=None, reader=None, scratch=tmp_path)  # type: ignore[arg-type]
    for agent_tenant in agent_tenants:
        app_server.parties.put(agent_tenant)
    runner = web.AppRunner(app_server.app(), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield harness, f"http://127.0.0.1:{port}{PATH}", f"http://127.0.0.1:{port}{PATH_B}"
    finally:
        await runner.cleanup()


async def test_a_follow_whose_client_left_gives_its_connection_up(serving: Any) -> None:
    harness, url, _ = serving
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, params={"follow": "true"}) as answer,
    ):
        assert answer.status == 200
        assert await answer.content.readline() == b"\n"  # a keep-alive line, not an event
        assert harness.open == 1
    for _ in range(50):  # the client is gone: the handler ends and closes its connection
        if harness.open == 0:
            break
        await asyncio.sleep(0.1)
    assert harness.open == 0


async def test_a_whole_read_is_the_trajectory_object(serving: Any) -> None:
    harness, url, _ = serving
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert answer.status == 200
        body = json.loads(await answer.read())
    assert body == access.trajectory("team-a", "r1", [])
    assert harness.open == 0


async def test_reads_beyond_the_servers_share_wait_then_get_429(serving: Any) -> None:
    harness, url, _ = serving
    harness.gate.clear()  # the first read holds the one slot, waiting for NATS
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(session.get(url))
        await asyncio.sleep(0.1)
        async with session.get(url) as second:
            assert second.status == 429
            assert (await second.json())["reason"] == "TooManyRequests"
        harness.gate.set()
        async with await first as answer:
            assert answer.status == 200


def in_namespace(url: str, namespace: str) -> str:
    """``url`` with its namespace replaced by ``namespace``."""
    return re.sub("/namespaces/[^/]+/", f"/namespaces/{namespace}/", url)


async def status_while_held(harness: Harness, held: list[tuple[str, str]], url: str) -> int:
    """The status of bob's read of ``url`` while the reads ``held`` (namespace, user) hang
    (NATS does not answer in their namespaces: a slow store, or a client that does not read)."""
    return (await answers_while_held(harness, held, [url]))[0][0]


async def answers_while_held(
    harness: Harness, held: list[tuple[str, str]], urls: list[str]
) -> list[tuple[int, str, dict[str, Any] | None]]:
    """Bob's reads of each of ``urls``, one after another, while the reads ``held``
    (namespace, user) hang: each answer's status, ``Retry-After`` and Status body (none for
    200)."""
    harness.gate.clear()
    harness.stalled = {namespace for namespace, _ in held}
    found = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [
            asyncio.create_task(session.get(in_namespace(urls[0], ns), headers=as_user(who)))
            for ns, who in held
        ]
        await asyncio.sleep(0.2)
        for url in urls:
            async with session.get(url, headers=as_user("bob")) as answer:
                body = None if answer.status == 200 else await answer.json()
                found.append((answer.status, answer.headers.get("Retry-After", ""), body))
        harness.gate.set()
        for task in tasks:
            (await task).release()
    return found


@pytest.mark.parametrize("max_reads", [4])
async def test_one_namespace_holding_reads_leaves_another_namespace_its_read(
    serving: Any,
) -> None:
    harness, _, other = serving
    held = [("team-a", f"user-{n}") for n in range(server.MAX_READS)]
    assert await status_while_held(harness, held, other) == 200


async def test_one_namespace_holding_follows_leaves_another_namespace_its_follow(
    serving: Any,
) -> None:
    _, url, other = serving
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        held = []
        for _ in range(server.MAX_FOLLOWS):  # one namespace asks for every follow there is
            answer = await session.get(url, params={"follow": "true"})
            held.append(answer)
        assert any(answer.status == 200 for answer in held)
        async with session.get(other, params={"follow": "true"}, headers=as_user("bob")) as answer:
            assert answer.status == 200, await answer.text()
        for answer in held:
            answer.release()


BIG = RunEvent("stop", "uid", kernel.RunSummary(kernel.Phase.RUNNING, message="m" * 262_144))
"""An event of 256 KiB."""


async def stalled_client(url: str) -> socket.socket:
    """A client that asks for ``url`` and then reads nothing (a small receive buffer)."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16_384)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (parts.hostname, parts.port))
    target = f"{parts.path}?{parts.query}" if parts.query else parts.path
    await loop.sock_sendall(sock, f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


async def settled(count: Callable[[], int]) -> int:
    """``count()`` once it has not changed for half a second (5 s at most)."""
    last = -1
    for _ in range(10):
        await asyncio.sleep(0.5)
        if (now := count()) == last:
            break
        last = now
    return last


@pytest.mark.parametrize("follow", [False, True], ids=["whole read", "follow"])
async def test_a_read_whose_client_takes_nothing_holds_a_few_events_not_the_run(
    serving: Any, follow: bool
) -> None:
    harness, url, _ = serving
    harness.events, harness.repeat = [BIG], 200  # a run of 50 MiB
    sock = await stalled_client(f"{url}?follow=true" if follow else url)
    try:
        pulled = await settled(lambda: sum(bus.pulled for bus in harness.buses))
    finally:
        sock.close()
    # what the sockets' buffers take (about 4 MiB) and FOLLOW_BUFFER, never the run
    assert 0 < pulled <= 40


async def test_a_whole_read_the_store_stops_answering_is_cut_not_finished(
    serving: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness, url, _ = serving
    harness.events = [BIG]
    monkeypatch.setattr(FakeBus, "last_sequence", lambda *a, **k: asyncio.sleep(0, result=2))
    monkeypatch.setattr(server, "ANSWER_TIMEOUT", 0.5)  # the second event never comes
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert answer.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await answer.read()
    assert harness.open == 0


@pytest.mark.parametrize("max_reads", [4])
async def test_one_user_reading_in_many_namespaces_leaves_other_users_their_reads(
    serving: Any,
) -> None:
    harness, _, other = serving
    held = [(namespace, "alice") for namespace in ("team-a", "team-a", "team-c", "team-c")]
    assert await status_while_held(harness, held, other) == 200


@pytest.mark.parametrize("max_reads", [DEFAULT_MAX_READS])
async def test_four_namespaces_holding_every_read_they_may_leave_a_fifth_its_read(
    serving: Any,
) -> None:
    harness, _, other = serving
    held = [  # one tenant's namespaces, a user in each
        (namespace, namespace)
        for namespace in ("team-a", "team-c", "team-d", "team-e")
        for _ in range(server.READS_PER_NAMESPACE)
    ]
    assert await status_while_held(harness, held, other) == 200


async def follows_held(
    session: aiohttp.ClientSession, url: str, namespaces: tuple[str, ...]
) -> list[aiohttp.ClientResponse]:
    """Every follow each of ``namespaces`` may hold (``url``'s run there), a user each."""
    return [
        await session.get(
            in_namespace(url, ns), params={"follow": "true"}, headers=as_user(f"{ns}{n}")
        )
        for ns in namespaces
        for n in range(server.FOLLOWS_PER_NAMESPACE)
    ]


async def test_four_namespaces_holding_every_follow_they_may_leave_a_fifth_its_follow(
    serving: Any,
) -> None:
    _, _, other = serving
    follow = {"follow": "true"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        # one tenant's namespaces (no AgentTenant known), each following all it may
        held = await follows_held(session, other, ("team-a", "team-c", "team-d", "team-e"))
        assert all(answer.status == 200 for answer in held)
        async with session.get(other, params=follow, headers=as_user("bob")) as answer:
            assert answer.status == 200, await answer.text()
        for answer in held:
            answer.release()


class Reviews:
    """A fake ``AuthorizationV1Api``: counts the SubjectAccessReviews asked and answers each
    with ``verdict`` (or raises ``error``)."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.verdict: dict[str, Any] = {"allowed": True}
        self.error: Exception | None = None
        self.answer = asyncio.Event()
        """Cleared: every review asked waits for it (an API server slow to answer)."""
        self.answer.set()

    def __call__(self, api: object) -> Reviews:
        return self

    async def create_subject_access_review(
        self, body: dict[str, Any], *, _request_timeout: object = None
    ) -> dict[str, Any]:
        assert _request_timeout is kube.REQUEST_TIMEOUT  # never waits for ever
        self.asked.append(body)
        await self.answer.wait()
        if self.error is not None:
            raise self.error
        return {"status": dict(self.verdict)}


class ReviewApi:
    """The Kubernetes client's one method ``_review`` uses besides the API class."""

    @staticmethod
    def sanitize_for_serialization(result: dict[str, Any]) -> dict[str, Any]:
        return result


@pytest.fixture
def reviews(monkeypatch: pytest.MonkeyPatch) -> Reviews:
    fake = Reviews()
    monkeypatch.setattr(server.client, "AuthorizationV1Api", fake)
    return fake


def reviewing_server(tmp_path: Path, clock: list[float]) -> server.Server:
    made = server.Server(proxy=None, api=ReviewApi(), reader=None, scratch=tmp_path)  # type: ignore[arg-type]
    made.user_verdicts = lambda: server.cachetools.TTLCache(
        8, server.VERDICT_SECONDS, timer=lambda: clock[0]
    )
    return made


async def test_a_verdict_is_reused_for_the_same_question_until_it_expires(
    reviews: Reviews, tmp_path: Path
) -> None:
    clock = [0.0]
    app_server = reviewing_server(tmp_path, clock)
    alice, bob = access.User("alice", ("team-a",)), access.User("bob")
    run, other = access.TrajectoryPath("team-a", "r1"), access.TrajectoryPath("team-a", "r2")
    for _ in range(5):  # a flood of one user's reads of one run: one review
        assert await app_server._review(alice, run) == {"allowed": True}
    assert len(reviews.asked) == 1
    reviews.verdict = {"allowed": False, "reason": "no RoleBinding"}
    assert await app_server._review(bob, run) == reviews.verdict  # another user: asked
    assert await app_server._review(alice, other) == reviews.verdict  # another run: asked
    assert await app_server._review(bob, run) == reviews.verdict  # a denial is kept too
    assert len(reviews.asked) == 3
    clock[0] = server.VERDICT_SECONDS + 0.1  # expired: asked again, and its new verdict holds
    assert await app_server._review(alice, run) == reviews.verdict
    assert len(reviews.asked) == 4


async def test_a_verdict_with_an_evaluation_error_is_asked_again(
    reviews: Reviews, tmp_path: Path
) -> None:
    app_server = reviewing_server(tmp_path, [0.0])
    reviews.verdict = {"allowed": False, "evaluationError": "webhook timed out"}
    run = access.TrajectoryPath("team-a", "r1")
    await app_server._review(access.User("alice"), run)
    await app_server._review(access.User("alice"), run)
    assert len(reviews.asked) == 2


async def test_one_user_asking_about_ever_new_runs_forgets_only_their_own_verdicts(
    reviews: Reviews, tmp_path: Path
) -> None:
    app_server = reviewing_server(tmp_path, [0.0])
    run = access.TrajectoryPath("team-b", "r1")
    await app_server._review(access.User("bob"), run)
    reviews.verdict = {"allowed": False, "reason": "no RoleBinding"}
    for i in range(100):  # far more than a user's cache holds (8 here)
        await app_server._review(access.User("mallory"), access.TrajectoryPath("team-b", f"x{i}"))
    asked = len(reviews.asked)
    assert await app_server._review(access.User("bob"), run) == {"allowed": True}  # kept
    assert len(reviews.asked) == asked


async def test_one_users_reviews_wait_behind_each_other_not_in_front_of_anothers(
    reviews: Reviews, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reviews are asked as the server's own service account (one flow to the API
    server's fairness): a user flooding requests about new runs holds ``REVIEWS_PER_USER``
    reviews at once; the next of theirs waits, then is refused naming the user, while another
    user's is asked at once."""
    monkeypatch.setattr(server, "SLOT_WAIT", 0.3)
    app_server = reviewing_server(tmp_path, [0.0])
    reviews.answer.clear()  # the API server slow to answer
    flood = [
        asyncio.create_task(
            app_server._review(access.User("mallory"), access.TrajectoryPath("team-b", f"x{i}"))
        )
        for i in range(server.REVIEWS_PER_USER + 1)
    ]
    await asyncio.sleep(0.05)
    assert len(reviews.asked) == server.REVIEWS_PER_USER  # the last one waits for a place
    bob = asyncio.create_task(
        app_server._review(access.User("bob"), access.TrajectoryPath("team-a", "r1"))
    )
    await asyncio.sleep(0.05)
    assert reviews.asked[-1]["spec"]["user"] == "bob"  # asked at once
    with pytest.raises(server.TooManyReviews) as refused:
        await flood[-1]
    assert refused.value.full == server.Full(server.Scope("user", "mallory"), 4)
    reviews.answer.set()
    assert await bob == {"allowed": True}
    assert [await task for task in flood[:-1]] == [{"allowed": True}] * 4


async def test_many_users_asking_about_one_namespace_leave_other_namespaces_their_reviews(
    reviews: Reviews, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Users are cheap to make (service accounts): a namespace's reviews are bounded too."""
    monkeypatch.setattr(server, "SLOT_WAIT", 0.3)
    app_server = reviewing_server(tmp_path, [0.0])
    reviews.answer.clear()
    flood = [
        asyncio.create_task(
            app_server._review(access.User(f"sa-{i}"), access.TrajectoryPath("team-b", f"x{i}"))
        )
        for i in range(server.REVIEWS_PER_NAMESPACE + 1)
    ]
    await asyncio.sleep(0.05)
    assert len(reviews.asked) == server.REVIEWS_PER_NAMESPACE
    other = asyncio.create_task(
        app_server._review(access.User("sa-0"), access.TrajectoryPath("team-a", "r1"))
    )
    await asyncio.sleep(0.05)
    assert reviews.asked[-1]["spec"]["resourceAttributes"]["namespace"] == "team-a"
    with pytest.raises(server.TooManyReviews) as refused:
        await flood[-1]
    assert refused.value.full == server.Full(server.Scope("namespace", "team-b"), 8)
    reviews.answer.set()
    assert await other == {"allowed": True}
    await asyncio.gather(*flood[:-1])


async def test_a_user_past_their_reviews_is_answered_429_naming_them(
    serving: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url, _ = serving

    async def full(self: server.Server, *_: object) -> dict[str, Any]:
        raise server.TooManyReviews(server.Full(server.Scope("user", "mallory"), 4))

    monkeypatch.setattr(server.Server, "_review", full)
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert (answer.status, answer.headers["Retry-After"]) == (429, "5")
        body = await answer.json()
    assert (body["kind"], body["reason"]) == ("Status", "TooManyRequests")
    assert "user 'mallory' holds its 4 trajectory access reviews at once" in body["message"]


@pytest.mark.parametrize(
    "error",
    [server.client.ApiException(status=429, reason="Too Many Requests"), TimeoutError()],
    ids=["refused", "no-answer"],
)
async def test_a_review_that_cannot_be_made_answers_503_with_a_status(
    serving: Any, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    _, url, _ = serving

    async def failing(self: server.Server, *_: object) -> dict[str, Any]:
        raise error

    monkeypatch.setattr(server.Server, "_review", failing)
    async with aiohttp.ClientSession() as session, session.get(url) as answer:
        assert answer.status == 503
        body = await answer.json()
    assert (body["kind"], body["reason"]) == ("Status", "ServiceUnavailable")
    assert "access review could not be made" in body["message"]


async def test_a_cluster_users_certificate_claims_no_one_when_the_ca_is_shared(
    tmp_path: Path,
) -> None:
    """Over real TLS, the cluster's client CA as the request-header CA and no allowed names:
    a user's own client certificate with ``X-Remote-User: admin`` gets a 401 ``Status``
    naming the fix, and discovery is still answered."""
    pki = certs.generate_pki(tmp_path / "pki")
    alice = certs.issue_client_cert(pki, name="alice", common_name="alice")
    serving = certs.generate_server_tls(tmp_path / "serving", common_name="trajectory")
    cluster_ca = pki.ca_cert.read_text()
    proxy = access.FrontProxy.from_configmap(
        {
            "client-ca-file": cluster_ca,
            "requestheader-client-ca-file": cluster_ca,
            "requestheader-allowed-names": "[]",
            "requestheader-username-headers": '["X-Remote-User"]',
        }
    )
    app_server = server.Server(proxy=proxy, api=None, reader=None, scratch=tmp_path)  # type: ignore[arg-type]
    runner = web.AppRunner(app_server.app())
    await runner.setup()
    context = server.tls_context(cert_file=serving.cert, key_file=serving.key, client_ca=cluster_ca)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client_tls = ssl.create_default_context(cafile=str(serving.ca_cert))
    client_tls.load_cert_chain(str(alice[0]), str(alice[1]))
    base = f"https://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession(headers=as_user("admin")) as session:
            async with session.get(base + PATH, ssl=client_tls) as answer:
                assert answer.status == 401
                body = await answer.json()
            async with session.get(f"{base}/apis/{access.GROUP_VERSION}", ssl=client_tls) as found:
                assert found.status == 200
                assert (await found.json())["kind"] == "APIResourceList"
    finally:
        await runner.cleanup()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Unauthorized", 401)
    assert "--requestheader-allowed-names" in body["message"]


class Held:
    """Every amount the server's byte budget held right after a take, and its total; the
    budgets taken from (the whole one, not the parties' shares of it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[int, int]] = []
        self.budgets: set[bytebudget.ByteBudget] = set()
        take = bytebudget.ByteBudget.take

        async def recorded(bytes_: bytebudget.ByteBudget, size: int) -> int:
            taken = await take(bytes_, size)
            if bytes_.total != server.EVENT_BUDGET:  # a party's share (``test_budget``)
                return taken
            self.seen.append((bytes_.held, bytes_.total))
            self.budgets.add(bytes_)
            return taken

        monkeypatch.setattr(bytebudget.ByteBudget, "take", recorded)


async def follow_records(session: aiohttp.ClientSession, url: str, count: int) -> list[int]:
    """The ``seq`` of the first ``count`` records a follow of ``url`` writes."""
    seqs: list[int] = []
    async with session.get(url, params={"follow": "true"}) as answer:
        assert answer.status == 200, await answer.text()
        while len(seqs) < count:
            line = await answer.content.readline()
            if line.strip():
                seqs.append(json.loads(line)["seq"])
    return seqs


async def read_records(session: aiohttp.ClientSession, url: str) -> list[int]:
    async with session.get(url) as answer:
        assert answer.status == 200, await answer.text()
        return [event["seq"] for event in json.loads(await answer.read())["events"]]


async def read_and_follow_everywhere(url: str, namespaces: int, events: int) -> list[list[int]]:
    """A follow and a whole read of the run in each of ``namespaces`` namespaces, each by a
    user of its own, all at once: the ``seq`` of what each got."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        asks = []
        for n in range(namespaces):
            own = in_namespace(url, f"team-{n}")
            session.headers.update(as_user(f"user-{n}"))
            asks += [follow_records(session, own, events), read_records(session, own)]
        return await asyncio.gather(*asks)


@pytest.mark.parametrize("max_reads", [DEFAULT_MAX_READS])
@pytest.mark.parametrize(
    "event_budget", [800_000, 100_000], ids=["three big events", "less than one"]
)
async def test_every_read_and_follow_together_hold_no_more_than_the_budget(
    serving: Any, monkeypatch: pytest.MonkeyPatch, event_budget: int
) -> None:
    """8 follows and 8 whole reads of runs of 6 events of 256 KiB at once (by count alone,
    up to 32 events, 8 MiB, read ahead): never more than the budget held, and every event
    delivered, in order; an event larger than the whole budget is served alone."""
    harness, url, _ = serving
    harness.events, harness.repeat = [BIG], 6
    held = Held(monkeypatch)
    got = await read_and_follow_everywhere(url, 8, 6)
    assert got == [[1, 2, 3, 4, 5, 6]] * 16
    assert held.seen and all(amount <= total == event_budget for amount, total in held.seen)
    big = len(BIG.encode()) + access.RECORD_EXTRA
    assert max(amount for amount, _ in held.seen) >= min(big, event_budget)


async def test_a_follow_whose_client_stopped_taking_gives_its_bytes_back(
    serving: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness, url, _ = serving
    harness.events, harness.repeat = [BIG], 200
    monkeypatch.setattr(server, "WRITE_STALL", 0.5)
    held = Held(monkeypatch)
    sock = await stalled_client(f"{url}?follow=true")
    try:
        assert await settled(lambda: harness.open) == 0  # the follow ended, its reader closed
    finally:
        sock.close()
    assert held.seen and held.seen[-1][0] > 0  # its records held bytes, and gave them back:
    assert [bytes_.held for bytes_ in held.budgets] == [0]


ACME = {"metadata": {"name": "acme"}, "spec": {"namespaces": ["team-a", "team-c", "team-d"]}}
"""An AgentTenant of three namespaces (team-b is bound to none)."""


@pytest.mark.parametrize("agent_tenants", [[ACME]])
@pytest.mark.parametrize("max_reads", [DEFAULT_MAX_READS])
async def test_a_tenant_holding_its_share_of_reads_is_refused_429_naming_it_others_are_not(
    serving: Any,
) -> None:
    harness, url, other = serving
    held = [  # acme's two namespaces each hold the 2 reads a namespace may: acme's 4
        (namespace, f"{namespace}-{n}")
        for namespace in ("team-a", "team-c")
        for n in range(server.READS_PER_NAMESPACE)
    ]
    assert len(held) == server.READS_PER_TENANT
    (mine, theirs) = await answers_while_held(harness, held, [in_namespace(url, "team-d"), other])
    status, retry_after, body = mine  # a third namespace of acme's has no read left
    assert (status, retry_after) == (429, "5") and body is not None
    assert body["reason"] == "TooManyRequests" and body["details"]["retryAfterSeconds"] == 5
    assert "AgentTenant 'acme' holds its 4 trajectory reads at once" in body["message"]
    assert theirs[0] == 200  # team-b, of no tenant, reads beside it


@pytest.mark.parametrize("agent_tenants", [[ACME]])
async def test_a_tenant_holding_its_share_of_follows_leaves_another_namespace_its_follow(
    serving: Any,
) -> None:
    _, url, other = serving
    follow = {"follow": "true"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        held = await follows_held(session, url, ("team-a", "team-c"))  # 8 + 8: acme's 16
        assert all(answer.status == 200 for answer in held)
        mine = in_namespace(url, "team-d")
        async with session.get(mine, params=follow, headers=as_user("dora")) as answer:
            assert (answer.status, answer.headers["Retry-After"]) == (429, "5")
            assert "AgentTenant 'acme' holds its 16" in (await answer.json())["message"]
        async with session.get(other, params=follow, headers=as_user("bob")) as answer:
            assert answer.status == 200, await answer.text()
        for answer in held:
            answer.release()
