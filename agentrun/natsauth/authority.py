"""An installation's NATS trust chain: its keys, the server's auth configuration, its users.

NATS decentralised auth ("operator mode", NATS docs "JWT"): an operator key signs account
JWTs, which nats-server loads from its configuration (``resolver: MEMORY`` with
``resolver_preload``; no account server, so no client can change them); an account key — or
one of the account's signing keys — signs user JWTs, which clients present with a signature
of the server's nonce made by their own NKey. Nothing else is trusted: no anonymous user, no
password. agentrun's layout:

- one operator, one account ``AGENTRUN`` holding every stream and bucket, and a system
  account for the server's own use, with no user at all (its seed is never kept);
- one *scoped* signing key of ``AGENTRUN`` per role (``permissions.Role``): a user it signs
  carries no permissions of its own and gets the role's template, so a key that leaks mints
  only users of its role — the operator process holds only the readers' key;
- every user carries the tag ``role:<role>`` (and a reader ``namespace:<ns>``), which picks
  the inbox subtree its permissions allow;
- ``revocations``: users refused from a given time on (the account JWT's revocation list);
  changing it changes the server configuration (a reload applies it and closes the revoked
  users' connections).

The permissions live in the account JWT (the signing keys' templates), not in the users' JWTs:
a release that changes them re-derives the server configuration and every existing
credential keeps working.

What belongs here: generating, storing (as a mapping of file names to text) and loading the
keys, deriving the server configuration, minting users. Where the files go (a directory, a
Kubernetes Secret) is the caller's.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Mapping
from typing import Any

from agentrun.natsauth import jwt, permissions
from agentrun.natsauth.creds import Creds
from agentrun.natsauth.jwt import KeyKind, NKey
from agentrun.natsauth.permissions import NAMESPACE_TAG, ROLE_TAG, Role

OPERATOR_NAME = "agentrun"
ACCOUNT_NAME = "AGENTRUN"
SYSTEM_NAME = "SYS"

OPERATOR_SEED = "operator.nk"
ACCOUNT_SEED = "account.nk"
SYSTEM_PUBLIC = "system.pub"
ISSUED = "issued"
CREATED = "created"
REVOCATIONS = "revocations.json"


def signer_file(role: Role) -> str:
    """The file name of ``role``'s signing key seed, ``<role>-signer.nk``."""
    return f"{role.value}-signer.nk"


