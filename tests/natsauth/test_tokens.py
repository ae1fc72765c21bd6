"""The pieces of the closed bus that need no server: keys of the right role, tokens whose
signatures verify and whose tampering is caught, creds files, the inbox a user's creds imply,
what minting refuses."""

from __future__ import annotations

import pytest

from agentrun.natsauth import (
    Authority,
    InvalidCreds,
    InvalidToken,
    KeyKind,
    NKey,
    Role,
    jwt,
    mint_user,
)
from agentrun.natsauth import creds as creds_format


def test_a_key_has_its_roles_letter_and_refuses_another_role() -> None:
    for kind, letter in ((KeyKind.OPERATOR, "O"), (KeyKind.ACCOUNT, "A"), (KeyKind.USER, "U")):
        key = NKey.generate(kind)
        assert key.public.startswith(letter) and key.seed.startswith("S" + letter)
        assert NKey.from_seed(key.seed, kind=kind) == key
    user = NKey.generate(KeyKind.USER)
    with pytest.raises(ValueError, match="not an account key"):
        NKey.from_seed(user.seed, kind=KeyKind.ACCOUNT)
    with pytest.raises(ValueError, match="not an NKey seed"):
        NKey.from_seed("SUnot-a-seed")


def test_a_token_verifies_against_its_issuer_and_tampering_is_caught() -> None:
    issuer = NKey.generate(KeyKind.ACCOUNT)
    user = NKey.generate(KeyKind.USER)
    token = jwt.encode(
        jwt.user_claims(account=issuer.public, tags=["role:worker"]),
        issuer=issuer,
        subject=user.public,
        name="w",
        issued_at=1_700_000_000,
        expires=1_800_000_000,
    )
    claims = jwt.decode(token)
    assert (claims["iss"], claims["sub"], claims["exp"]) == (
        issuer.public,
        user.public,
        1_800_000_000,
    )
    assert claims["nats"] == {
        "issuer_account": issuer.public,
        "type": "user",
        "version": 2,
        "tags": ["role:worker"],
    }
    header, payload, signature = token.split(".")
    other = jwt.encode(
        {"type": "user", "version": 2}, issuer=issuer, subject=user.public, name="x", issued_at=1
    )
    with pytest.raises(InvalidToken, match="signature"):
        jwt.decode(f"{header}.{other.split('.')[1]}.{signature}")
    with pytest.raises(InvalidToken, match="three"):
        jwt.decode("a.b")
    with pytest.raises(InvalidToken, match="header"):
        jwt.decode(f"{jwt._b64(b'{}')}.{payload}.{signature}")


def test_creds_round_trip_and_say_what_is_missing() -> None:
    authority = Authority.generate()
    user = authority.mint(Role.WORKER, name="w")
    parsed = creds_format.parse(user.text())
    assert parsed == user
    assert parsed.inbox_prefix() == "_INBOX.worker"
    with pytest.raises(InvalidCreds, match="NATS USER JWT"):
        creds_format.parse("nothing here")
    with pytest.raises(InvalidCreds, match="USER NKEY SEED"):
        creds_format.parse(user.text().split("*****")[0])


def test_a_reader_is_minted_for_one_namespace_only() -> None:
    authority = Authority.generate()
    reader = authority.mint(Role.READER, name="r", namespace="team-a")
    assert reader.tags() == {"role": "reader", "namespace": "team-a"}
    assert reader.inbox_prefix() == "_INBOX.reader.team-a"
    with pytest.raises(ValueError, match="one namespace"):
        mint_user(
            authority.signers[Role.READER],
            account=authority.account.public,
            role=Role.READER,
            name="r",
        )


def test_the_account_carries_one_scoped_key_per_role_and_the_revocations() -> None:
    authority = Authority.generate(now=1_700_000_000).revoke("UOLD", now=1_700_000_100)
    claims = jwt.decode(authority.account_jwt())
    keys = {k["role"]: k for k in claims["nats"]["signing_keys"]}
    assert set(keys) == {"operator", "worker", "reader"}
    assert keys["worker"]["key"] == authority.signers[Role.WORKER].public
    worker_pub = keys["worker"]["template"]["pub"]["allow"]
    assert "$KV.AGENTRUN_LEDGER.book.>" in worker_pub
    assert "$KV.AGENTRUN_LEDGER.run.>" in worker_pub
    assert not [s for s in worker_pub if "queue" in s or s == "$KV.AGENTRUN_LEDGER.>"]
    assert claims["nats"]["revocations"] == {"UOLD": 1_700_000_100}
    assert claims["nats"]["default_permissions"] == jwt.DENY_ALL
    # the operator's JWT keeps its stamp: nats-server reloads no change of its operator
    assert jwt.decode(authority.operator_jwt())["iat"] == 1_700_000_000
    assert claims["iat"] == 1_700_000_100
