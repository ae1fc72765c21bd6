"""A transient fault makes a turn wait (redelivered however long it lasts), never end its run:
which errors count as transient, and the API server's "try again" answers reading a model's
Secret among them."""

from __future__ import annotations

import asyncio
import base64
import types
from typing import Any

import aiohttp
import nats.errors
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.bus import EventTooLarge
from agentrun.ledger import LedgerCorrupt, LedgerUnavailable
from agentrun.protocol import SecretRef
from agentrun.tools import ToolError
from agentrun.worker import secrets as secrets_module
from agentrun.worker.consumer import is_transient
from agentrun.worker.model import ModelError
from agentrun.worker.secrets import MISSING_GRACE, STALE_RETRY, KubeSecrets, SecretUnavailable

TRANSIENT = {
    "nats-timeout": nats.errors.TimeoutError(),
    "nats-no-servers": nats.errors.NoServersError(),
    "nats-connection-closed": nats.errors.ConnectionClosedError(),
    "ledger-contended": LedgerUnavailable("book.t: 40 compare-and-set attempts lost"),
    "ledger-unreadable": LedgerCorrupt("malformed ledger entry"),
    "api-server-unavailable": SecretUnavailable("HTTP 503"),
}
PERMANENT = {
    "over-max-payload": nats.errors.MaxPayloadError(),
    "event-too-large-even-shrunk": EventTooLarge(2_000_000, 1_044_480),
    "a-bug": KeyError("x"),
    "model-error": ModelError("HTTP 400"),
}


@pytest.mark.parametrize("err", TRANSIENT.values(), ids=TRANSIENT.keys())
def test_transient_faults_make_the_turn_wait(err: Exception) -> None:
    assert is_transient(err)


@pytest.mark.parametrize("err", PERMANENT.values(), ids=PERMANENT.keys())
def test_deterministic_faults_end_the_run_on_a_repeat(err: Exception) -> None:
    assert not is_transient(err)


class FailingCore:
    def __init__(self, err: BaseException) -> None:
        self.err = err

    async def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        raise self.err


REF = SecretRef("key", "platform", "apiKey")


@pytest.mark.parametrize(
    "err",
    [
        ApiException(status=503, reason="Service Unavailable"),
        ApiException(status=429, reason="Too Many Requests"),
        ApiException(status=500, reason="Internal Server Error"),
        aiohttp.ClientConnectionError("connection refused"),
        TimeoutError(),
    ],
    ids=["503", "429", "500", "connection-refused", "timeout"],
)
async def test_an_api_server_that_cannot_be_asked_now_is_transient(err: BaseException) -> None:
    secrets = KubeSecrets(None)
    secrets.core = FailingCore(err)  # type: ignore[assignment]
    with pytest.raises(SecretUnavailable, match="Secret platform/key"):
        await secrets.api_key(REF)


async def test_a_secret_that_is_forbidden_is_a_model_error() -> None:
    secrets = KubeSecrets(None)
    secrets.core = FailingCore(ApiException(status=403, reason="no"))  # type: ignore[assignment]
    with pytest.raises(ModelError, match="HTTP 403"):
        await secrets.api_key(REF)


class ReplacedCore:
    """A Secret that is there (``data``), or not (``None``: HTTP 404)."""

    def __init__(self) -> None:
        self.data: dict[str, str] | None = {"apiKey": base64.b64encode(b"sk-1").decode()}

    async def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        if self.data is None:
            raise ApiException(status=404, reason="Not Found")
        return types.SimpleNamespace(data=self.data)


async def test_a_missing_secret_makes_the_turn_wait_its_grace_then_is_a_model_error() -> None:
    now = [0.0]
    secrets = KubeSecrets(None, ttl=60.0, clock=lambda: now[0])
    core = ReplacedCore()
    secrets.core = core  # type: ignore[assignment]
    assert await secrets.api_key(REF) == "sk-1"
    core.data, now[0] = None, 61.0  # replaced: deleted when the cached key expires
    with pytest.raises(SecretUnavailable, match="HTTP 404 Not Found; waiting up to 30 s"):
        await secrets.api_key(REF)
    now[0] = 61.0 + MISSING_GRACE - 0.1
    with pytest.raises(SecretUnavailable):
        await secrets.api_key(REF)
    now[0] = 61.0 + MISSING_GRACE
    with pytest.raises(ModelError, match="HTTP 404"):
        await secrets.api_key(REF)
    core.data = {"apiKey": base64.b64encode(b"sk-2").decode()}  # made again
    assert await secrets.api_key(REF) == "sk-2"
    core.data, now[0] = None, 200.0  # a later replace has its own grace
    with pytest.raises(SecretUnavailable):
        await secrets.api_key(REF)


