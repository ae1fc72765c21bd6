"""What `approve`/`deny` refuse to send before they touch the run: a `--digest` that is not the
pending call's names both digests and both ways it happens (a typo, or the call changed)."""

from __future__ import annotations

import argparse

from agentrun.cli import control

PENDING = {"digest": "sha256:aaaa", "tool": "send_mail"}


def args(verb: str, digest: str | None) -> argparse.Namespace:
    return argparse.Namespace(verb=verb, run="held", digest=digest, prog="kubectl agentrun")


def test_a_digest_other_than_the_pending_calls_is_refused_naming_both() -> None:
    refusal = control._refusal(args("approve", "sha256:bbbb"), PENDING)
    assert refusal is not None
    assert "sha256:bbbb" in refusal and "sha256:aaaa" in refusal
    assert "mistyped, or the call changed since you looked" in refusal
    assert refusal.endswith("approve again")


def test_the_pending_calls_own_digest_is_sent() -> None:
    assert control._refusal(args("approve", "sha256:aaaa"), PENDING) is None
    assert control._refusal(args("deny", "sha256:aaaa"), PENDING) is None


def test_a_denial_without_a_digest_applies_to_the_pending_call() -> None:
    assert control._refusal(args("deny", None), PENDING) is None
