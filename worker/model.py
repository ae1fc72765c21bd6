"""The model adapter: one chat-completions call through the real ``openai`` client, with retries.

What belongs here: building the request, transient-error retries inside the run's deadline, and
returning the raw JSON object for the kernel to classify. What does not: classification
(``agentrun.kernel.decision``) or budgets (the caller passes ``max_output_tokens``).

Retry policy: 429, 408, 409 and 5xx answers, timeouts and connection errors are transient
(OpenAI's own client retries the same set); ``Retry-After``/``retry-after-ms`` is honoured when
present, else exponential backoff with full jitter (AWS architecture blog, "Exponential Backoff
And Jitter"). Nothing is retried past the run's deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import openai

CHAT_COMPLETIONS = "/chat/completions"
"""Path under the base URL (OpenAI API reference: Create chat completion)."""
TRANSIENT_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class ModelError(Exception):
    """The model could not give a response (permanent error, or retries exhausted)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounds on retrying transient model errors."""

    attempts: int = 5
    """Total attempts, the first included."""
    base_delay: float = 0.25
    """Seconds; the backoff ceiling doubles per attempt from here."""
    max_delay: float = 20.0
    """Seconds; cap of one wait, ``Retry-After`` included."""
    request_timeout: float = 120.0
    """Seconds one HTTP request may take."""


def _retry_after(err: openai.APIStatusError) -> float | None:
    headers = err.response.headers
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) / divisor
            except ValueError:
                return None
    return None


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
                max_retries=0,  # retries are ours: bounded by the run's deadline
                timeout=self.policy.request_timeout,
            )
            self._clients[key] = client
        return client

    async def close(self) -> None:
        """Close every HTTP client."""
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def complete(
        self,
        *,
        base_url: str,
        api_key: str,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_output_tokens: int,
        deadline: float,
    ) -> tuple[dict[str, Any], int]:
        """One chat completion as its raw JSON object, and the number of attempts it took.

        ``deadline`` is epoch seconds. Raises ``ModelError`` for a permanent error (4xx other
        than the transient ones, a body that is not JSON) or when retries or time run out;
        ``asyncio.TimeoutError`` never escapes.
        """
        client = self._client(base_url, api_key)
        kwargs: dict[str, Any] = {
            "model": model,
            "messages": list(messages),
            "max_tokens": max_output_tokens,
        }
        if tools:
            kwargs["tools"] = list(tools)
        last = "no attempt made"
        for attempt in range(1, self.policy.attempts + 1):
            left = deadline - time.time()
            if left <= 0:
                raise ModelError(f"the run's deadline passed while calling the model ({last})")
            delay: float | None = None
            try:
                async with asyncio.timeout(left):
                    # ``post`` rather than ``chat.completions.create``: the body is already in
                    # wire shape, and the SDK's typed transform of ``messages`` costs ~0.2 ms
                    # per message per call (17 ms at 80 messages) — it dominated a turn.
                    body = await client.post(CHAT_COMPLETIONS, body=kwargs, cast_to=object)
                if not isinstance(body, dict):
                    raise ModelError("the model endpoint answered with JSON that is not an object")
                return body, attempt
            except openai.APIStatusError as err:
                last = f"HTTP {err.status_code}: {err.message}"
                if err.status_code not in TRANSIENT_STATUS:
                    raise ModelError(last) from err
                delay = _retry_after(err)
            except (openai.APITimeoutError, openai.APIConnectionError) as err:
                last = f"{type(err).__name__}: {err}"
            except TimeoutError as err:
                raise ModelError(
                    f"the run's deadline passed while calling the model ({last})"
                ) from err
            except json.JSONDecodeError as err:
                raise ModelError(
                    f"the model endpoint answered with a body that is not JSON: {err}"
                ) from err
            if attempt == self.policy.attempts:
                break
            backoff = random.uniform(
                0, min(self.policy.max_delay, self.policy.base_delay * 2**attempt)
            )
            wait = min(self.policy.max_delay, delay if delay is not None else backoff)
            if time.time() + wait >= deadline:
                raise ModelError(f"no time left in the run's deadline to retry ({last})")
            await asyncio.sleep(wait)
        raise ModelError(f"the model failed {self.policy.attempts} times; last error: {last}")
