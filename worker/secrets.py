"""Secrets the worker reads: model API keys (``AgentModel.spec.credentials.secretRef``) and
the HTTP headers of MCP tool servers (``AgentToolServer.spec.headersFrom``)."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun import display, kernel, kube
from agentrun.metrics import ModelErrorType
from agentrun.protocol import SecretRef
from agentrun.tools import ToolError

from .model import ModelError

TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
"""API server answers that say "try again" (overload, restart, timeouts)."""


class SecretUnavailable(Exception):
    """The API server could not be asked right now (unreachable, restarting, overloaded): the
    turn waits and is retried, the run does not end."""


MISSING_GRACE = 30.0
"""Seconds a model-key Secret may be missing (HTTP 404) before the turn fails for it: a Secret
replaced — deleted and made again, as ``kubectl replace --force`` or a GitOps tool's replace
does — makes the turn wait and retry meanwhile instead of ending its run."""


HEADERS_READ_TIMEOUT = 2.0
"""Seconds a read of a tool server's header Secret may take while a tool call waits for it
(the API server answers such a read in milliseconds): past it, the last values read are sent,
or the call fails unsent, well within the call's own timeout."""
STALE_RETRY = 5.0
"""Seconds a tool server's header Secret that could not be read is not asked again (its last
values sent meanwhile): an API server away is not asked once per tool call."""


class KubeSecrets:
    """Reads and caches keys for ``ttl`` seconds, so rotation takes effect within a minute.
    ``clock``: monotonic seconds (tests pass their own)."""

    def __init__(
        self,
        api: client.ApiClient | None,
        *,
        ttl: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = client.CoreV1Api(api) if api is not None else None
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[SecretRef, tuple[float, str]] = {}
        self._missing: dict[SecretRef, float] = {}
        """When each key's Secret was first found missing since it was last read."""
        self._headers: dict[tuple[str, str, tuple[str, ...]], tuple[float, dict[str, str]]] = {}
        self._headers_missing: dict[tuple[str, str, tuple[str, ...]], float] = {}
        """When each header Secret was first found missing since it was last read."""

    async def api_key(self, ref: SecretRef) -> str:
        """The key's value; raises ``ModelError`` naming the Secret when it cannot be read,
        ``SecretUnavailable`` when the API server cannot be asked right now or the Secret has
        been missing for less than ``MISSING_GRACE`` seconds."""
        hit = self._cache.get(ref)
        now = self.clock()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        where = f"Secret {ref.namespace}/{ref.name} key {ref.key!r}"
        if self.core is None:
            raise ModelError(
                f"cannot read {where}: the worker has no Kubernetes access",
                error_type=ModelErrorType.CREDENTIALS,
            )
        try:
            secret = await self.core.read_namespaced_secret(ref.name, ref.namespace)
        except ApiException as err:
            if err.status in TRANSIENT_STATUSES:
                raise SecretUnavailable(f"{where}: HTTP {err.status} {err.reason}") from err
            if err.status == 404 and now - self._missing.setdefault(ref, now) < MISSING_GRACE:
                raise SecretUnavailable(
                    f"{where}: HTTP 404 {err.reason}; waiting up to {MISSING_GRACE:g} s for it "
                    "to be made again"
                ) from err
            raise ModelError(
                f"cannot read {where}: HTTP {err.status} {err.reason}",
                error_type=ModelErrorType.CREDENTIALS,
            ) from err
        except (aiohttp.ClientError, TimeoutError) as err:
            raise SecretUnavailable(f"{where}: {err!r}") from err
        data = (secret.data or {}).get(ref.key)
        if data is None:
            raise ModelError(
                f"{where} does not exist in the Secret", error_type=ModelErrorType.CREDENTIALS
            )
        value = base64.b64decode(data).decode().strip()
        display.KNOWN.add(value)
        self._cache[ref] = (now, value)
        self._missing.pop(ref, None)
        return value

    async def headers(self, namespace: str, name: str, *, keys: tuple[str, ...]) -> dict[str, str]:
        """The ``keys`` of Secret ``namespace/name``, each as the HTTP header of its name
        (``AgentToolServer.spec.headersFrom.keys``; no other key of the Secret is read out),
        cached like API keys. Once read, they keep being sent past ``ttl`` while the API server
        cannot be asked (``TRANSIENT_STATUSES``, no connection, no answer within
        ``HEADERS_READ_TIMEOUT``; asked again ``STALE_RETRY`` seconds later) and while the
        Secret is missing (HTTP 404) for less than ``MISSING_GRACE`` seconds (replaced: deleted
        and made again), as the model's key makes its turn wait meanwhile: a tool call is not
        failed for either. A Secret missing past its grace, or refused otherwise (403), is
        never served from what was read before.

        Raises ``ToolError`` (an infrastructure fault, ``unsent``: the tool's server was not
        called) naming the Secret and a missing key, never a value, when they cannot be read
        and may not be served from before.
        """
        place = (namespace, name, keys)
        hit = self._headers.get(place)
        now = self.clock()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        where = f"cannot read Secret {namespace}/{name} (AgentToolServer spec.headersFrom)"
        if self.core is None:
            raise _header_fault(f"{where}: the worker has no Kubernetes access")
        try:
            async with asyncio.timeout(HEADERS_READ_TIMEOUT):
                values = await kube.secret_values(
                    self.core, namespace=namespace, name=name, keys=keys
                )
        except (ApiException, aiohttp.ClientError, TimeoutError) as err:
            status = err.status if isinstance(err, ApiException) else None
            if status == 404:
                self._headers_missing.setdefault(place, now)
            gone = now - self._headers_missing.get(place, now) >= MISSING_GRACE
            if hit is not None and not gone and status in (None, 404, *TRANSIENT_STATUSES):
                self._headers[place] = (now - self.ttl + STALE_RETRY, hit[1])
                return hit[1]
            why = f"HTTP {err.status} {err.reason}" if isinstance(err, ApiException) else repr(err)
            raise _header_fault(f"{where}: {why}") from None
        except ValueError as err:
            raise _header_fault(f"{where}: {err}") from None
        for value in values.values():
            display.KNOWN.add(value)
        self._headers[place] = (now, values)
        self._headers_missing.pop(place, None)
        return values


def _header_fault(message: str) -> ToolError:
    """A tool call failed for its server's headers: an infrastructure fault, never sent."""
    return ToolError(message, fault=kernel.ToolFault.TRANSPORT, unsent=True)
