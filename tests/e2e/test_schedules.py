"""CronAgentRuns with kubectl against the real API server and operator: seconds-granular
schedules fire, concurrency policies skip or replace, history limits delete old runs, and an
operator restart neither doubles a run nor skips beyond the starting deadline."""

from __future__ import annotations

import copy
import datetime
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from agentrun_dev import components, stack

from . import argocd_health, test_argocd_health
from .conftest import E2EStack, apply_tenant
from .test_tenants import append_scenario

pytestmark = pytest.mark.e2e

QUICK = "E2E-CRON-QUICK"
SLOW = "E2E-CRON-SLOW"
CRON_LABEL = "agentrun.dev/cronagentrun"
SCHEDULED = "agentrun.dev/scheduled-time"


@pytest.fixture(scope="module", autouse=True)
def scenarios(e2e: E2EStack) -> None:
    append_scenario(
        e2e,
        {
            "name": "cron-quick",
            "match": {"goal": QUICK},
            "turns": [
                {"content": "Report done.", "usage": {"prompt_tokens": 20, "completion_tokens": 3}}
            ],
        },
    )
    append_scenario(
        e2e,
        {
            "name": "cron-slow",
            "match": {"goal": SLOW},
            "turns": [{"content": "too late", "latency_ms": 60000}],
        },
    )


@pytest.fixture(autouse=True)
def no_runs_left(stack_: E2EStack, test_namespace: str) -> Iterator[None]:
    """After each test: its CronAgentRuns deleted and their unfinished runs cancelled and
    ended, so no run of theirs ends (or holds a worker) during a later test."""
    yield
    ns = test_namespace
    stack_.kubectl("delete", "cronagentruns", "--all", "-n", ns, "--wait=false")
    listed = stack_.kubectl("get", "agentruns", "-n", ns, "-l", CRON_LABEL, "-o", "json").stdout
    for run in json.loads(listed)["items"]:
        if not (run.get("status") or {}).get("terminalReason"):
            name = run["metadata"]["name"]
            stack_.kubectl("annotate", "agentrun", name, "-n", ns, "agentrun.dev/cancel=true")
            stack_.wait_terminal(ns, name)


def cron_manifest(name: str, goal: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schedule": "*/2 * * * * *",
        "runTemplate": {
            "metadata": {"labels": {"team": "reports"}},
            "spec": {"model": "mock", "goal": goal, "tools": ["calculate"]},
        },
    }
    body.update(spec)
    return {
        "apiVersion": "agentrun.dev/v1alpha1",
        "kind": "CronAgentRun",
        "metadata": {"name": name},
        "spec": body,
    }


