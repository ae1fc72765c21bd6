"""The run-signing keys: the operator's Ed25519 keys that seal what it admits, and the public
keys every process trusts. Pure: values, their rotation and their file text; reading the files
is ``files``, keeping them in Kubernetes Secrets is ``secrets``.

Two files, each one JSON object:

- the signing file (``signing.json``, the operator's alone): every private key with the time it
  becomes the one that signs (``activeFrom``, epoch seconds). The operator signs with the newest
  key whose time has come, so a rotation publishes a new public key first and signs with it only
  once every process can have read it;
- the trust file (``trust.json``, every process's): the public keys a seal may name, by key id.
  A seal naming a key that is not there is refused. A run admitted under a key keeps that key
  id for its whole life, so keys stay trusted until explicitly retired.

Keys stay trusted until retired, and a key is retired only once no run still going can carry
its seal (``retirable``). A key's id is derived from its public key (``k`` and 12 hex digits of
its SHA-256), so equal keys have equal ids everywhere.

Raises, when parsing: ``KeyFileError`` (a ``ValueError``) naming the file and what is wrong.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping

from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

SIGNING_FILE = "signing.json"
"""The signing file's name in its Secret (mounted in the operator only)."""
TRUST_FILE = "trust.json"
"""The trust file's name in its Secret (mounted in the operator and the workers)."""
ACTIVATION_DELAY = 120.0
"""Seconds between a rotation and the first seal with the new key by default: longer than the
kubelet takes to update a Secret volume (its sync period, about a minute), so every worker
trusts the key before anything is sealed with it."""


class KeyFileError(ValueError):
    """A signing or trust file that cannot be read as one; the message names what is wrong."""


class NoSigningKey(RuntimeError):
    """No key of the signing file may sign yet (every ``activeFrom`` is in the future)."""


def key_id(public: bytes) -> str:
    """The id of the Ed25519 public key ``public`` (32 raw bytes): ``k<12 hex digits>``."""
    return "k" + hashlib.sha256(public).hexdigest()[:12]


def _public_bytes(private: ed25519.Ed25519PrivateKey) -> bytes:
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


@dataclasses.dataclass(frozen=True, slots=True)
class SigningKey:
    """One private key of the operator."""

    seed: bytes
    """The Ed25519 private key, 32 raw bytes."""
    active_from: float
    """Epoch seconds from which it may sign."""

    @property
    def public(self) -> bytes:
        """Its public key, 32 raw bytes."""
        return _public_bytes(ed25519.Ed25519PrivateKey.from_private_bytes(self.seed))

    @property
    def id(self) -> str:
        """Its key id (``key_id``)."""
        return key_id(self.public)

    def sign(self, data: bytes) -> bytes:
        """The Ed25519 signature of ``data`` (64 bytes; RFC 8032)."""
        return ed25519.Ed25519PrivateKey.from_private_bytes(self.seed).sign(data)

    @classmethod
    def generate(cls, *, active_from: float) -> SigningKey:
        """A fresh key that may sign from ``active_from``."""
        private = ed25519.Ed25519PrivateKey.generate()
        seed = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return cls(seed, active_from)


@dataclasses.dataclass(frozen=True, slots=True)
class SigningKeys:
    """The operator's signing file: its keys, oldest first."""

    keys: tuple[SigningKey, ...]

    def active(self, now: float) -> SigningKey:
        """The key that signs at ``now``: the one with the latest ``active_from`` not after
        ``now``. Raises ``NoSigningKey`` when there is none."""
        ready = [k for k in self.keys if k.active_from <= now]
        if not ready:
            if not self.keys:
                raise NoSigningKey("the run-signing file holds no key")
            first = min(k.active_from for k in self.keys)
            raise NoSigningKey(f"no run-signing key may sign before {first:.0f}")
        return max(ready, key=lambda k: k.active_from)

    def text(self) -> str:
        """The signing file's text."""
        keys = [
            {
                "id": k.id,
                "seed": base64.b64encode(k.seed).decode(),
                "activeFrom": k.active_from,
            }
            for k in self.keys
        ]
        return json.dumps({"keys": keys}, indent=1) + "\n"

    @classmethod
    def parse(cls, text: str) -> SigningKeys:
        """The signing file ``text``. Raises ``KeyFileError``."""
        rows = _rows(text, SIGNING_FILE)
        keys: list[SigningKey] = []
        for row in rows:
            try:
                key = SigningKey(_raw(row["seed"], 32), _number(row["activeFrom"]))
                key.public  # noqa: B018 (checks the seed is a key)
            except (KeyError, TypeError, ValueError) as err:
                raise KeyFileError(f"{SIGNING_FILE}: a key is malformed: {err!r}") from None
            if row.get("id") not in (None, key.id):
                raise KeyFileError(f"{SIGNING_FILE}: key {row.get('id')!r} is not its seed's id")
            keys.append(key)
        return cls(tuple(sorted(keys, key=lambda k: k.active_from)))


