"""A transient fault makes a turn wait (redelivered however long it lasts), never end its run:
which errors count as transient, and the API server's "try again" answers reading a model's
Secret among them."""

from __future__ import annotations

from typing import Any

import aiohttp
import nats.errors
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.bus import EventTooLarge
from agentrun.ledger import LedgerCorrupt, LedgerUnavailable
from agentrun.protocol import SecretRef
from agentrun.worker.consumer import is_transient
from agentrun.worker.model import ModelError
from agentrun.worker.secrets import KubeSecrets, SecretUnavailable

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


@pytest.mark.parametrize("status", [403, 404])
async def test_a_secret_that_is_missing_or_forbidden_is_a_model_error(status: int) -> None:
    secrets = KubeSecrets(None)
    secrets.core = FailingCore(ApiException(status=status, reason="no"))  # type: ignore[assignment]
    with pytest.raises(ModelError, match=f"HTTP {status}"):
        await secrets.api_key(REF)