def epoch(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def get_cron(stack_: E2EStack, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(
        stack_.kubectl("get", "cronagentrun", name, "-n", namespace, "-o", "json").stdout
    )
    return found


def runs_of(stack_: E2EStack, namespace: str, cron: str) -> list[dict[str, Any]]:
    """The AgentRuns labelled for ``cron``, oldest schedule time first."""
    listed = stack_.kubectl(
        "get", "agentruns", "-n", namespace, "-l", f"{CRON_LABEL}={cron}", "-o", "json"
    ).stdout
    items: list[dict[str, Any]] = json.loads(listed)["items"]
    return sorted(items, key=lambda r: epoch(r["metadata"]["annotations"][SCHEDULED]))


def scheduled(run: dict[str, Any]) -> int:
    return int(epoch(run["metadata"]["annotations"][SCHEDULED]))


def wait_until(
    what: str, check: Callable[[], Any], *, timeout: float = 60, every: float = 0.5
) -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout}s")


def events_of(stack_: E2EStack, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = stack_.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.kind=CronAgentRun,involvedObject.name={name}",
        "-o",
        "json",
    ).stdout
    items: list[dict[str, Any]] = json.loads(listed)["items"]
    return items


def reasons(stack_: E2EStack, namespace: str, name: str) -> set[str]:
    return {e["reason"] for e in events_of(stack_, namespace, name)}


def test_a_seconds_schedule_fires_owned_runs_and_history_limits_keep_the_newest(
    stack_: E2EStack, test_namespace: str
) -> None:
    ns = test_namespace
    stack_.apply(ns, cron_manifest("report", QUICK, successfulRunsHistoryLimit=2))
    cron = get_cron(stack_, ns, "report")
    uid = cron["metadata"]["uid"]

    def pruned_after_four() -> bool:
        status = get_cron(stack_, ns, "report").get("status") or {}
        return "SuccessfulDelete" in reasons(stack_, ns, "report") and bool(
            status.get("lastSuccessfulTime")
        )

    wait_until("runs created, succeeded and the oldest deleted", pruned_after_four, timeout=90)
    stack_.kubectl(
        "patch",
        "cronagentrun",
        "report",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"suspend":true}}',
    )
    wait_until(
        "suspended",
        lambda: (
            {c["reason"] for c in get_cron(stack_, ns, "report")["status"]["conditions"]}
            == {"Suspended"}
        ),
    )
    suspended_at = time.time()  # the operator has taken the suspension up by now
    wait_until(
        "the runs left end",
        lambda: all(
            r.get("status", {}).get("terminalReason") for r in runs_of(stack_, ns, "report")
        ),
    )
    # a negative check: a suspended schedule creates nothing more. 3 s is one and a half
    # schedule periods; a run it created would be the newest, which the history limit keeps
    time.sleep(3)

    def settled() -> tuple[list[dict[str, Any]], dict[str, Any]] | None:
        """The runs (history limit applied) and the schedule's status once it has caught up
        with their ends: the status follows the runs' own, so it is read after them."""
        found = runs_of(stack_, ns, "report")
        status = get_cron(stack_, ns, "report").get("status") or {}
        caught_up = bool(found) and (
            status.get("lastScheduleTime") == found[-1]["metadata"]["annotations"][SCHEDULED]
            and status.get("activeRuns") == 0
        )
        return (found, status) if len(found) <= 2 and caught_up else None

    runs, status = wait_until("history limit applied, status caught up", settled, timeout=30)
    assert all(scheduled(r) <= suspended_at for r in runs), "a suspended schedule created a run"
    assert {r["status"]["terminalReason"] for r in runs} == {"completed"}
    for run in runs:
        meta = run["metadata"]
        at = scheduled(run)
        assert at % 2 == 0 and meta["name"] == f"report-{at}"
        assert meta["labels"] == {"team": "reports", CRON_LABEL: "report"}
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "agentrun.dev/v1alpha1",
                "kind": "CronAgentRun",
                "name": "report",
                "uid": uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        spec = run["spec"]
        assert (spec["model"], spec["goal"], spec["tools"]) == ("mock", QUICK, ["calculate"])
    assert epoch(status["lastSuccessfulTime"]) >= scheduled(runs[-1])
    assert "active" not in status and status["activeRuns"] == 0
    assert status["observedGeneration"] == get_cron(stack_, ns, "report")["metadata"]["generation"]
    assert {"SuccessfulCreate", "SuccessfulDelete"} <= reasons(stack_, ns, "report")
    table = stack_.kubectl("get", "cronagentrun", "report", "-n", ns).stdout.splitlines()
    assert table[0].split() == [
        "NAME",
        "SCHEDULE",
        "TIMEZONE",
        "SUSPEND",
        "ACTIVE",
        "LAST",
        "SCHEDULE",
        "READY",
        "REASON",
        "AGE",
    ]
    assert table[1].split()[-3:-1] == ["True", "Suspended"]
    assert table[1].split()[:6] == ["report", "*/2", "*", "*", "*", "*"]


def test_forbid_skips_while_a_run_runs_and_replace_cancels_it(
    stack_: E2EStack, test_namespace: str
) -> None:
    ns = test_namespace
    stack_.apply(ns, cron_manifest("forbid", SLOW, concurrencyPolicy="Forbid"))
    stack_.apply(
        ns, cron_manifest("replace", SLOW, schedule="*/3 * * * * *", concurrencyPolicy="Replace")
    )
    wait_until(
        "a Forbid skip", lambda: "RunAlreadyActive" in reasons(stack_, ns, "forbid"), timeout=60
    )
    # a negative check: two more schedule times (every 2 s) pass while the first run still
    # runs (its model call takes 60 s); Forbid creates nothing for them
    time.sleep(4)
    forbid_runs = runs_of(stack_, ns, "forbid")
    assert len(forbid_runs) == 1 and not forbid_runs[0].get("status", {}).get("terminalReason")
    active = get_cron(stack_, ns, "forbid")["status"]["active"]
    assert [a["name"] for a in active] == [forbid_runs[0]["metadata"]["name"]]

    replaced = wait_until(
        "a replaced run ends cancelled",
        lambda: [
            r
            for r in runs_of(stack_, ns, "replace")
            if r.get("status", {}).get("terminalReason") == "cancelled"
        ],
        timeout=60,
    )
    # the operator queues its Events and posts them one at a time, so one may show after
    # the state it speaks of: poll for it
    wait_until("a ReplacedRun event", lambda: "ReplacedRun" in reasons(stack_, ns, "replace"))
    newer = [r for r in runs_of(stack_, ns, "replace") if scheduled(r) > scheduled(replaced[0])]
    assert newer, "the replacing run was created"
    stack_.kubectl("delete", "cronagentrun", "forbid", "replace", "-n", ns)