@dataclasses.dataclass(frozen=True, slots=True)
class TrustedKey:
    """One public key of the trust file."""

    public: bytes
    """The Ed25519 public key, 32 raw bytes."""
    active_from: float
    """Epoch seconds from which its private key signs (so until when a key signed: the next
    key's time; ``retirable`` reads it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TrustedKeys:
    """The trust file: public keys by key id."""

    keys: Mapping[str, TrustedKey]

    def public(self, kid: str) -> bytes | None:
        """The public key ``kid`` (32 raw bytes), or ``None`` when it is not trusted."""
        found = self.keys.get(kid)
        return None if found is None else found.public

    def signed_until(self, kid: str) -> float | None:
        """When key ``kid`` stopped signing (the next key's ``active_from``); ``None`` while it
        is the newest."""
        since = self.keys[kid].active_from
        later = [k.active_from for k in self.keys.values() if k.active_from > since]
        return min(later) if later else None

    def text(self) -> str:
        """The trust file's text."""
        keys = [
            {
                "id": kid,
                "publicKey": base64.b64encode(key.public).decode(),
                "activeFrom": key.active_from,
            }
            for kid, key in sorted(self.keys.items())
        ]
        return json.dumps({"keys": keys}, indent=1) + "\n"

    @classmethod
    def parse(cls, text: str) -> TrustedKeys:
        """The trust file ``text``. Raises ``KeyFileError`` (also for a key listed under
        another key's id)."""
        keys: dict[str, TrustedKey] = {}
        for row in _rows(text, TRUST_FILE):
            try:
                public = _raw(row["publicKey"], 32)
                active_from = _number(row.get("activeFrom", 0.0))
            except (KeyError, TypeError, ValueError) as err:
                raise KeyFileError(f"{TRUST_FILE}: a key is malformed: {err!r}") from None
            if row.get("id") != key_id(public):
                raise KeyFileError(f"{TRUST_FILE}: key {row.get('id')!r} is not its key's id")
            keys[key_id(public)] = TrustedKey(public, active_from)
        return cls(keys)

    @classmethod
    def of(cls, signing: SigningKeys) -> TrustedKeys:
        """The trust file of every key of ``signing``."""
        return cls({k.id: TrustedKey(k.public, k.active_from) for k in signing.keys})


def _rows(text: str, name: str) -> list[dict[str, object]]:
    try:
        data = json.loads(text)
    except ValueError as err:
        raise KeyFileError(f"{name} is not JSON: {err}") from None
    rows = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise KeyFileError(f'{name} has no "keys" list of objects')
    return rows


def _number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"activeFrom is {type(value).__name__}, not a number")
    return float(value)


def _raw(value: object, size: int) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"expected base64 text, got {type(value).__name__}")
    raw = base64.b64decode(value, validate=True)
    if len(raw) != size:
        raise ValueError(f"expected {size} bytes, got {len(raw)}")
    return raw


def generate(*, now: float) -> tuple[SigningKeys, TrustedKeys]:
    """A first key, signing at once, and the trust file that trusts it."""
    signing = SigningKeys((SigningKey.generate(active_from=now),))
    return signing, TrustedKeys.of(signing)


def rotate(
    signing: SigningKeys,
    trusted: TrustedKeys,
    *,
    now: float,
    activate_after: float = ACTIVATION_DELAY,
) -> tuple[SigningKeys, TrustedKeys, SigningKey]:
    """A new key, trusted at once and signing ``activate_after`` seconds from ``now``; the keys
    that can never sign again (older than the key active at ``now``) leave the signing file but
    stay trusted. Returns both files and the new key."""
    fresh = SigningKey.generate(active_from=now + activate_after)
    try:
        current = signing.active(now)
        kept = tuple(k for k in signing.keys if k.active_from >= current.active_from)
    except NoSigningKey:
        kept = signing.keys
    return (
        SigningKeys((*kept, fresh)),
        TrustedKeys({**trusted.keys, fresh.id: TrustedKey(fresh.public, fresh.active_from)}),
        fresh,
    )


def retirable(trusted: TrustedKeys, kid: str, *, admitted: Iterable[float], now: float) -> str:
    """Why key ``kid`` may not be retired now, or ``""`` when it may: it must be trusted,
    superseded by a key that signs at ``now``, and no run still going may have been admitted
    under it (``admitted``: the admission times, epoch seconds, of the runs not ended: a run
    admitted before the key's successor signed may carry its seal for its whole life)."""
    if kid not in trusted.keys:
        return f"key {kid} is not trusted: nothing to retire"
    until = trusted.signed_until(kid)
    if until is None or until > now:
        return f"key {kid} signs now (or until its successor's time): rotate first"
    holding = sum(1 for at in admitted if at < until)
    if holding:
        return (
            f"{holding} run(s) still going were admitted before {until:.0f}, when key {kid} "
            "stopped signing: their seals name it"
        )
    return ""


def retire(signing: SigningKeys, trusted: TrustedKeys, kid: str) -> tuple[SigningKeys, TrustedKeys]:
    """Both files without key ``kid`` (check ``retirable`` first): seals naming it are
    refused from then on. Raises ``ValueError`` when it would leave no key to sign with."""
    left = tuple(k for k in signing.keys if k.id != kid)
    if not left:
        raise ValueError(f"key {kid} is the only signing key")
    return SigningKeys(left), TrustedKeys({i: k for i, k in trusted.keys.items() if i != kid})