class HeaderCore:
    """A tool server's header Secret that is there (``data``), missing (``None``: HTTP 404),
    whose read fails with ``err``, or never answers (``hang``); ``reads`` counts the reads."""

    def __init__(self) -> None:
        self.data: dict[str, str] | None = {
            "Authorization": base64.b64encode(b"Bearer t1").decode()
        }
        self.err: BaseException | None = None
        self.hang = False
        self.reads = 0

    async def read_namespaced_secret(self, name: str, namespace: str) -> Any:
        self.reads += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.err is not None:
            raise self.err
        if self.data is None:
            raise ApiException(status=404, reason="Not Found")
        return types.SimpleNamespace(data=self.data)


KEYS = ("Authorization",)
T1 = {"Authorization": "Bearer t1"}


def header_secrets(now: list[float]) -> tuple[KubeSecrets, HeaderCore]:
    secrets = KubeSecrets(None, ttl=60.0, clock=lambda: now[0])
    core = HeaderCore()
    secrets.core = core  # type: ignore[assignment]
    return secrets, core


@pytest.mark.parametrize(
    "fault",
    [
        ApiException(status=503, reason="Service Unavailable"),
        aiohttp.ClientConnectionError("connection refused"),
        "hang",
    ],
    ids=["503", "connection-refused", "no-answer"],
)
async def test_a_tool_servers_headers_read_once_are_used_while_the_api_server_cannot_be_asked(
    fault: BaseException | str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Measured before: the tool call failed ``transport`` (a 503), the tool crashed (no
    connection: not a ``ToolError``), or it waited out the call's own deadline (no answer)."""
    monkeypatch.setattr(secrets_module, "HEADERS_READ_TIMEOUT", 0.1)
    now = [0.0]
    secrets, core = header_secrets(now)
    unread = KubeSecrets(None)
    unread.core = core  # type: ignore[assignment]
    assert await secrets.headers("team-a", "mcp", keys=KEYS) == T1
    core.hang, core.err, now[0] = fault == "hang", None if fault == "hang" else fault, 61.0
    assert await secrets.headers("team-a", "mcp", keys=KEYS) == T1
    reads = core.reads
    now[0] += STALE_RETRY - 0.1  # not asked again meanwhile
    assert await secrets.headers("team-a", "mcp", keys=KEYS) == T1
    assert core.reads == reads
    with pytest.raises(ToolError, match="cannot read Secret team-a/mcp") as failed:  # never read
        await unread.headers("team-a", "mcp", keys=KEYS)
    assert failed.value.unsent  # a write call is not taken as maybe done (effect_unknown)
    core.hang, core.err = False, ApiException(status=403, reason="Forbidden")  # refused
    now[0] += 0.1
    with pytest.raises(ToolError, match="HTTP 403"):
        await secrets.headers("team-a", "mcp", keys=KEYS)


async def test_a_replaced_header_secret_is_used_for_its_grace_then_fails_the_call() -> None:
    now = [0.0]
    secrets, core = header_secrets(now)
    await secrets.headers("team-a", "mcp", keys=KEYS)
    core.data, now[0] = None, 61.0  # replaced: deleted when the cached headers expire
    assert await secrets.headers("team-a", "mcp", keys=KEYS) == T1
    now[0] = 61.0 + MISSING_GRACE - 0.1
    assert await secrets.headers("team-a", "mcp", keys=KEYS) == T1
    now[0] = 61.0 + MISSING_GRACE + STALE_RETRY
    with pytest.raises(ToolError, match="HTTP 404"):
        await secrets.headers("team-a", "mcp", keys=KEYS)
    core.data, core.err = None, ApiException(status=503, reason="Service Unavailable")
    with pytest.raises(ToolError, match="HTTP 503"):  # gone past its grace: never served again
        await secrets.headers("team-a", "mcp", keys=KEYS)
    core.data = {"Authorization": base64.b64encode(b"Bearer t2").decode()}  # made again
    core.err = None
    assert await secrets.headers("team-a", "mcp", keys=KEYS) == {"Authorization": "Bearer t2"}
    core.data, now[0] = None, 200.0  # a later replace has its own grace
    assert await secrets.headers("team-a", "mcp", keys=KEYS) == {"Authorization": "Bearer t2"}
