"""Secrets the worker reads: model API keys (``AgentModel.spec.credentials.secretRef``) and
the HTTP headers of MCP tool servers (``AgentToolServer.spec.headersFrom``)."""

from __future__ import annotations

import base64
import time

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


class KubeSecrets:
    """Reads and caches keys for ``ttl`` seconds, so rotation takes effect within a minute."""

    def __init__(self, api: client.ApiClient | None, *, ttl: float = 60.0) -> None:
        self.core = client.CoreV1Api(api) if api is not None else None
        self.ttl = ttl
        self._cache: dict[SecretRef, tuple[float, str]] = {}
        self._headers: dict[tuple[str, str, tuple[str, ...]], tuple[float, dict[str, str]]] = {}

    async def api_key(self, ref: SecretRef) -> str:
        """The key's value; raises ``ModelError`` naming the Secret when it cannot be read,
        ``SecretUnavailable`` when the API server cannot be asked right now."""
        hit = self._cache.get(ref)
        now = time.monotonic()
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
        return value

    async def headers(self, namespace: str, name: str, *, keys: tuple[str, ...]) -> dict[str, str]:
        """The ``keys`` of Secret ``namespace/name``, each as the HTTP header of its name
        (``AgentToolServer.spec.headersFrom.keys``; no other key of the Secret is read out),
        cached like API keys.

        Raises ``ToolError`` (an infrastructure fault) naming the Secret and a missing key,
        never a value, when they cannot be read.
        """
        hit = self._headers.get((namespace, name, keys))
        now = time.monotonic()
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        where = f"cannot read Secret {namespace}/{name} (AgentToolServer spec.headersFrom)"
        fault = kernel.ToolFault.TRANSPORT
        if self.core is None:
            raise ToolError(f"{where}: the worker has no Kubernetes access", fault=fault)
        try:
            values = await kube.secret_values(self.core, namespace=namespace, name=name, keys=keys)
        except ApiException as err:
            raise ToolError(f"{where}: HTTP {err.status} {err.reason}", fault=fault) from None
        except ValueError as err:
            raise ToolError(f"{where}: {err}", fault=fault) from None
        for value in values.values():
            display.KNOWN.add(value)
        self._headers[(namespace, name, keys)] = (now, values)
        return values
