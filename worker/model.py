"""The model adapter: one chat-completions call through the real ``openai`` client.

What belongs here: building the request, bounding it by the run's deadline, and returning the
raw JSON object for the kernel to classify. What does not: classification
(``agentrun.kernel.decision``) or budgets (the caller passes ``max_output_tokens``).

Retries are the ``openai`` client's own (``max_retries``): it retries 408, 409, 429 and 5xx
answers, timeouts and connection errors, honours ``Retry-After`` / ``retry-after-ms`` (up to
two minutes), and otherwise backs off exponentially with jitter; other 4xx answers are not
retried. The whole call, retries and their waits included, is cut at the run's deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import openai

CHAT_COMPLETIONS = "/chat/completions"
"""Path under the base URL (OpenAI API reference: Create chat completion)."""


class ModelError(Exception):
    """The model could not give a response (permanent error, retries exhausted, or the run's
    deadline passed)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChatRequest:
    """One chat-completions request, in wire shape."""

    base_url: str
    """The OpenAI-compatible endpoint (``AgentModel.spec.baseURL``)."""
    api_key: str
    """``""`` when the endpoint needs none."""
    model: str
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[Mapping[str, Any]]
    """The OpenAI ``tools`` list (empty: none sent)."""
    max_output_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The ``openai`` client's retry and timeout options."""

    max_retries: int = 4
    """Retries of a transient error after the first attempt."""
    request_timeout: float = 120.0
    """Seconds one HTTP attempt may take."""


class ModelClient:
    """Calls OpenAI-compatible endpoints; one ``AsyncOpenAI`` per (base URL, key), reused."""

    def __init__(self, policy: RetryPolicy | None = None) -> None:
        self.policy = policy or RetryPolicy()
        self._clients: dict[tuple[str, str], openai.AsyncOpenAI] = {}

    def _client(self, base_url: str, api_key: str) -> openai.AsyncOpenAI:
        key = (base_url, api_key)
        client = self._clients.get(key)
        if client is None:
            client = openai.AsyncOpenAI(
                base_url=base_url,
                api_key=api_key or "unused",
                max_retries=self.policy.max_retries,
                timeout=self.policy.request_timeout,
            )
            self._clients[key] = client
        return client

    async def close(self) -> None:
        """Close every HTTP client."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def complete(self, request: ChatRequest, *, deadline: float) -> dict[str, Any]:
        """One chat completion as its raw JSON object.

        ``deadline`` is epoch seconds. Raises ``ModelError`` for a permanent error (a 4xx the
        client does not retry, a body that is not a JSON object), when retries run out, or when
        the deadline passes first; ``asyncio.TimeoutError`` never escapes.
        """
        client = self._client(request.base_url, request.api_key)
        body: dict[str, Any] = {
            "model": request.model,
            "messages": list(request.messages),
            "max_tokens": request.max_output_tokens,
        }
        if request.tools:
            body["tools"] = list(request.tools)
        left = deadline - time.time()
        if left <= 0:
            raise ModelError("the run's deadline passed before the model call")
        try:
            async with asyncio.timeout(left):
                # ``post`` rather than ``chat.completions.create``: the body is already in
                # wire shape, and the SDK's typed transform of ``messages`` costs ~0.2 ms
                # per message per call (17 ms at 80 messages) — it dominated a turn.
                answer = await client.post(CHAT_COMPLETIONS, body=body, cast_to=object)
        except openai.APIStatusError as err:
            raise ModelError(f"HTTP {err.status_code}: {err.message}") from err
        except (openai.APITimeoutError, openai.APIConnectionError) as err:
            raise ModelError(f"{type(err).__name__}: {err}") from err
        except TimeoutError as err:
            raise ModelError("the run's deadline passed while calling the model") from err
        except json.JSONDecodeError as err:
            raise ModelError(
                f"the model endpoint answered with a body that is not JSON: {err}"
            ) from err
        if not isinstance(answer, dict):
            raise ModelError("the model endpoint answered with JSON that is not an object")
        return answer