def test_an_operator_restart_neither_doubles_nor_skips_beyond_the_deadline(
    stack_: E2EStack, test_namespace: str
) -> None:
    ns = test_namespace
    deadline, every = 3, 4
    stack_.apply(
        ns,
        cron_manifest(
            "steady",
            QUICK,
            schedule=f"*/{every} * * * * *",
            startingDeadlineSeconds=deadline,
            successfulRunsHistoryLimit=100,
        ),
    )
    wait_until("two runs", lambda: len(runs_of(stack_, ns, "steady")) >= 2, timeout=60)
    components.kill_component(stack_.operator)
    killed = time.time()
    time.sleep(6)  # schedule times pass with no operator
    stack_.operator = stack.start_operator(stack_.env, launch=stack_.launch)
    wait_until(
        "three runs after the restart",
        lambda: sum(scheduled(r) > killed + 6 for r in runs_of(stack_, ns, "steady")) >= 3,
        timeout=90,
    )
    stack_.kubectl(
        "patch",
        "cronagentrun",
        "steady",
        "-n",
        ns,
        "--type=merge",
        "-p",
        '{"spec":{"suspend":true}}',
    )
    runs = runs_of(stack_, ns, "steady")
    times = [scheduled(r) for r in runs]
    assert len(times) == len(set(times)) and all(t % every == 0 for t in times)
    for run in runs:  # every run started within the deadline of its schedule time
        created = epoch(run["metadata"]["creationTimestamp"])
        assert created - scheduled(run) <= deadline + 1, run["metadata"]["name"]
    before = [t for t in times if t <= killed]
    after = [t for t in times if t > killed]
    # consecutive while an operator ran: no time skipped, none doubled
    assert before == list(range(before[0], before[-1] + 1, every))
    restarted = after[0]
    assert after == list(range(restarted, after[-1] + 1, every))
    # the gap is the operator's absence only: the first time after it is at most the
    # deadline older than the restarted operator's first look
    assert restarted >= killed + 6 - deadline - every


def test_a_tenant_ttl_of_zero_deletes_each_run_once_the_schedule_counted_it(
    stack_: E2EStack, test_namespace: str
) -> None:
    """Its tenant's ``ttlSecondsAfterFinished: 0`` deleted each run as it ended, before the
    schedule listed it: lastSuccessfulTime was never set, however many runs succeeded."""
    ns = test_namespace
    apply_tenant(stack_, f"ttl0-{ns}", ns, budget={"tokens": 1_000_000}, ttlSecondsAfterFinished=0)
    try:
        stack_.wait_tenant_observed(f"ttl0-{ns}")
        stack_.apply(ns, cron_manifest("counted", QUICK, concurrencyPolicy="Forbid"))
        found = wait_until(
            "a last success",
            lambda: (get_cron(stack_, ns, "counted").get("status") or {}).get("lastSuccessfulTime"),
        )
        assert epoch(found) > 0
        ended = {
            r["metadata"]["name"]
            for r in runs_of(stack_, ns, "counted")
            if (r.get("status") or {}).get("terminalReason")
        }
        wait_until(  # counted: released, and deleted by their TTL of 0
            "the counted runs deleted",
            lambda: not ended & {r["metadata"]["name"] for r in runs_of(stack_, ns, "counted")},
            timeout=20,
        )
    finally:
        stack_.kubectl("delete", "agenttenant", f"ttl0-{ns}", "--wait=false")


