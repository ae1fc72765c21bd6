"""The run-signing keys kept in Kubernetes Secrets, made and rotated by ``agentrun signing
bootstrap|rotate|retire`` (the chart's install hook runs ``bootstrap``):

- ``<prefix>-signing``: ``signing.json``, the operator's private keys. Mounted in the operator
  alone (``AGENTRUN_RUN_SIGNING_FILE``). Made once, never overwritten but by ``rotate`` and
  ``retire``.
- ``<prefix>-trust``: ``trust.json``, the public keys. Mounted in the operator and every
  worker (``AGENTRUN_RUN_TRUST_FILE``). Holds at least every key of the signing file.

Rotation writes the trust file first, with the new key, and has the operator sign with it only
``activate_after`` seconds later (``keys.ACTIVATION_DELAY``: the kubelet updates a mounted Secret
within about a minute), so no worker meets a seal it cannot check; every older key stays
trusted, so runs already admitted keep their seals. ``retire`` removes a key once it stopped
signing and no run still going was admitted before its successor signed.

What belongs here: those Secrets and the admission times ``retire`` checks. What does not:
the keys themselves (``keys``), reading the mounted files (``files``).
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any

from kubernetes_asyncio import client

from agentrun import kube
from agentrun.natsauth.bootstrap import SecretStore
from agentrun.trust import keys
from agentrun.trust.keys import SigningKey, SigningKeys, TrustedKeys

GOING_PHASES = frozenset({"Running", "AwaitingApproval"})
"""AgentRun phases of a run admitted (sealed) and not ended."""


class KeysMissing(RuntimeError):
    """The signing Secret does not exist: ``agentrun signing bootstrap`` first."""


class RetireRefused(RuntimeError):
    """The key may not be retired now; the message says why (``keys.retirable``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SecretNames:
    """The two Secrets, from their common prefix (the chart's full name)."""

    prefix: str

    @property
    def signing(self) -> str:
        return f"{self.prefix}-signing"

    @property
    def trust(self) -> str:
        return f"{self.prefix}-trust"


async def bootstrap(store: SecretStore, names: SecretNames, *, now: float) -> list[str]:
    """Make what is missing: a first key (signing at once) when there is no signing Secret,
    and a trust Secret holding every signing key (keys it held before are kept). Idempotent;
    returns the Secrets it created or updated. Raises ``ApiException``, ``KeyFileError``."""
    changed: list[str] = []
    found = await store.read(names.signing)
    if found is None:
        signing, _ = keys.generate(now=now)
        await store.write(names.signing, {keys.SIGNING_FILE: signing.text()}, replace=False)
        changed.append(names.signing)
    else:
        signing = SigningKeys.parse(found.get(keys.SIGNING_FILE, ""))
    if await _write_trust(store, names, TrustedKeys.of(signing)):
        changed.append(names.trust)
    return changed


async def rotate(
    store: SecretStore,
    names: SecretNames,
    *,
    now: float,
    activate_after: float = keys.ACTIVATION_DELAY,
) -> SigningKey:
    """A new key: trusted at once, signing ``activate_after`` seconds from ``now``; returns
    it. Raises ``KeysMissing`` without a signing Secret."""
    signing = await _signing(store, names)
    trusted = await _trusted(store, names)
    signing, trusted, fresh = keys.rotate(signing, trusted, now=now, activate_after=activate_after)
    await _write_trust(store, names, trusted)  # first: trusted before it signs
    await store.write(names.signing, {keys.SIGNING_FILE: signing.text()}, replace=True)
    return fresh


async def retire(
    store: SecretStore,
    names: SecretNames,
    kid: str,
    *,
    admitted: list[float],
    now: float,
) -> None:
    """Untrust key ``kid``. Raises ``RetireRefused`` when ``keys.retirable`` says no
    (``admitted``: the admission times of the runs still going), ``KeysMissing``."""
    signing = await _signing(store, names)
    trusted = await _trusted(store, names)
    why = keys.retirable(trusted, kid, admitted=admitted, now=now)
    if why:
        raise RetireRefused(why)
    signing, trusted = keys.retire(signing, trusted, kid)
    await store.write(names.signing, {keys.SIGNING_FILE: signing.text()}, replace=True)
    await store.write(names.trust, {keys.TRUST_FILE: trusted.text()}, replace=True)


async def admitted_times(api: client.ApiClient) -> list[float]:
    """The admission times (epoch seconds, ``status.startTime``) of every AgentRun of the
    cluster still going (``GOING_PHASES``). Raises ``ApiException``."""
    objects = client.CustomObjectsApi(api)
    listed: dict[str, Any] = await objects.list_cluster_custom_object(
        kube.GROUP, kube.VERSION, kube.RUNS
    )
    times: list[float] = []
    for item in listed.get("items") or []:
        status = item.get("status") or {}
        started = status.get("startTime")
        if status.get("phase") in GOING_PHASES and isinstance(started, str):
            stamp = datetime.datetime.fromisoformat(started.replace("Z", "+00:00"))
            times.append(stamp.timestamp())
    return times


async def _signing(store: SecretStore, names: SecretNames) -> SigningKeys:
    found = await store.read(names.signing)
    if found is None:
        raise KeysMissing(f"no Secret {names.signing}: run `agentrun signing bootstrap` first")
    return SigningKeys.parse(found.get(keys.SIGNING_FILE, ""))


async def _trusted(store: SecretStore, names: SecretNames) -> TrustedKeys:
    found = await store.read(names.trust)
    return TrustedKeys({}) if found is None else TrustedKeys.parse(found.get(keys.TRUST_FILE, ""))


async def _write_trust(store: SecretStore, names: SecretNames, wanted: TrustedKeys) -> bool:
    """Make the trust Secret hold ``wanted``'s keys besides its own; True if it changed."""
    found = await store.read(names.trust)
    current = (
        TrustedKeys({}) if found is None else TrustedKeys.parse(found.get(keys.TRUST_FILE, ""))
    )
    merged = TrustedKeys({**current.keys, **wanted.keys})
    if found is not None and merged == current:
        return False
    await store.write(names.trust, {keys.TRUST_FILE: merged.text()}, replace=found is not None)
    return True
