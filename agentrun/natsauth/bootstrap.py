"""An installation's NATS keys and credentials kept in Kubernetes Secrets, and the JetStream
store of an open bus adopted by the closed one.

``agentrun nats bootstrap`` (the chart's pre-install and pre-upgrade hook) makes, in one
namespace, the Secrets the chart mounts (names from a prefix, e.g. ``agentrun-nats``):

- ``<prefix>-keys``: the authority (``Authority.files``): every seed. Mounted nowhere; only this
  command reads it. Made once, never overwritten.
- ``<prefix>-operator``: ``nats.creds`` of the operator's user, and ``reader-signer.nk`` and
  ``account.pub``, with which the operator can mint per-namespace readers at run time (and
  nothing else: the key is scoped). Made once, never overwritten.
- ``<prefix>-worker``: ``nats.creds`` of the workers' user. Made once, never overwritten.
- ``<prefix>-server``: ``auth.conf`` (the server's part of the trust chain) and
  ``account.pub`` (the ``AGENTRUN`` account, the name JetStream keeps its data under). Derived
  from the keys and this release's permissions: written again when that changes (an upgrade
  that changes a permission), so existing credentials keep working.

Running it again changes nothing (idempotent). ``agentrun nats rotate ROLE`` mints a new user
for the operator or the workers, replaces its Secret, and revokes the user it replaces in
``<prefix>-server`` (the NATS server applies a revocation when it reloads its configuration).

``adopt_store`` (``agentrun nats adopt-store``, an init container of the chart's NATS pod)
moves the JetStream data an open server kept for its global account ``$G`` under the
``AGENTRUN`` account, once: the upgrade of a running install from the open bus to the closed
one keeps every stream, consumer and bucket, so every run.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from agentrun.natsauth import creds
from agentrun.natsauth.authority import Authority, signer_file
from agentrun.natsauth.permissions import Role

log = logging.getLogger(__name__)

CREDS_KEY = "nats.creds"
ACCOUNT_KEY = "account.pub"
SERVER_CONFIG_KEY = "auth.conf"
GLOBAL_ACCOUNT = "$G"
"""The account an open nats-server keeps every stream under."""


@dataclasses.dataclass(frozen=True, slots=True)
class SecretNames:
    """The Secrets of one installation, from their common prefix."""

    prefix: str

    @property
    def keys(self) -> str:
        return f"{self.prefix}-keys"

    @property
    def server(self) -> str:
        return f"{self.prefix}-server"

    def role(self, role: Role) -> str:
        """``<prefix>-operator`` or ``<prefix>-worker``."""
        return f"{self.prefix}-{role.value}"


class BootstrapError(RuntimeError):
    """The Secrets are in a state the command will not guess its way out of; the message says
    which and what to do."""


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """What a bootstrap did: the Secrets it created and updated (the others it left)."""

    created: tuple[str, ...]
    updated: tuple[str, ...]


class SecretStore:
    """Opaque Secrets of one namespace through the Kubernetes API."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace

    async def read(self, name: str) -> dict[str, str] | None:
        """The Secret's keys and decoded values, or None when it does not exist."""
        try:
            secret = await self.core.read_namespaced_secret(name, self.namespace)
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    async def write(self, name: str, data: Mapping[str, str], *, replace: bool) -> None:
        """Create the Secret (labelled as agentrun's); with ``replace``, overwrite it."""
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(
                name=name,
                namespace=self.namespace,
                labels={"app.kubernetes.io/part-of": "agentrun"},
            ),
            type="Opaque",
            string_data=dict(data),
        )
        if replace:
            await self.core.replace_namespaced_secret(name, self.namespace, body)
        else:
            await self.core.create_namespaced_secret(self.namespace, body)


async def bootstrap(store: SecretStore, names: SecretNames) -> Outcome:
    """Make what is missing of the installation's Secrets (see the module docstring); write
    ``<prefix>-server`` again when its content would change.

    Raises ``BootstrapError`` when user credentials exist but the keys that signed them do not
    (they could not be revoked or matched), ``ApiException`` for API failures.
    """
    created: list[str] = []
    keys = await store.read(names.keys)
    if keys is None:
        orphans = [
            n
            for n in (names.role(Role.OPERATOR), names.role(Role.WORKER))
            if await store.read(n) is not None
        ]
        if orphans:
            raise BootstrapError(
                f"Secrets {', '.join(orphans)} exist but {names.keys} does not: delete them to "
                "make new credentials, or restore the keys Secret"
            )
        authority = Authority.generate()
        await store.write(names.keys, authority.files(), replace=False)
        created.append(names.keys)
    else:
        authority = Authority.load(keys)
    for role in (Role.OPERATOR, Role.WORKER):
        name = names.role(role)
        if await store.read(name) is None:
            await store.write(name, role_secret(authority, role), replace=False)
            created.append(name)
    updated = await _write_server(store, names, authority, created)
    return Outcome(tuple(created), updated)


async def rotate(store: SecretStore, names: SecretNames, role: Role) -> str:
    """Replace ``role``'s user with a new one and revoke the old one; returns the new user's
    public key. Raises ``BootstrapError`` when the installation has no keys yet."""
    keys = await store.read(names.keys)
    if keys is None:
        raise BootstrapError(f"no {names.keys}: run `agentrun nats bootstrap` first")
    authority = Authority.load(keys)
    current = await store.read(names.role(role))
    fresh = role_secret(authority, role)
    await store.write(names.role(role), fresh, replace=current is not None)
    if current is not None and CREDS_KEY in current:
        authority = authority.revoke(creds.parse(current[CREDS_KEY]).public)
        await store.write(names.keys, authority.files(), replace=True)
    await _write_server(store, names, authority, [])
    return creds.parse(fresh[CREDS_KEY]).public


def role_secret(authority: Authority, role: Role) -> dict[str, str]:
    """The Secret data of ``role``'s user: its ``nats.creds`` (and, for the operator, the
    readers' signing key and the account's public key, to mint readers)."""
    user = authority.mint(role, name=f"agentrun-{role.value}")
    data = {CREDS_KEY: user.text()}
    if role is Role.OPERATOR:
        data[signer_file(Role.READER)] = authority.signers[Role.READER].seed
        data[ACCOUNT_KEY] = authority.account.public
    return data


def server_secret(authority: Authority) -> dict[str, str]:
    """The NATS server's Secret data: ``auth.conf`` and ``account.pub``."""
    return {SERVER_CONFIG_KEY: authority.server_config(), ACCOUNT_KEY: authority.account.public}


async def _write_server(
    store: SecretStore, names: SecretNames, authority: Authority, created: list[str]
) -> tuple[str, ...]:
    current = await store.read(names.server)
    wanted = server_secret(authority)
    if current is None:
        await store.write(names.server, wanted, replace=False)
        created.append(names.server)
        return ()
    if current == wanted:
        return ()
    await store.write(names.server, wanted, replace=True)
    return (names.server,)


def adopt_store(store_dir: Path, account: str) -> bool:
    """Move an open server's JetStream data (``<store_dir>/$G``) to ``account``'s directory,
    unless that exists already; True when it moved. ``store_dir`` is JetStream's own
    directory (``<store_dir of nats.conf>/jetstream``). Raises ``OSError``."""
    source, target = store_dir / GLOBAL_ACCOUNT, store_dir / account
    if not source.is_dir() or target.exists():
        return False
    source.rename(target)
    log.info("moved the open bus's JetStream data %s to %s", source, target)
    return True
