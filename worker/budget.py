"""The worker's side of a turn's budgets: holding the tenant's budget for a model call, what a
streamed response is charged while it arrives, and what providers were seen to count.

What belongs here: the ``BudgetHold`` port (``agentrun.ledger.TurnHold`` implements it),
waiting for a hold, the ``SpendWatch`` a streamed response reports to, the per-model
``PromptCalibration`` and the overrun metric. What does not: the decisions (the kernel's gates
and ``overrun``), the ledger's arithmetic (``agentrun.ledger``), the HTTP call (``model``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol

from agentrun import kernel, metrics
from agentrun.ledger import BudgetRefusal, BudgetWait, CallNeed, Granted
from agentrun.protocol import RunConfig

from .delivery import Delivery

log = logging.getLogger(__name__)

MIN_OUTPUT_TOKENS = kernel.MIN_SHRUNK_OUTPUT_TOKENS
"""The smallest output allowance a call is shrunk to when the tenant's budget left cannot hold
its full allowance (a longer answer is cut at it, and the kernel asks for a correction)."""
BUDGET_POLL_SECONDS = 0.5
"""Seconds between two asks of a call waiting for other runs' holds to settle."""


class BudgetHold(Protocol):
    """The tenant budget a turn draws on (``agentrun.ledger.TurnHold``, or a stand-in)."""

    async def reserve_call(
        self, need: CallNeed, *, before: kernel.RunState | None = None
    ) -> Granted | BudgetWait | BudgetRefusal:
        """Hold the call's worst case (shrunk to fit, if need be), or say that it waits for
        other runs' holds, or why it cannot run."""
        ...

    async def spend(self, usage: kernel.Usage, *, answered: bool = True) -> None:
        """The model call answered with ``usage`` (recorded; charged if the turn is
        abandoned, even by a worker that dies), or delivered that much so far (not
        ``answered``: recorded, the hold kept whole)."""
        ...

    def note(self, usage: kernel.Usage) -> None:
        """The model call was abandoned having used ``usage`` (kept in memory: charged when
        the turn is given up uncommitted)."""
        ...

    async def abandon(self, usage: kernel.Usage) -> None:
        """Drop the hold now, charging ``usage`` as abandoned (billed by the provider, in no
        run's usage)."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class SpendWatch:
    """Records what a model call cost on the turn's hold: while its response streams, every
    ``stream.PROGRESS_SECONDS`` and every ``stream.PROGRESS_TOKENS`` of output delivered (so a
    worker that dies mid-response is charged it, but for what arrived since, when its hold
    expires; the hold keeps holding the call's worst case meanwhile), and when it is
    abandoned: the prompt's bound and the output delivered so far
    (``Delivery.charged_tokens``), charged when the turn is given up or, if the turn commits
    its failure instead (the deadline, a broken stream), by ``charge_abandoned``.

    What each cut of a call charges the tenant:
    - once its answer began to arrive (its headers), whoever cut it — the run cancelled or
      deleted, its deadline, a broken stream, a draining worker handing the turn back: the
      prompt's bound and the output delivered;
    - after its request went out and before its answer, whoever cut it — the run cancelled or
      deleted, its deadline, a draining worker handing the turn back (``pulling.HANDED_BACK``):
      the prompt's bound (the provider has read the prompt, and bills it), no output; a turn
      handed back is asked again by another worker, and that second call is a second bill,
      charged as its own. A tenant's cut while the client still connects or waits to retry
      is charged the same (it cannot see whether the request went out); a hand-back then is
      not — between attempts, after a refusal or a failed connection, nothing was billed
      (``answers.cut_unanswered``);
    - any attempt of it sent whole that got no answer before the client's read timeout
      (``RetryPolicy.request_timeout``: a provider still reading a huge prompt), whatever the
      later attempts do — time out again, fail (an error status, a refused connection), or
      are cut by the tenant or the platform: the prompt's bound, once (each such attempt may
      have been billed; one is charged); a later attempt that answers is charged what its
      answer reports instead (or, cut once it began, the first rule's charge), not besides;
    - a call that never connected, was refused, or timed out connecting or sending, on every
      attempt: nothing.
    """

    hold: BudgetHold
    call: kernel.CallModel
    pricing: kernel.Pricing
    noted: list[kernel.Usage] = dataclasses.field(default_factory=list)
    """What the call was noted abandoned at, the latest last (at most two: an attempt's read
    timeout at the prompt's bound, then a later attempt's answer abandoned mid-way)."""

    def usage(self, delivery: Delivery) -> kernel.Usage:
        """The bound of what ``delivery`` cost so far."""
        prompt, output = self.call.prompt_estimate, delivery.charged_tokens
        cost = self.pricing.cost(input_tokens=prompt, cached_input_tokens=0, output_tokens=output)
        return kernel.Usage(prompt, output, 0, cost, estimated=True)

    async def progress(self, delivery: Delivery) -> None:
        """Record what the response delivered so far on the hold, which keeps holding the
        call's worst case (the rest of the allowance may still come)."""
        await self.hold.spend(self.usage(delivery), answered=False)

    def abandoned(self, delivery: Delivery) -> None:
        """Note the call abandoned at what ``delivery`` cost (nothing delivered: its prompt's
        bound)."""
        usage = self.usage(delivery)
        self.noted.append(usage)
        self.hold.note(usage)

    def unanswered(self, cut: BaseException) -> None:
        """Note the call abandoned at its prompt's bound — whatever ``cut`` it (a tenant's
        cancel or deadline, the platform handing the turn back, a read timeout, an answer
        refused unread) — unless it was noted already (an earlier attempt's read timeout: a
        second note changes nothing, the call is charged once)."""
        if not self.noted:
            self.abandoned(Delivery())

    async def charge_abandoned(self) -> None:
        """The call raised after it was noted abandoned (the deadline, a broken stream) and
        the turn commits its failure, whose record holds none of that usage: charge it as
        abandoned now (the hold dropped), or the commit's settlement would forget it."""
        if not self.noted:
            return
        try:
            await asyncio.shield(self.hold.abandon(self.noted[-1]))
        except Exception as err:  # best effort, as giving a hold back: it expires anyway
            log.warning("abandoned call of turn %d not charged (%r)", self.call.turn, err)


class PromptCalibration:
    """Prompt tokens each model's provider was seen to count beyond the bound of what was
    sent (its chat template, tool definitions rendered in its own words, a system prompt of
    its own): the largest excess seen per tenant and (base URL, model), added to later calls'
    bounds in this worker process, so an overrun of that kind is not repeated for the tenant
    it hit. Per tenant: what one tenant's runs taught never shrinks another's budgets."""

    LIMIT = 1_000_000
    """Excesses above this are not believed."""

    def __init__(self) -> None:
        self._hidden: dict[tuple[str, str, str], int] = {}

    @staticmethod
    def _key(config: RunConfig) -> tuple[str, str, str]:
        return (config.tenant, config.model.base_url, config.model.model)

    def hidden(self, config: RunConfig) -> int:
        """The hidden prompt tokens to add for ``config``'s model and tenant."""
        return self._hidden.get(self._key(config), 0)

    def saw(self, config: RunConfig, *, reported: int, bound: int) -> None:
        """A call whose prompt bound was ``bound`` was reported as ``reported`` tokens."""
        key = self._key(config)
        excess = min(reported - bound, self.LIMIT)
        if excess > self._hidden.get(key, 0):
            self._hidden[key] = excess


async def hold_budget(
    hold: BudgetHold,
    need: CallNeed,
    *,
    state: kernel.RunState,
    deadline: float,
    clock: Callable[[], float],
) -> Granted | BudgetWait | BudgetRefusal:
    """Reserve ``need``, asking again every ``BUDGET_POLL_SECONDS`` while it waits for other
    runs' holds; a ``BudgetWait`` comes back only once the run's deadline passed waiting."""
    while True:
        answer = await hold.reserve_call(need, before=state)
        left = deadline - clock()
        if not isinstance(answer, BudgetWait) or left <= 0:
            return answer
        await asyncio.sleep(min(BUDGET_POLL_SECONDS, left))


def saw_usage(
    calibration: PromptCalibration, config: RunConfig, call: kernel.CallModel, usage: kernel.Usage
) -> None:
    """Learn from what the provider reported: tokens past what was held for the call are an
    overrun (the metric), prompt tokens past the prompt's bound calibrate later calls."""
    held = call.prompt_estimate + call.max_output_tokens
    metrics.record_overrun(config, tokens=usage.total_tokens - held)
    if not usage.estimated:
        bound = call.prompt_estimate - calibration.hidden(config)
        calibration.saw(config, reported=usage.input_tokens, bound=bound)
