"""A cached prompt token is never dearer than an uncached one: an AgentModel priced so (a
provider's cache-write price, 1.25x input, put in ``cachedInputPerMillionUSD``) is refused
naming the field, and a reservation prices a prompt at the dearer of the two prices, so a run
admitted before that rule cannot cost past what it held either. (Priced at the input price
only, two calls served from cache took a $0.0028 cost limit to $0.010.)"""

from __future__ import annotations

from decimal import Decimal

import pytest

from agentrun import kernel
from agentrun.ledger import Book, CallNeed, Granted, Hold, TenantLimits
from agentrun.operator.agents.spec import AgentModelSpec
from agentrun.operator.platform.spec import SpecError

NOW = 1_700_000_000.0


def test_an_agentmodel_with_a_cached_price_above_the_input_price_is_refused() -> None:
    with pytest.raises(
        SpecError, match="cachedInputPerMillionUSD 10 is above inputPerMillionUSD 1"
    ):
        AgentModelSpec.of(
            "m",
            {
                "baseURL": "http://x/v1",
                "model": "m",
                "pricing": {
                    "inputPerMillionUSD": "1",
                    "cachedInputPerMillionUSD": "10",
                    "outputPerMillionUSD": "1",
                },
            },
        )


def test_a_reservation_holds_a_cached_prompt_at_the_dearer_price() -> None:
    pricing = kernel.Pricing(Decimal("1"), Decimal("10"), Decimal("1"))
    need = CallNeed(400, 1000, pricing, min_output_tokens=128)
    assert need.worst(1000)[1] == pricing.cost(
        input_tokens=400, cached_input_tokens=400, output_tokens=1000
    )
    limits = TenantLimits(cost_usd=Decimal("0.012"))
    book = Book.new("t", limits, now=NOW)
    granted = []
    for uid in ("a", "b", "c"):
        assert book.admit(uid, "ns", uid, now=NOW) is None
        hold = Hold(uid, 0, 0, Decimal(0), NOW + 60, f"owner-{uid}", "ns", uid)
        if isinstance(book.reserve_call(f"{uid}:0", need, hold, now=NOW), Granted):
            granted.append(uid)
    assert granted == ["a", "b"]  # 0.0050 each at the cached price: a third does not fit
    cost = pricing.cost(input_tokens=400, cached_input_tokens=400, output_tokens=1000)
    for uid in granted:  # the provider served each whole prompt from its cache
        assert book.record_spend(f"{uid}:0", owner=f"owner-{uid}", tokens=1400, cost_usd=cost)
        book.settle(uid, turn=0, tokens=1400, cost_usd=cost, now=NOW, key=f"{uid}:0")
    assert book.used_cost == 2 * cost <= limits.cost_usd