def test_the_api_server_checks_the_run_template_as_an_agentrun_naming_the_field(
    stack_: E2EStack, test_namespace: str
) -> None:
    def refusal(manifest: dict[str, Any]) -> str:
        body = json.dumps(manifest)
        result = stack_.kubectl("apply", "-n", test_namespace, "-f", "-", input=body, check=False)
        assert result.returncode != 0, result.stdout
        return str(result.stderr)

    no_goal = cron_manifest("no-goal", QUICK)
    del no_goal["spec"]["runTemplate"]["spec"]["goal"]
    assert "spec.runTemplate.spec.goal: Required value" in refusal(no_goal)
    both = cron_manifest("both", QUICK)
    both["spec"]["runTemplate"]["spec"]["agentRef"] = {"name": "calc"}
    assert "spec.runTemplate.spec.model" in refusal(both)
    negative = cron_manifest("negative", QUICK)
    negative["spec"]["runTemplate"]["spec"]["budget"] = {"maxSteps": 0}
    assert "spec.runTemplate.spec.budget.maxSteps" in refusal(negative)
    assert "at most 52 characters" in refusal(cron_manifest("n" * 53, QUICK))
    assert "spec.concurrencyPolicy" in refusal(cron_manifest("p", QUICK, concurrencyPolicy="Once"))
    kept = cron_manifest("h", QUICK, failedRunsHistoryLimit=1001)
    assert "spec.failedRunsHistoryLimit: Invalid value" in refusal(kept)


@pytest.mark.parametrize(
    ("spec", "reason", "field"),
    [
        pytest.param({"timeZone": "Mars/Olympus"}, "InvalidTimeZone", "spec.timeZone", id="zone"),
        pytest.param({"schedule": "61 * * * *"}, "InvalidSchedule", "spec.schedule", id="cron"),
    ],
)
def test_an_unusable_schedule_is_not_ready_with_the_reason_and_creates_nothing(
    stack_: E2EStack, test_namespace: str, spec: dict[str, Any], reason: str, field: str
) -> None:
    ns = test_namespace
    stack_.apply(ns, cron_manifest("broken", QUICK, **spec))

    def ready() -> dict[str, Any] | None:
        status = get_cron(stack_, ns, "broken").get("status") or {}
        found = {c["type"]: c for c in status.get("conditions") or []}.get("Ready")
        return found if found and found["status"] == "False" else None

    condition = wait_until("not Ready", ready)
    assert condition["reason"] == reason and condition["message"].startswith(f"{field}: ")
    # its Event is queued before the status is written, and posted after it may show
    wait_until(f"a {reason} event", lambda: reason in reasons(stack_, ns, "broken"))
    time.sleep(2.5)  # a negative check: past the next time of the 2 s schedule, still no run
    assert runs_of(stack_, ns, "broken") == []


def test_argo_cd_health_of_live_cronagentruns(stack_: E2EStack, test_namespace: str) -> None:
    """The CronAgentRun health.lua on live objects; ``AGENTRUN_WRITE_ARGOCD_TESTDATA=1``
    rewrites its testdata/ and health_test.yaml from them."""
    ns = test_namespace
    samples = argocd_health.Samples(ns)

    def sample(case: str, obj: dict[str, Any], expected: str) -> dict[str, str]:
        return samples.check("CronAgentRun", case, obj, expected)

    def checked(name: str) -> dict[str, Any]:
        def read() -> dict[str, Any] | None:
            obj = test_argocd_health.get(stack_, "cronagentrun", name, ns)
            done = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"][
                "generation"
            ]
            return obj if done else None

        found: dict[str, Any] = wait_until(f"{name} read by the operator", read)
        return found

    stack_.apply(
        ns, cron_manifest("nightly", QUICK, schedule="0 2 * * *", timeZone="Europe/Berlin")
    )
    healthy = checked("nightly")
    found = sample("scheduled", healthy, "Healthy")
    assert found["message"].startswith("0 2 * * * (Europe/Berlin): next run at ")
    unread = copy.deepcopy(healthy)
    unread["metadata"]["generation"] += 1  # edited, not yet read by the operator
    sample("not-observed", unread, "Progressing")
    stack_.apply(
        ns,
        cron_manifest(
            "nightly", QUICK, schedule="0 2 * * *", timeZone="Europe/Berlin", suspend=True
        ),
    )
    sample("suspended", checked("nightly"), "Suspended")
    stack_.apply(ns, cron_manifest("elsewhere", QUICK, timeZone="Mars/Olympus"))
    found = sample("invalid-time-zone", checked("elsewhere"), "Degraded")
    assert found["message"].startswith("spec.timeZone: 'Mars/Olympus' is not a time zone")
    samples.write()
