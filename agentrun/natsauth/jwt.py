"""NKeys and NATS JWTs: the decentralised-auth tokens nats-server verifies, encoded here.

An NKey is an Ed25519 key pair in NATS's encoding (a seed ``S…``, a public key whose first
letter says its role: ``O`` operator, ``A`` account, ``U`` user), made and used through the
official ``nkeys`` package. A NATS JWT is a standard JWT signed with an NKey: the header is
``{"typ":"JWT","alg":"ed25519-nkey"}`` and the claims carry ``jti`` (a hash of the claims),
``iat``, ``iss`` (the signer's public key), ``sub`` (the subject's public key), ``name``,
optionally ``exp``, and ``nats`` (the role's own claims with ``type`` and ``version: 2``). The
claim shapes are those of the nats-io/jwt v2 library (``OperatorClaims``, ``AccountClaims``,
``UserClaims``) and NATS ADR-14 ("JWT library free jwt user generation"); the real nats-server
is the judge of them (``tests/natsauth``).

What belongs here: keys, encoding, decoding and verifying tokens, and the claim bodies of the
three roles. What identities exist and what each may do is ``permissions``; which keys an
installation holds, ``authority``.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
"""The header of every v2 NATS JWT."""
VERSION = 2
"""The claims version nats-server reads (``nats.version``)."""


class KeyKind(enum.StrEnum):
    """The role an NKey is made for (its public key's first letter)."""

    OPERATOR = "operator"
    ACCOUNT = "account"
    USER = "user"


_PREFIX = {
    KeyKind.OPERATOR: nkeys.PREFIX_BYTE_OPERATOR,
    KeyKind.ACCOUNT: nkeys.PREFIX_BYTE_ACCOUNT,
    KeyKind.USER: nkeys.PREFIX_BYTE_USER,
}
_LETTER = {KeyKind.OPERATOR: "O", KeyKind.ACCOUNT: "A", KeyKind.USER: "U"}


class InvalidToken(ValueError):
    """A JWT that does not decode, or whose signature does not verify."""


@dataclasses.dataclass(frozen=True, slots=True)
class NKey:
    """One NKey pair. Create with ``NKey.generate`` or ``NKey.from_seed``."""

    seed: str
    """The private seed, ``S…`` (58 characters): whoever holds it acts as this key."""
    public: str
    """The public key, ``O…``, ``A…`` or ``U…`` (56 characters)."""

    @classmethod
    def generate(cls, kind: KeyKind) -> NKey:
        """A fresh key of ``kind`` from the operating system's randomness."""
        seed = nkeys.encode_seed(os.urandom(32), _PREFIX[kind])
        return cls.from_seed(seed.decode())

    @classmethod
    def from_seed(cls, seed: str, *, kind: KeyKind | None = None) -> NKey:
        """The pair of ``seed``; ``kind`` (when given) must be the seed's role.

        Raises ``ValueError`` naming what is wrong: not a seed, or a seed of another role.
        """
        try:
            pair = nkeys.from_seed(bytearray(seed.strip().encode()))
            public = pair.public_key.decode()
        except Exception as err:  # nkeys raises its own errors and binascii's
            raise ValueError(f"not an NKey seed: {err!r}") from None
        if kind is not None and not public.startswith(_LETTER[kind]):
            raise ValueError(f"the seed is not an {kind.value} key (its public key is {public})")
        return cls(seed=seed.strip(), public=public)

    def sign(self, data: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``data``."""
        pair = nkeys.from_seed(bytearray(self.seed.encode()))
        return bytes(pair.sign(data))


def public_key_bytes(public: str) -> bytes:
    """The raw 32-byte Ed25519 key of an encoded public NKey (prefix and CRC-16 removed).

    Raises ``ValueError`` when ``public`` is not base32 of a 35-byte key.
    """
    padded = public + "=" * (-len(public) % 8)
    try:
        raw = base64.b32decode(padded)
    except ValueError as err:
        raise ValueError(f"not a public NKey: {public!r}") from err
    if len(raw) != 35:
        raise ValueError(f"not a public NKey: {public!r}")
    return raw[1:33]


def encode(
    nats: Mapping[str, Any],
    *,
    issuer: NKey,
    subject: str,
    name: str,
    issued_at: int,
    expires: int | None = None,
) -> str:
    """A JWT of ``nats`` claims about ``subject`` (a public key), signed by ``issuer``.

    ``issued_at`` and ``expires`` are UNIX seconds; ``jti`` is the base32 SHA-256 of the
    claims with an empty ``jti``, as ADR-14 describes.
    """
    claims: dict[str, Any] = {
        "jti": "",
        "iat": issued_at,
        "iss": issuer.public,
        "name": name,
        "sub": subject,
        "nats": dict(nats),
    }
    if expires is not None:
        claims["exp"] = expires
    claims["jti"] = base64.b32encode(hashlib.sha256(_json(claims)).digest()).decode().rstrip("=")
    signing_input = f"{_b64(_json(HEADER))}.{_b64(_json(claims))}"
    return f"{signing_input}.{_b64(issuer.sign(signing_input.encode()))}"


def decode(token: str, *, verify: bool = True) -> dict[str, Any]:
    """The claims of ``token``, its signature checked against its ``iss`` unless ``verify``
    is False. Raises ``InvalidToken`` saying why."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise InvalidToken("a JWT has three dot-separated parts")
    try:
        header = json.loads(_unb64(parts[0]))
        claims: dict[str, Any] = json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except ValueError as err:
        raise InvalidToken(f"not base64url JSON: {err}") from err
    if header != HEADER:
        raise InvalidToken(f"header {header} is not {HEADER}")
    if verify:
        try:
            key = nacl.signing.VerifyKey(public_key_bytes(str(claims.get("iss", ""))))
            key.verify(f"{parts[0]}.{parts[1]}".encode(), signature)
        except (ValueError, nacl.exceptions.BadSignatureError) as err:
            raise InvalidToken(f"the signature does not verify against iss: {err}") from err
    return claims


def operator_claims(*, system_account: str) -> dict[str, Any]:
    """An operator's ``nats`` claims: its system account (the server's own account)."""
    return {"system_account": system_account, "type": "operator", "version": VERSION}


UNLIMITED_ACCOUNT = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
"""Connection and message limits of an account: none (the users' permissions bound them)."""
JETSTREAM_UNLIMITED = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
"""JetStream limits that enable JetStream for an account (all zero would disable it)."""
DENY_ALL = {"pub": {"deny": [">"]}, "sub": {"deny": [">"]}}
"""Permissions that allow nothing."""


def account_claims(
    *,
    signing_keys: Sequence[Mapping[str, Any]] = (),
    revocations: Mapping[str, int] | None = None,
    jetstream: bool = False,
) -> dict[str, Any]:
    """An account's ``nats`` claims.

    ``signing_keys``: scoped signing keys (``scoped_key``); a user signed by one gets that
    key's template and nothing else. ``revocations``: user public key → UNIX second; user JWTs
    of that key issued at or before it are refused (``"*"`` for every user). ``jetstream``
    enables JetStream without limits. Users with no permissions of their own may do nothing
    (``default_permissions`` deny all).
    """
    limits: dict[str, Any] = dict(UNLIMITED_ACCOUNT)
    if jetstream:
        limits |= JETSTREAM_UNLIMITED
    claims: dict[str, Any] = {
        "limits": limits,
        "default_permissions": DENY_ALL,
        "type": "account",
        "version": VERSION,
    }
    if signing_keys:
        claims["signing_keys"] = [dict(k) for k in signing_keys]
    if revocations:
        claims["revocations"] = dict(sorted(revocations.items()))
    return claims


def scoped_key(
    key: str, *, role: str, template: Mapping[str, Any], description: str = ""
) -> dict[str, Any]:
    """A ``user_scope`` signing key entry of an account: ``template`` holds the ``pub``,
    ``sub`` (``allow``/``deny`` lists, which may use ``{{tag(NAME)}}``, ``{{name()}}``,
    ``{{subject()}}``), ``resp`` and ``subs``/``data``/``payload`` limits every user it signs
    gets."""
    return {
        "kind": "user_scope",
        "key": key,
        "role": role,
        "template": dict(template),
        "description": description,
    }


def user_claims(*, account: str, tags: Sequence[str] = ()) -> dict[str, Any]:
    """A scoped user's ``nats`` claims: its account (the signing key's) and its tags
    (``namespace:team-a``), no permissions of its own (a scoped user must carry none)."""
    claims: dict[str, Any] = {"issuer_account": account, "type": "user", "version": VERSION}
    if tags:
        claims["tags"] = list(tags)
    return claims


def _json(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
