"""Zero trust in message contents, as the replay sees a run's events: a run config acts only
under the operator's seal for that very run, every field of it covered, and a reviewer's
decision only under the seal of its run and turn. Each refusal has its reason."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from seals_support import VERIFIER, sealed

from agentrun import history, kernel
from agentrun.protocol import (
    Approval,
    ModelConfig,
    RemoteTool,
    RunConfig,
    RunEvent,
    SecretRef,
    UrlRule,
)
from agentrun.trust import SealFault, Signer, Untrusted, Verifier, keys

CONFIG = RunConfig(
    uid="uid-b",
    namespace="team-b",
    name="b",
    goal="tenant B's goal",
    instructions="be brief",
    tools=("http_get", "docs__search"),
    limits=kernel.Limits(
        max_steps=7,
        max_cost_usd=Decimal("0.5"),
        context_window=32000,
        max_output_tokens=1000,
        output_schema={"type": "object"},
    ),
    model=ModelConfig(
        "gpt",
        "https://models.example/v1",
        "gpt-x",
        kernel.Pricing(Decimal("1"), Decimal("0.5"), Decimal("2")),
        32000,
        1000,
        SecretRef("openai", "agentrun", "apiKey"),
    ),
    deadline=1_700_000_000.25,
    tenant="tenant-b",
    output_schema={"type": "object"},
    remote_tools=(
        RemoteTool(
            "docs__search",
            "docs",
            "search",
            "Search the docs",
            {"type": "object", "properties": {"q": {"type": "string"}}},
            "read",
            "https://mcp.example/mcp",
            "StreamableHTTP",
            30.0,
            "docs-headers",
        ),
    ),
    url_rules=(UrlRule("docs.example", "/api", False),),
)


def admitted(config: RunConfig = CONFIG, *, seal: bool = True) -> RunEvent:
    state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
    event = RunEvent("admitted", config.uid, state.summary(), config=config, time=1.0)
    return sealed(event) if seal else event


def wire(*events: RunEvent) -> list[RunEvent]:
    """The events as a reader gets them: encoded, stored, decoded, numbered."""
    return [RunEvent.decode(e.encode(), seq=i) for i, e in enumerate(events, 1)]


def refusal(events: list[RunEvent], *, verifier: Verifier = VERIFIER) -> SealFault:
    with pytest.raises(Untrusted) as caught:
        history.fold(events, run_uid=CONFIG.uid, seals=verifier)
    return caught.value.fault


def test_a_sealed_admission_is_the_run_and_an_unsealed_one_is_not_yet() -> None:
    loaded = history.fold(wire(admitted()), run_uid=CONFIG.uid, seals=VERIFIER)
    assert loaded is not None and loaded.sealed and loaded.config == CONFIG
    unsealed = history.fold(wire(admitted(seal=False)), run_uid=CONFIG.uid, seals=VERIFIER)
    assert unsealed is not None and not unsealed.sealed


def leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every leaf of a JSON value, as its path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))
    else:
        yield path


def changed(leaf: Any, field: Any) -> Any:
    """Another value of the same kind for ``field`` (one the config's shape still accepts)."""
    if isinstance(leaf, bool):
        return not leaf
    if isinstance(leaf, int | float):
        return leaf + 1
    if leaf is None:
        return (
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            if field == "traceparent"
            else 1
        )
    if leaf in ("summarize", "stop"):
        return "stop" if leaf == "summarize" else "summarize"
    try:
        return str(Decimal(leaf) + 1)
    except ArithmeticError:
        return f"{leaf}x"


CONFIG_JSON = json.loads(admitted().encode())["config"]
LEAVES = sorted(leaves(CONFIG_JSON), key=str)


def test_the_config_has_every_security_relevant_field_as_a_leaf() -> None:
    """The walk below reaches each field a worker must not take on a message's word."""
    names = {".".join(map(str, path)) for path in LEAVES}
    for field in (
        "uid", "namespace", "name", "tenant", "model.baseURL", "model.secretRef.name",
        "model.secretRef.namespace", "model.secretRef.key", "model.pricing.outputPerMillionUSD",
        "urlRules.0.host", "urlRules.0.privateNetwork", "remoteTools.0.url",
        "remoteTools.0.headersSecret", "remoteTools.0.transport", "remoteTools.0.effect",
        "remoteTools.0.privateNetwork", "remoteTools.0.pathPrefix",
        "limits.maxCostUSD", "tools.0", "deadline", "goal", "instructions",
    ):  # fmt: skip
        assert field in names


@pytest.mark.parametrize("path", LEAVES, ids=lambda p: ".".join(map(str, p)))
def test_changing_any_field_of_a_sealed_config_breaks_its_seal(path: tuple[Any, ...]) -> None:
    data = json.loads(admitted().encode())
    node = data["config"]
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = changed(node[path[-1]], path[-1])
    forged = RunEvent.decode(json.dumps(data).encode(), seq=1)
    if forged.config is not None and forged.config.uid != forged.run_uid:
        assert refusal([forged]) is SealFault.WRONG_RUN
    else:
        assert refusal([forged]) is SealFault.BAD_SIGNATURE


def test_a_field_added_to_a_sealed_config_breaks_its_seal_too() -> None:
    data = json.loads(admitted().encode())
    data["config"]["model"]["extraHeaders"] = {"X-Exfiltrate": "1"}
    assert refusal(wire_raw(data)) is SealFault.BAD_SIGNATURE


def wire_raw(data: dict[str, Any]) -> list[RunEvent]:
    return [RunEvent.decode(json.dumps(data).encode(), seq=1)]


def test_a_seal_by_a_key_nobody_trusts_is_refused() -> None:
    stranger, _ = keys.generate(now=0.0)
    event = Signer(lambda: stranger).seal_event(admitted(seal=False))
    assert refusal(wire(event)) is SealFault.UNKNOWN_KEY


def test_a_malformed_seal_verifies_nothing() -> None:
    data = json.loads(admitted().encode())
    data["seal"] = {"keyID": 3, "signature": "!!"}
    assert refusal(wire_raw(data)) is SealFault.BAD_SIGNATURE


def test_another_runs_sealed_config_is_refused_for_this_run() -> None:
    """B's sealed admission copied under another run uid: sealed for B, not for it."""
    data = json.loads(admitted().encode())
    data["runUID"] = "uid-forged"
    event = RunEvent.decode(json.dumps(data).encode(), seq=1)
    with pytest.raises(Untrusted) as caught:
        history.fold([event], run_uid="uid-forged", seals=VERIFIER)
    assert caught.value.fault is SealFault.WRONG_RUN
    assert VERIFIER.event_fault(wire(admitted())[0], namespace="team-a") is SealFault.WRONG_RUN
    assert VERIFIER.event_fault(wire(admitted())[0], name="other") is SealFault.WRONG_RUN


def test_a_second_admission_must_be_the_operators_seal_of_the_same_config() -> None:
    turn = RunEvent("stop", CONFIG.uid, kernel.initial_state(goal="g").summary())
    elsewhere = dataclasses.replace(
        CONFIG, model=dataclasses.replace(CONFIG.model, base_url="http://attacker.example/v1")
    )
    assert refusal(wire(admitted(), turn, admitted(elsewhere))) is SealFault.CHANGED_CONFIG
    assert refusal(wire(admitted(), admitted(elsewhere, seal=False))) is SealFault.UNSIGNED


def test_a_run_admitted_before_seals_acts_once_the_operator_reseals_the_same_config() -> None:
    legacy = admitted(seal=False)
    state = kernel.initial_state(goal=CONFIG.goal, instructions=CONFIG.instructions)
    resealed = sealed(RunEvent("admitted", CONFIG.uid, state.summary(), config=CONFIG))
    loaded = history.fold(wire(legacy, resealed), run_uid=CONFIG.uid, seals=VERIFIER)
    assert loaded is not None and loaded.sealed and loaded.seq == 2


def held_run() -> tuple[list[RunEvent], kernel.RunState]:
    """A run waiting for a person to decide one held call (turn 0 committed)."""
    config = dataclasses.replace(
        CONFIG,
        tools=("calculate",),
        remote_tools=(),
        limits=dataclasses.replace(CONFIG.limits, approval_tools=frozenset({"calculate"})),
    )
    state = kernel.initial_state(goal=config.goal, instructions=config.instructions)
    call = kernel.CheckedCall("call00001", "calculate", {"expression": "1+1"})
    record = kernel.Answered(
        0,
        kernel.decision.ToolCalls(
            (kernel.decision.ToolCall("call00001", "calculate", "{}"),), None
        ),
        kernel.Usage(10, 5),
        (call,),
        (),
        ("call00001",),
        None,
    )
    after = kernel.advance(state, record, config.limits)
    turn = RunEvent("turn", config.uid, after.summary(), record=record)
    return [admitted(config), turn], after


def decision(
    after: kernel.RunState, *, approved: bool, reviewer: str = "", on: int = 2
) -> RunEvent:
    """The operator's decision on ``after``'s held call, made on the run's event ``on`` (the
    sequence it is appended after: ``held_run``'s turn, numbered by ``wire``)."""
    held = after.summary().pending_approval
    assert held is not None
    state = kernel.resolve_approval(after, digest=held.digest, approved=approved, reviewer=reviewer)
    return RunEvent(
        "approval",
        CONFIG.uid,
        state.summary(),
        approval=Approval(held.digest, approved, reviewer, after=on),
    )


def numbered(events: list[RunEvent], *, first: int) -> list[RunEvent]:
    """The events as a reader gets them, numbered from stream sequence ``first``."""
    return [RunEvent.decode(e.encode(), seq=i) for i, e in enumerate(events, first)]


def test_a_decision_acts_only_under_the_operators_seal() -> None:
    events, after = held_run()
    approved = sealed(decision(after, approved=True))
    loaded = history.fold(wire(*events, approved), run_uid=CONFIG.uid, seals=VERIFIER)
    assert loaded is not None and loaded.state.phase is kernel.Phase.RUNNING
    assert refusal(wire(*events, decision(after, approved=True))) is SealFault.UNSIGNED
    flipped = dataclasses.replace(approved, approval=Approval(approved.approval.digest, False))  # type: ignore[union-attr]
    assert refusal(wire(*events, flipped)) is SealFault.BAD_SIGNATURE


def test_a_sealed_decision_cannot_be_replayed_onto_another_turn() -> None:
    events, after = held_run()
    approved = sealed(decision(after, approved=True))
    later = dataclasses.replace(
        approved, summary=dataclasses.replace(approved.summary, turn=approved.summary.turn + 1)
    )
    assert refusal(wire(*events, later)) is SealFault.BAD_SIGNATURE


def test_the_reviewer_a_sealed_decision_names_cannot_be_changed_or_dropped() -> None:
    events, after = held_run()
    approved = sealed(decision(after, approved=True, reviewer="alice"))
    loaded = history.fold(wire(*events, approved), run_uid=CONFIG.uid, seals=VERIFIER)
    assert loaded is not None and loaded.state.phase is kernel.Phase.RUNNING
    for name in ("mallory", ""):
        renamed = dataclasses.replace(
            approved,
            approval=dataclasses.replace(approved.approval, reviewer=name),  # type: ignore[type-var]
        )
        assert refusal(wire(*events, renamed)) is SealFault.BAD_SIGNATURE


def test_a_sealed_decision_cannot_be_replayed_onto_a_rerun_of_the_run() -> None:
    """A rerun keeps the run's uid and starts again at turn 0: its model may hold the very call
    alice approved in the first run, at the very turn. Her sealed decision, copied from the
    first run's events (a worker reads them all) and appended after the rerun's held turn, is
    refused: it is bound to the event it was decided on, which the rerun does not hold."""
    events, after = held_run()
    approved = sealed(decision(after, approved=True, reviewer="alice"))
    first_run = wire(*events, approved)
    loaded = history.fold(first_run, run_uid=CONFIG.uid, seals=VERIFIER)
    assert loaded is not None and loaded.state.phase is kernel.Phase.RUNNING
    rerun = numbered([*events, approved], first=10)  # purged, admitted again, held again
    assert refusal(rerun) is SealFault.REPLAYED
    moved = dataclasses.replace(
        approved,
        approval=dataclasses.replace(approved.approval, after=11),  # type: ignore[type-var]
    )
    assert refusal(numbered([*events, moved], first=10)) is SealFault.BAD_SIGNATURE


def test_a_decision_sealed_before_it_named_its_event_holds_only_at_its_own_turn() -> None:
    """An approval sealed by an earlier release names no event (``after`` 0): it is taken at
    the turn its seal names and at no other."""
    events, after = held_run()
    legacy = decision(after, approved=True, on=0)
    assert history.fold(wire(*events, sealed(legacy)), run_uid=CONFIG.uid, seals=VERIFIER)
    elsewhere = dataclasses.replace(
        legacy, summary=dataclasses.replace(legacy.summary, turn=legacy.summary.turn + 3)
    )
    assert refusal(wire(*events, sealed(elsewhere))) is SealFault.REPLAYED
