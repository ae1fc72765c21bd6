""".ci/pytest-tiers, what `make pytest` runs: the first tier (no Go-built binary) beside the
background builds, then the control plane's, the tools' (helm, Prometheus, syft, the nats CLI)
and the node's tiers, each after waiting for its own builds only; the exit status says whether
any tier or build failed, the last line which, and an interrupted run leaves no build behind.

The tier logic is driven with a stand-in virtualenv ``bin/`` (``pytest``, ``agentrun`` and
``python`` scripts that record their arguments and exit as told); the build order of
``agentrun dev binaries`` with builders that record their calls; which tests each tier selects
is checked by collecting real test files with the script's own marker expressions.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agentrun_dev import binaries, cli, dist, helm, prometheus

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "pytest-tiers"

FAKE_PYTEST = """#!/bin/sh
echo "pytest $*" >> "$CALLS"
case "$*" in
  *"-m not e2e "*) exit "${FIRST_RC:-0}";;
  *") and alone"*) exit "${ALONE_RC:-0}";;
  *"-m (not (not e2e "*) exit "${SECOND_RC:-0}";;
  *"-m toolbinaries "*)
    echo "the third tier's own output"
    if [ -n "${THIRD_SLEEP:-}" ]; then echo $$ > "$CALLS.third-pid"; exec sleep "$THIRD_SLEEP"; fi
    exit "${THIRD_RC:-0}";;
  *"-m node or"*) exit "${FOURTH_RC:-0}";;
  *) echo "unknown tier: $*" >&2; exit 99;;
esac
"""
FAKE_AGENTRUN = """#!/bin/sh
if [ "$(nice)" -gt "$NICE_BASE" ]; then
  echo "background agentrun $*" >> "$CALLS"
  echo "building something" >&2
  echo $$ > "$CALLS.build-pid"
  if [ -n "${BUILD_SLEEP:-}" ]; then exec sleep "$BUILD_SLEEP"; fi
  exit "${BUILD_RC:-0}"
fi
echo "agentrun $*" >> "$CALLS"
case "$*" in
  *--control-plane) exit "${CONTROL_PLANE_WAIT_RC:-0}";;
  *--tools) exit "${TOOLS_WAIT_RC:-0}";;
  *--all) exit "${ALL_WAIT_RC:-0}";;