@dataclasses.dataclass(frozen=True, slots=True)
class Authority:
    """The keys of one installation. Create with ``generate`` or ``load``."""

    operator: NKey
    account: NKey
    system: str
    """The system account's public key (its seed is never kept: it has no users)."""
    signers: Mapping[Role, NKey]
    """One scoped signing key of the account per role."""
    created: int
    """UNIX second the operator's and the system account's JWTs are stamped with: fixed, since
    nats-server reloads no change of its trusted operator."""
    issued: int
    """UNIX second the ``AGENTRUN`` account's JWT is stamped with; moved on by ``revoke``."""
    revocations: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """User public key (or ``*``) → UNIX second: that user's JWTs issued up to it are refused."""

    @classmethod
    def generate(cls, *, now: float | None = None) -> Authority:
        """Fresh keys for a new installation."""
        return cls(
            operator=NKey.generate(KeyKind.OPERATOR),
            account=NKey.generate(KeyKind.ACCOUNT),
            system=NKey.generate(KeyKind.ACCOUNT).public,
            signers={role: NKey.generate(KeyKind.ACCOUNT) for role in Role},
            created=int(time.time() if now is None else now),
            issued=int(time.time() if now is None else now),
        )

    def files(self) -> dict[str, str]:
        """Everything needed to ``load`` it again, as file name → text (all of it secret)."""
        files = {
            OPERATOR_SEED: self.operator.seed,
            ACCOUNT_SEED: self.account.seed,
            SYSTEM_PUBLIC: self.system,
            CREATED: str(self.created),
            ISSUED: str(self.issued),
            REVOCATIONS: json.dumps(dict(sorted(self.revocations.items()))),
        }
        files |= {signer_file(role): key.seed for role, key in self.signers.items()}
        return files

    @classmethod
    def load(cls, files: Mapping[str, str]) -> Authority:
        """The authority ``files`` holds. Raises ``ValueError`` naming a missing or malformed
        file."""

        def need(name: str) -> str:
            value = files.get(name)
            if not value or not value.strip():
                raise ValueError(f"the NATS authority has no {name}")
            return value.strip()

        def key(name: str, kind: KeyKind) -> NKey:
            try:
                return NKey.from_seed(need(name), kind=kind)
            except ValueError as err:
                raise ValueError(f"{name}: {err}") from None

        try:
            revocations = {
                str(k): int(v) for k, v in json.loads(files.get(REVOCATIONS) or "{}").items()
            }
            issued = int(need(ISSUED))
            created = int(files.get(CREATED) or issued)
        except (ValueError, AttributeError) as err:
            raise ValueError(f"{REVOCATIONS} or {ISSUED} is malformed: {err}") from None
        return cls(
            operator=key(OPERATOR_SEED, KeyKind.OPERATOR),
            account=key(ACCOUNT_SEED, KeyKind.ACCOUNT),
            system=need(SYSTEM_PUBLIC),
            signers={role: key(signer_file(role), KeyKind.ACCOUNT) for role in Role},
            created=created,
            issued=issued,
            revocations=revocations,
        )

    # --- the server's side --------------------------------------------------------------------

    def account_jwt(self) -> str:
        """The ``AGENTRUN`` account's JWT: JetStream on, a scoped signing key per role with the
        role's permissions, the revocations."""
        keys = [
            jwt.scoped_key(
                key.public,
                role=role.value,
                template=permissions.for_role(role).template(),
                description=f"agentrun {role.value}s",
            )
            for role, key in self.signers.items()
        ]
        claims = jwt.account_claims(signing_keys=keys, revocations=self.revocations, jetstream=True)
        return jwt.encode(
            claims,
            issuer=self.operator,
            subject=self.account.public,
            name=ACCOUNT_NAME,
            issued_at=self.issued,
        )

    def system_jwt(self) -> str:
        """The system account's JWT (no JetStream, no signing keys: no user can exist)."""
        return jwt.encode(
            jwt.account_claims(),
            issuer=self.operator,
            subject=self.system,
            name=SYSTEM_NAME,
            issued_at=self.created,
        )

    def operator_jwt(self) -> str:
        """The operator's self-signed JWT naming the system account."""
        return jwt.encode(
            jwt.operator_claims(system_account=self.system),
            issuer=self.operator,
            subject=self.operator.public,
            name=OPERATOR_NAME,
            issued_at=self.created,
        )

    def server_config(self) -> str:
        """The part of ``nats.conf`` that closes the server: the operator, the system account
        and both account JWTs preloaded (``resolver: MEMORY``). Include it into the rest of
        the configuration (ports, JetStream, TLS)."""
        return (
            "# agentrun's NATS trust chain (decentralised JWT auth); generated, do not edit.\n"
            f'operator: "{self.operator_jwt()}"\n'
            f'system_account: "{self.system}"\n'
            "resolver: MEMORY\n"
            "resolver_preload: {\n"
            f'  "{self.account.public}": "{self.account_jwt()}"\n'
            f'  "{self.system}": "{self.system_jwt()}"\n'
            "}\n"
        )

    def revoke(self, public: str, *, now: float | None = None) -> Authority:
        """The authority with ``public`` (a user key, or ``*`` for every user) refused for the
        JWTs issued up to ``now``; its account JWT is stamped ``now``."""
        at = int(time.time() if now is None else now)
        return dataclasses.replace(
            self, revocations={**self.revocations, public: at}, issued=max(at, self.issued)
        )

    # --- users --------------------------------------------------------------------------------

    def mint(
        self,
        role: Role,
        *,
        name: str,
        namespace: str | None = None,
        expires: int | None = None,
        now: float | None = None,
    ) -> Creds:
        """A new user of ``role`` (a fresh key), signed by the role's scoped key; a reader
        needs ``namespace``. ``expires``: UNIX second after which the server refuses it."""
        return mint_user(
            self.signers[role],
            account=self.account.public,
            role=role,
            name=name,
            namespace=namespace,
            expires=expires,
            now=now,
        )

    def mint_unrestricted(self, *, name: str, now: float | None = None) -> Creds:
        """A user allowed everything in the account, signed by the account key itself: for
        test harnesses and break-glass repair only (the chart never makes one)."""
        user = NKey.generate(KeyKind.USER)
        nats: dict[str, Any] = {
            "pub": {"allow": [">"]},
            "sub": {"allow": [">"]},
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
            "version": jwt.VERSION,
        }
        token = jwt.encode(
            nats,
            issuer=self.account,
            subject=user.public,
            name=name,
            issued_at=int(time.time() if now is None else now),
        )
        return Creds(jwt=token, seed=user.seed)


def mint_user(
    signer: NKey,
    *,
    account: str,
    role: Role,
    name: str,
    namespace: str | None = None,
    expires: int | None = None,
    now: float | None = None,
) -> Creds:
    """A new user of ``role`` signed by ``signer`` (that role's scoped signing key of
    ``account``): what the operator needs, holding only the readers' key, to mint a reader of
    ``namespace`` at run time. Raises ``ValueError`` for a reader without a namespace."""
    if role is Role.READER and not namespace:
        raise ValueError("a reader is minted for one namespace")
    tags = [f"{ROLE_TAG}:{role.value}"]
    if namespace:
        tags.append(f"{NAMESPACE_TAG}:{namespace}")
    user = NKey.generate(KeyKind.USER)
    token = jwt.encode(
        jwt.user_claims(account=account, tags=tags),
        issuer=signer,
        subject=user.public,
        name=name,
        issued_at=int(time.time() if now is None else now),
        expires=expires,
    )
    return Creds(jwt=token, seed=user.seed)
