"""The run-signing keys: files that round-trip, ids that follow the key, a rotation that trusts
the new key before it signs and keeps the old one trusted until it is retired, and a file a
process reads again when it changes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentrun.trust import KeyFileError, NoSigningKey, SigningKeys, TrustedKeys, keys, trust_file


def test_a_first_key_signs_at_once_and_is_trusted_under_its_own_id() -> None:
    signing, trusted = keys.generate(now=100.0)
    key = signing.active(100.0)
    assert trusted.keys == {key.id: keys.TrustedKey(key.public, 100.0)}
    assert key.id == keys.key_id(key.public) and key.id.startswith("k") and len(key.id) == 13
    assert SigningKeys.parse(signing.text()) == signing
    assert TrustedKeys.parse(trusted.text()) == trusted


def test_a_rotation_trusts_the_new_key_at_once_and_signs_with_it_only_later() -> None:
    signing, trusted = keys.generate(now=0.0)
    old = signing.active(0.0)
    signing, trusted, new = keys.rotate(signing, trusted, now=1_000.0, activate_after=120.0)
    assert set(trusted.keys) == {old.id, new.id}
    assert signing.active(1_000.0) == old  # workers may not have read the new key yet
    assert signing.active(1_119.0) == old
    assert signing.active(1_120.0) == new
    signing, trusted, newer = keys.rotate(signing, trusted, now=2_000.0, activate_after=120.0)
    assert [k.id for k in signing.keys] == [new.id, newer.id]  # old can never sign again
    assert set(trusted.keys) == {old.id, new.id, newer.id}  # but its runs still verify


def test_a_key_is_retired_only_once_it_stopped_signing_and_no_run_can_carry_its_seal() -> None:
    signing, trusted = keys.generate(now=0.0)
    old = signing.active(0.0)
    assert "signs now" in keys.retirable(trusted, old.id, admitted=[], now=0.0)
    signing, trusted, new = keys.rotate(signing, trusted, now=10.0, activate_after=5.0)
    assert "signs now" in keys.retirable(trusted, old.id, admitted=[], now=12.0)  # not yet
    assert trusted.signed_until(old.id) == 15.0 and trusted.signed_until(new.id) is None
    going = keys.retirable(trusted, old.id, admitted=[14.0, 30.0], now=40.0)
    assert going.startswith("1 run(s) still going")  # admitted at 14: sealed with the old key
    assert keys.retirable(trusted, old.id, admitted=[15.0, 30.0], now=40.0) == ""
    signing, trusted = keys.retire(signing, trusted, old.id)
    assert set(trusted.keys) == {new.id}
    assert [k.id for k in signing.keys] == [new.id]
    assert "not trusted" in keys.retirable(trusted, old.id, admitted=[], now=40.0)
    with pytest.raises(ValueError, match="only signing key"):
        keys.retire(signing, trusted, new.id)


def test_no_key_signs_before_its_time_or_from_an_empty_file() -> None:
    with pytest.raises(NoSigningKey, match="no key"):
        SigningKeys(()).active(0.0)
    signing = SigningKeys((keys.SigningKey.generate(active_from=50.0),))
    with pytest.raises(NoSigningKey, match="before 50"):
        signing.active(10.0)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "not JSON"),
        ('{"keys": 3}', '"keys" list'),
        ('{"keys": [{"id": "k1", "publicKey": "AAAA"}]}', "malformed"),
        ('{"keys": [{"id": "k000000000000", "publicKey": "' + "A" * 43 + '="}]}', "not its key"),
    ],
    ids=["not-json", "no-list", "short-key", "wrong-id"],
)
def test_a_malformed_trust_file_is_refused_saying_what_is_wrong(text: str, match: str) -> None:
    with pytest.raises(KeyFileError, match=match):
        TrustedKeys.parse(text)


def test_a_signing_file_whose_id_is_not_its_seeds_is_refused() -> None:
    signing, _ = keys.generate(now=0.0)
    data = json.loads(signing.text())
    data["keys"][0]["id"] = "k000000000000"
    with pytest.raises(KeyFileError, match="not its seed's id"):
        SigningKeys.parse(json.dumps(data))
    data["keys"][0]["activeFrom"] = "soon"
    with pytest.raises(KeyFileError, match="activeFrom"):
        SigningKeys.parse(json.dumps(data))


def test_a_process_reads_its_trust_file_again_when_it_changes(tmp_path: Path) -> None:
    signing, trusted = keys.generate(now=0.0)
    path = tmp_path / "trust.json"
    path.write_text(trusted.text())
    current = trust_file(path)
    assert current() == trusted
    _, rotated, new = keys.rotate(signing, trusted, now=1.0)
    path.write_text(rotated.text())
    os.utime(path, ns=(1, 2_000_000_000))  # a new modification time, whatever the clock
    assert new.id in current().keys
    path.write_text("half-written")  # an update caught mid-way keeps the last good keys
    os.utime(path, ns=(1, 3_000_000_000))
    assert current() == rotated


def test_a_process_without_its_trust_file_does_not_start(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        trust_file(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(KeyFileError):
        trust_file(tmp_path / "bad.json")
