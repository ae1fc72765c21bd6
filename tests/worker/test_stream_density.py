"""The cut compares ``Delivery.delivered_tokens`` with the call's allowance, a count that must
not run ahead of a real tokenizer's: o200k_base packs Russian prose at about 5 characters a
token, so a Russian reply within its allowance is not cut (it was at about half, counting two
characters a token). o200k counts: see tests/kernel/test_usage_floor.py."""

from __future__ import annotations

from kernel.test_usage_floor import O200K

from agentrun.worker.delivery import Delivery


def streamed(text: str, *, per_chunk: int = 4) -> Delivery:
    """``text`` as a provider streams it, a few characters a chunk (about a token each)."""
    delivery = Delivery()
    for start in range(0, len(text), per_chunk):
        piece = text[start : start + per_chunk]
        delivery.add({"id": "c", "choices": [{"index": 0, "delta": {"content": piece}}]})
    return delivery


def test_a_russian_reply_within_its_allowance_is_not_cut() -> None:
    text, honest = O200K["ru-news"]
    allowance = honest + honest // 2  # the provider stops at 2,701 of 4,051 tokens
    delivery = streamed(text)
    assert delivery.delivered_tokens <= allowance, (delivery.delivered_tokens, honest)