esac
exit 99
"""
FAKE_PYTHON = """#!/bin/sh
echo "background python $*" >> "$CALLS"
exit "${LLAMA_RC:-0}"
"""


def tier(name: str) -> str:
    """The marker expression of the script's `name` tier (``first``, ``second``, ``third``,
    ``last``), as bash expands its assignment."""
    assignments = re.findall(r"^(?:first|second|third|last)_tier=.*$", SCRIPT.read_text(), re.M)
    assert len(assignments) == 4
    script = "\n".join([*assignments, f'printf %s "${name}_tier"'])
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert done.stdout
    return done.stdout


def venv_bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("pytest", FAKE_PYTEST), ("agentrun", FAKE_AGENTRUN)):
        (bin_dir / name).write_text(text)
    (bin_dir / "python").write_text(FAKE_PYTHON)
    for script in bin_dir.iterdir():
        script.chmod(0o755)
    return bin_dir


def tiers(
    tmp_path: Path, *args: str, **rcs: str
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the script on the stand-in bin/ with pytest options `args` (default
    ``--durations=30``, as `make pytest`) and `rcs` (FIRST_RC, SECOND_RC, ALONE_RC, THIRD_RC,
    FOURTH_RC; CONTROL_PLANE_WAIT_RC, TOOLS_WAIT_RC, ALL_WAIT_RC; BUILD_RC, LLAMA_RC);
    returns its result and the recorded calls, in the order they were made (the third tier's
    runs beside the fourth's wait for its build: its place among them is not fixed)."""
    calls = tmp_path / "calls"
    env = {**os.environ, "CALLS": str(calls), "NICE_BASE": str(os.nice(0)), **rcs}
    done = subprocess.run(
        [str(SCRIPT), str(venv_bin(tmp_path)), *(args or ("--durations=30",))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, calls.read_text().splitlines()


def test_the_four_tiers_run_around_the_background_builds_and_all_passing_is_0(
    tmp_path: Path,
) -> None:
    done, calls = tiers(tmp_path)

    assert done.returncode == 0, done.stdout + done.stderr
    third = f"pytest --durations=30 -n 1 --dist loadfile --no-loadscope-reorder -m {tier('third')}"
    assert calls.count(third) == 1
    assert calls.index(third) > calls.index("agentrun dev binaries --tools")
    foreground = [c for c in calls if not c.startswith("background ") and c != third]
    assert foreground == [
        f"pytest --durations=30 -n 2 --dist loadfile --no-loadscope-reorder -m {tier('first')}",
        "agentrun dev binaries --control-plane",  # the second tier waits for nothing else
        "pytest --durations=30 -n 2 --dist loadfile --no-loadscope-reorder"
        f" -m ({tier('second')}) and not alone",
        f"pytest --durations=30 -m ({tier('second')}) and alone",
        "agentrun dev binaries --tools",  # the third tier starts beside the fourth then
        "agentrun dev binaries --all",
        f"pytest --durations=30 -m {tier('last')}",
    ]
    # its output comes after the fourth tier's, in one piece
    out = done.stdout
    assert out.index("fourth tier done") < out.index("the third tier's own output")
    assert (tmp_path / "venv" / "tier3.log").read_text() == "the third tier's own output\n"
    background = [c for c in calls if c.startswith("background ")]
    assert background == [
        "background agentrun dev binaries --all",
        "background python -m agentrun_dev.llamaserver",
    ]
    assert "building something" in (tmp_path / "venv" / "builds.log").read_text()
    assert done.stdout.splitlines()[-1] == "every tier passed"


def test_every_tier_but_the_node_s_runs_in_as_many_workers_as_asked(tmp_path: Path) -> None:
    """The third runs beside the fourth (one process), so in one worker fewer."""
    done, calls = tiers(tmp_path, TEST_WORKERS="3")

    assert done.returncode == 0, done.stdout + done.stderr
    endings = {
        "first": f"-m {tier('first')}",
        "second": f"-m ({tier('second')}) and not alone",
        "alone": f"-m ({tier('second')}) and alone",
        "third": f"-m {tier('third')}",
        "last": f"-m {tier('last')}",
    }
    workers = {
        name: [_workers(c) for c in calls if c.endswith(end)] for name, end in endings.items()
    }
    assert workers == {"first": [3], "second": [3], "alone": [None], "third": [2], "last": [None]}


def _workers(call: str) -> int | None:
    """The ``-n`` of a recorded pytest call (``None``: not parallel)."""
    found = re.search(r" -n (\d+) ", call)
    return int(found.group(1)) if found else None


@pytest.mark.parametrize(
    ("failing", "named"),
    [
        ("FIRST_RC", "tier 1 (no Go-built binary)"),
        ("SECOND_RC", "tier 2 (control plane, e2e)"),
        ("ALONE_RC", "tier 2's load tests (alone)"),
        ("THIRD_RC", "tier 3 (helm, Prometheus, syft, nats CLI)"),
        ("FOURTH_RC", "tier 4 (node, realmodel)"),
    ],
)
def test_a_failing_tier_fails_the_run_names_it_last_and_the_other_tiers_still_run(
    tmp_path: Path, failing: str, named: str
) -> None:
    done, calls = tiers(tmp_path, **{failing: "1"})

    assert done.returncode == 1
    assert sum(c.startswith("pytest ") for c in calls) == 5
    assert done.stdout.splitlines()[-1] == (
        f"FAILED: {named} (each tier prints its own summary above)"
    )


def test_a_tier_with_no_test_passes_only_under_a_path_filter(tmp_path: Path) -> None:
    """pytest exits 5 when it selects nothing: under a path filter (``make pytest`` on one
    directory) a tier may well have none of its tests, without one an empty tier is a marker
    mistake."""
    done, calls = tiers(tmp_path, "tests/bus", ALONE_RC="5", FOURTH_RC="5")
    assert done.returncode == 0, done.stdout + done.stderr
    # the background builds start at once and may record their call first
    foreground = [c for c in calls if not c.startswith("background ")]
    assert foreground[0].startswith("pytest tests/bus -n 2 ")

    done, _ = tiers(tmp_path / "unfiltered", ALONE_RC="5")
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1] == (
        "FAILED: tier 2's load tests (alone) (each tier prints its own summary above)"
    )


@pytest.mark.parametrize(
    ("failing", "named"),
    [
        ("CONTROL_PLANE_WAIT_RC", "the control plane's build"),
        ("TOOLS_WAIT_RC", "the tools' build"),
        ("ALL_WAIT_RC", "the node's build"),
    ],
)
def test_a_failed_wait_for_a_tier_s_builds_fails_the_run_and_names_the_build(
    tmp_path: Path, failing: str, named: str
) -> None:
    done, calls = tiers(tmp_path, **{failing: "1"})

    assert done.returncode == 1
    assert sum(c.startswith("pytest ") for c in calls) == 5  # its tier still runs, and fails
    assert done.stdout.splitlines()[-1] == (
        f"FAILED: {named} (each tier prints its own summary above)"
    )


def test_every_test_is_in_exactly_one_tier_by_its_markers() -> None:
    """The four expressions split every combination of the markers the tiers read."""
    markers = ("e2e", "node", "nodebinaries", "realmodel", "binaries", "toolbinaries")
    expressions = [tier(name) for name in ("first", "second", "third", "last")]
    for bits in range(2 ** len(markers)):
        marked = {m for i, m in enumerate(markers) if bits >> i & 1}
        chosen = [e for e in expressions if eval(e, {}, {m: m in marked for m in markers})]
        assert len(chosen) == 1, (marked, chosen)
    first, _, third, last = expressions
    assert eval(first, {}, dict.fromkeys(markers, False))
    tools = {m: m == "toolbinaries" for m in markers}
    assert eval(third, {}, tools)
    assert eval(last, {}, {**tools, "node": True})


def test_modules_marked_long_are_collected_first_each_module_whole() -> None:
    """The control plane's tiers hand a module at a time to each worker in collection order
    (``--no-loadscope-reorder``): the modules of minutes come first, so none starts last."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/e2e/test_runs.py", "tests/e2e/test_delivery.py",
         "tests/natsfaults/test_server_faults.py", "tests/e2e/test_big_tenant.py"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    modules = [line.split("::")[0] for line in done.stdout.splitlines() if "::" in line]
    order = list(dict.fromkeys(modules))
    assert order == [
        "tests/e2e/test_delivery.py",  # long ones first, in the order given
        "tests/natsfaults/test_server_faults.py",
        "tests/e2e/test_runs.py",  # then the others, in the order given
        "tests/e2e/test_big_tenant.py",  # alone (its own run), not long
    ], order
    assert modules == sorted(modules, key=order.index)  # each module's tests together


def test_a_listing_builds_nothing_and_waits_for_no_build(tmp_path: Path) -> None:
    """``--collect-only`` of tests that need the control plane, the node and the tools, with
    an empty binary cache: it lists them at once and builds nothing (a listing that waited
    for a build held by another process timed out in the first tier of a cold machine)."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("KUBEBUILDER_ASSETS", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "tests/e2e/test_runs.py", "tests/cluster/test_helm_install.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "tests/cluster/test_helm_install.py::" in done.stdout
    assert "agentrun devenv:" not in done.stdout + done.stderr
    assert not (tmp_path / "cache").exists()


class RecordedBuilds:
    """Stand-ins for the builders ``agentrun dev binaries`` calls: each records its name and
    returns paths under ``/built``, so the order of the builds is seen without building."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        built = Path("/built")
        control_plane = binaries.Binaries(
            built / "etcd", built / "kube-apiserver", built / "kubectl"
        )
        node = binaries.NodeBinaries(
            *(built / n for n in (*binaries.NODE_NAMES, "coredns", "kube-router"))
        )
        tools = prometheus.PrometheusBinaries(built / "prometheus", built / "promtool")
        for module, name, result in (
            (binaries, "ensure_binaries", control_plane),
            (binaries, "ensure_node_binaries", (control_plane, node)),
            (binaries, "ensure_natscli", built / "nats"),
            (helm, "ensure_helm", built / "helm"),
            (prometheus, "ensure_prometheus", tools),
            (dist, "syft_binary", built / "syft"),
        ):
            monkeypatch.setattr(module, name, self._recorder(name, result))

    def _recorder(self, name: str, result: object) -> object:
        def build(**_: object) -> object:
            self.calls.append(name)
            return result

        return build


@pytest.mark.parametrize(
    ("option", "builds", "listed"),
    [
        (
            "all",
            ["ensure_binaries", "ensure_helm", "ensure_prometheus", "syft_binary",
             "ensure_natscli", "ensure_node_binaries"],
            ["etcd", "kube-apiserver", "kubectl", "helm", "prometheus", "promtool", "syft",
             "nats", *binaries.NODE_NAMES, "coredns", "kube-router"],
        ),
        ("control_plane", ["ensure_binaries"], ["etcd", "kube-apiserver", "kubectl"]),
        (
            "tools",
            ["ensure_helm", "ensure_prometheus", "syft_binary", "ensure_natscli"],
            ["helm", "prometheus", "promtool", "syft", "nats"],
        ),
        (
            "node",
            ["ensure_node_binaries", "ensure_binaries", "ensure_natscli"],
            ["etcd", "kube-apiserver", "kubectl", "nats", *binaries.NODE_NAMES, "coredns",
             "kube-router"],
        ),
        (
            None,
            ["ensure_binaries", "ensure_natscli"],
            ["etcd", "kube-apiserver", "kubectl", "nats"],
        ),
    ],
)  # fmt: skip
def test_binaries_builds_the_control_plane_first_then_the_tools_then_the_node(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    option: str | None,
    builds: list[str],
    listed: list[str],
) -> None:
    """What the background build does first is what the second tier waits for: the control
    plane alone (``--control-plane``); the tools' tier waits for ``--tools``, which builds
    no kubernetes binary."""
    recorded = RecordedBuilds(monkeypatch)
    flags = dict.fromkeys(("control_plane", "tools", "node", "all"), False)
    if option is not None:
        flags[option] = True

    assert cli.cmd_dev_binaries(argparse.Namespace(**flags)) == 0

    assert recorded.calls == builds
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == listed


def test_binaries_takes_one_set_at_a_time() -> None:
    """``--control-plane``, ``--tools``, ``--node`` and ``--all`` exclude each other."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "agentrun"), "dev", "binaries", "--tools", "--all"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "not allowed with argument" in done.stderr


@pytest.mark.parametrize(
    ("lookup", "fixture"),
    [
        (lambda: helm.ensure_helm(), "helm_binary"),
        (lambda: prometheus.ensure_prometheus(), "prometheus_binaries"),
        (lambda: binaries.ensure_natscli(), "natscli_binary"),
        (lambda: dist.syft_binary(), "syft_binary"),
    ],
    ids=["helm", "prometheus", "natscli", "syft"],
)
def test_a_test_outside_the_tools_tier_reaching_a_tool_fails_naming_its_fixture(
    lookup: Callable[[], object], fixture: str
) -> None:
    """tests/conftest.py: the tool is there on this machine, yet a cold one would build it
    while this test's tier waits for nothing but the control plane."""
    with pytest.raises(pytest.fail.Exception, match=f"without the {fixture} fixture"):
        lookup()


def test_a_failed_background_build_fails_the_run_shows_its_log_and_skips_the_llama_build(
    tmp_path: Path,
) -> None:
    done, calls = tiers(tmp_path, BUILD_RC="3")

    assert done.returncode == 1
    assert "a background build failed" in done.stdout
    assert "building something" in done.stdout
    assert not any("llamaserver" in c for c in calls)
    assert sum(c.startswith("pytest ") for c in calls) == 5
    assert done.stdout.splitlines()[-1] == (
        "FAILED: a background build (each tier prints its own summary above)"
    )


def test_a_failed_llama_build_fails_the_run(tmp_path: Path) -> None:
    done, _ = tiers(tmp_path, LLAMA_RC="1")

    assert done.returncode == 1
    assert "a background build failed" in done.stdout


def test_an_interrupted_run_stops_the_background_build_and_the_third_tier(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "CALLS": str(calls),
        "NICE_BASE": str(os.nice(0)),
        "BUILD_SLEEP": "120",
        "THIRD_SLEEP": "120",
    }
    script = subprocess.Popen(
        [str(SCRIPT), str(venv_bin(tmp_path))],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        build, third = (_pid_in(Path(f"{calls}.{name}-pid")) for name in ("build", "third"))
        script.send_signal(signal.SIGTERM)
        assert script.wait(timeout=30) == 130
    finally:
        if script.poll() is None:
            script.kill()
    deadline = time.monotonic() + 10
    for pid, what in ((build, "the background build"), (third, "the third tier")):
        while _alive(pid):
            assert time.monotonic() < deadline, f"{what} ({pid}) outlived the run"
            time.sleep(0.05)


def _pid_in(pid_file: Path) -> int:
    """The pid a stand-in wrote to ``pid_file`` once it started (waited for up to 30 s)."""
    deadline = time.monotonic() + 30
    while not (pid_file.is_file() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline, f"nothing wrote {pid_file.name}"
        time.sleep(0.05)
    return int(pid_file.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _collected(marker: str, *files: str) -> set[str]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker,
            *files,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: none selected
    return {line for line in done.stdout.splitlines() if "::" in line}


def _tiers_of(*files: str) -> list[set[str]]:
    """The tests of `files` each tier selects, checked to split them: [first, …, last]."""
    chosen = [_collected(tier(name), *files) for name in ("first", "second", "third", "last")]
    every = _collected("", *files)
    assert sum(len(tests) for tests in chosen) == len(every)
    assert set().union(*chosen) == every
    return chosen


@pytest.mark.binaries  # collecting the control plane's tests builds (or waits for) it
def test_the_first_tier_holds_no_test_that_needs_a_go_built_binary() -> None:
    files = ("tests/devenv/test_controlplane.py", "tests/devenv/test_binaries.py")
    first, second, third, last = _tiers_of(*files)

    # the control plane through a fixture, directly (control_plane) or not (kubectl)
    every = first | second | third | last
    in_controlplane = {t for t in every if t.startswith("tests/devenv/test_controlplane.py")}
    assert in_controlplane and in_controlplane <= second
    # marked by hand: they build, or wait for, the kubernetes binaries themselves
    assert (
        "tests/devenv/test_binaries.py::"
        "test_two_concurrent_callers_share_one_build_into_an_empty_cache"
    ) in second
    # the node's binaries: after the node's build, which goes on beside the second tier
    assert (
        "tests/devenv/test_binaries.py::"
        "test_the_node_s_network_policy_enforcer_is_the_pinned_kube_router"
    ) in last
    # the nats CLI by its fixture: after the tools' build
    assert (
        "tests/devenv/test_binaries.py::test_the_nats_cli_is_the_pinned_natscli_built_static"
        in (third)
    )
    pure = "tests/devenv/test_binaries.py::test_the_etcd_pin_is_read_from_build_dependencies_yaml"
    assert pure in first


@pytest.mark.binaries  # collecting them builds (or waits for) the control plane and the tools
@pytest.mark.toolbinaries
def test_the_tests_using_helm_prometheus_syft_or_the_nats_cli_wait_only_for_those() -> None:
    """Offline or on the control plane, e2e or not: a test reaching one of the tools is in the
    third tier (after their build), never in the control plane's (which does not wait for
    them); the other tests of the same files stay where they were."""
    chart, install, store_loss, metrics, release = (
        "tests/chart/test_render.py",  # offline helm
        "tests/chart/test_install.py",  # helm on the control plane
        "tests/e2e/test_nats_store_loss.py",  # the nats CLI in two of its e2e tests
        "tests/devenv/test_prometheus.py",  # prometheus, promtool; pure tests too
        "tests/image/test_make_release.py",  # helm, the nats CLI (NATS image) and syft
    )
    first, second, third, last = _tiers_of(chart, install, store_loss, metrics, release)

    assert not last
    in_third = {t.split("::")[0] for t in third}
    assert in_third == {chart, install, store_loss, metrics, release}
    assert {t.split("::")[0] for t in second} == {store_loss}
    assert (
        f"{store_loss}::test_a_nats_restart_with_its_store_intact_is_not_taken_for_a_lost_store"
        in (second)
    )
    assert {t.split("::")[0] for t in first} == {chart, metrics}  # their pure tests
    assert f"{metrics}::test_the_config_has_one_static_job_per_target_group" in first
    assert f"{metrics}::test_two_concurrent_callers_share_one_build_into_an_empty_cache" in third
