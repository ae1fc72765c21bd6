"""The closed bus: NATS identities, their permissions, their credentials.

agentrun uses NATS's own decentralised auth (operator mode): an operator key signs the
accounts, scoped signing keys of the ``AGENTRUN`` account sign users, and nats-server checks
every connection and every subject against them. Nothing here talks to NATS.

- ``jwt``: NKeys and NATS JWTs (nats-io/jwt v2 claims) on top of the ``nkeys`` package;
- ``permissions``: the identities (operator, worker, per-namespace reader) and exactly what
  each may publish and subscribe to, built from ``agentrun.protocol``'s names;
- ``creds``: the ``.creds`` file format, and the inbox subtree a user's creds imply;
- ``authority``: an installation's keys, the server's auth configuration derived from them,
  minting users (and ``mint_user``, for a holder of one role's signing key alone);
- ``bootstrap``: the keys and credentials kept in Kubernetes Secrets (``agentrun nats
  bootstrap``, the chart's install hook).
"""

from agentrun.natsauth.authority import Authority, mint_user
from agentrun.natsauth.creds import Creds, InvalidCreds
from agentrun.natsauth.jwt import InvalidToken, KeyKind, NKey
from agentrun.natsauth.permissions import Permissions, Role, inbox_prefix

__all__ = [
    "Authority",
    "Creds",
    "InvalidCreds",
    "InvalidToken",
    "KeyKind",
    "NKey",
    "Permissions",
    "Role",
    "inbox_prefix",
    "mint_user",
]
