"""NATS ``.creds`` files: a user JWT and its NKey seed, in the decorated text form every NATS
client reads (``nats-py``'s ``user_credentials=``, ``nsc``'s output).

What belongs here: formatting and parsing that text, and what a client learns from its own
creds (the inbox subtree its identity may use). Minting users is ``authority``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from agentrun.natsauth import jwt
from agentrun.natsauth.permissions import NAMESPACE_TAG, ROLE_TAG, Role, inbox_prefix

_BLOCK = re.compile(r"-{3,}BEGIN ([A-Z ]+)-{3,}\s*\n(.+?)\n\s*-{3,}END \1-{3,}", re.S)


class InvalidCreds(ValueError):
    """Text that is not a ``.creds`` file; the message says what is missing."""


@dataclasses.dataclass(frozen=True, slots=True)
class Creds:
    """A user's JWT and seed."""

    jwt: str
    seed: str

    def text(self) -> str:
        """The ``.creds`` file's text (the layout ``nsc generate creds`` writes)."""
        return (
            "-----BEGIN NATS USER JWT-----\n"
            f"{self.jwt}\n"
            "------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n"
            "NKEY Seed printed below can be used to sign and prove identity.\n"
            "NKEYs are sensitive and should be treated as secrets.\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"{self.seed}\n"
            "------END USER NKEY SEED------\n\n"
            "*************************************************************\n"
        )

    @property
    def public(self) -> str:
        """The user's public key (``U…``), the JWT's subject."""
        return str(jwt.decode(self.jwt, verify=False)["sub"])

    def tags(self) -> dict[str, str]:
        """The user's ``name:value`` tags as a mapping (``role``, ``namespace``)."""
        nats = jwt.decode(self.jwt, verify=False).get("nats") or {}
        found: dict[str, str] = {}
        for tag in nats.get("tags") or ():
            name, _, value = str(tag).partition(":")
            found[name] = value
        return found

    def inbox_prefix(self) -> str | None:
        """The inbox subtree this user may subscribe to (``permissions.inbox_prefix`` of its
        ``role`` tag), or None for a user agentrun did not mint, or a reader without a
        namespace (the client default; the server decides what such a user may do)."""
        tags = self.tags()
        try:
            return inbox_prefix(Role(tags.get(ROLE_TAG, "")), namespace=tags.get(NAMESPACE_TAG))
        except ValueError:
            return None


def parse(text: str) -> Creds:
    """The JWT and seed of a ``.creds`` text. Raises ``InvalidCreds`` naming the missing
    block."""
    blocks = {name: body.strip() for name, body in _BLOCK.findall(text)}
    token, seed = blocks.get("NATS USER JWT"), blocks.get("USER NKEY SEED")
    if not token:
        raise InvalidCreds("no '-----BEGIN NATS USER JWT-----' block")
    if not seed:
        raise InvalidCreds("no '-----BEGIN USER NKEY SEED-----' block")
    return Creds(jwt=token, seed=seed)


def read(path: Path) -> Creds:
    """``parse`` of the file at ``path``. Raises ``OSError`` or ``InvalidCreds`` (naming the
    file)."""
    try:
        return parse(path.read_text())
    except InvalidCreds as err:
        raise InvalidCreds(f"{path}: {err}") from None
