"""``agentrun dev up / status / env / down``, run as a user would, against real processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.js.errors
import pytest

from agentrun.cli import main as agentrun_cli
from agentrun.natsclient import NatsAuth, connect_options
from agentrun_dev import cli as dev_cli
from agentrun_dev import controlplane, procs, stack, state

REPO = Path(__file__).resolve().parents[2]


def agentrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run the installed ``agentrun`` console script from the repo root."""
    return subprocess.run(
        [str(stack.script_path("agentrun")), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def existing_cluster() -> bool:
    return controlplane.existing_cluster_requested()


def exported(env_output: str) -> dict[str, str]:
    """``export A=b`` lines as a dict."""
    pairs = (shlex.split(line.removeprefix("export "))[0] for line in env_output.splitlines())
    return dict(pair.split("=", 1) for pair in pairs)


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    """A state directory; whatever a test leaves up in it is brought down afterwards."""
    directory = tmp_path / "dev"
    yield directory
    if state.load_state(directory) is not None:
        agentrun("dev", "down", "--dir", str(directory))


def test_without_a_subcommand_the_usage_is_printed() -> None:
    assert agentrun_cli.main(["dev"]) == 2


def test_the_runtime_cli_finds_agentrun_dev_through_its_entry_point() -> None:
    assert agentrun_cli.plugin_registrars()["dev"] is dev_cli.register_dev


def test_without_agentrun_dev_the_dev_command_says_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(agentrun_cli, "plugin_registrars", dict)

    assert agentrun_cli.main(["dev", "up", "--workers", "1"]) == 1
    assert "install agentrun-dev" in capsys.readouterr().err
    with pytest.raises(SystemExit) as help_exit:  # the runtime's own commands stay
        agentrun_cli.main(["cancel", "--help"])
    assert help_exit.value.code == 0


def test_status_and_env_say_when_nothing_is_up(tmp_path: Path) -> None:
    assert agentrun_cli.main(["dev", "status", "--dir", str(tmp_path)]) == 1
    assert agentrun_cli.main(["dev", "env", "--dir", str(tmp_path)]) == 1
    assert agentrun_cli.main(["dev", "down", "--dir", str(tmp_path)]) == 0


def test_env_outside_the_checkout_says_where_to_run_it_or_how_to_start_a_stack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(state.DIR_ENV, raising=False)
    assert agentrun_cli.main(["dev", "env"]) == 1
    assert capsys.readouterr().err == (
        f"agentrun: error: not up (no state in {tmp_path.resolve() / state.DEFAULT_DIR}): run "
        "this from the checkout whose `make demo` started the stack (or pass --dir or set "
        "$AGENTRUN_DEV_DIR to its .agentrun/dev), or start one here with `make demo`\n"
    )


def test_a_missing_scenario_file_fails_before_anything_starts(dev_dir: Path) -> None:
    result = agentrun("dev", "up", "--dir", str(dev_dir), "--scenarios", "nope.yaml")

    assert result.returncode == 1
    assert "scenario file nope.yaml not found" in result.stderr
    assert state.load_state(dev_dir) is None


@pytest.mark.e2e
def test_a_failed_up_stops_what_it_started(dev_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("scenarios: [ {name: x, turns: 12} ]\n")

    result = agentrun("dev", "up", "--dir", str(dev_dir), "--scenarios", str(broken))

    assert result.returncode == 1, result.stderr
    assert "mockllm exited" in result.stderr
    assert "start failed: stopping what was started" in result.stderr
    assert "nats-server (pid" in result.stderr
    assert "etcd (pid" in result.stderr or existing_cluster()
    assert state.load_state(dev_dir) is None
    assert (dev_dir / "logs" / "mockllm.log").is_file()


@pytest.mark.e2e
def test_up_status_env_revive_and_down_round_trip(dev_dir: Path) -> None:
    d = ("--dir", str(dev_dir))
    up = agentrun("dev", "up", "--workers", "1", *d)
    assert up.returncode == 0, up.stderr
    names = ["etcd", "kube-apiserver", "nats-server", "mockllm", "operator", "worker-1"]
    if existing_cluster():
        names = names[2:]
    running = state.load_state(dev_dir)
    assert running is not None and running.complete
    assert [c.name for c in running.components] == names

    status = agentrun("dev", "status", *d)
    assert status.returncode == 0, status.stdout
    assert status.stdout.count(" alive ") == len(names)

    env = exported(agentrun("dev", "env", *d).stdout)
    check_the_stack_answers(env, kubectl=running.kubectl)

    worker = running.component("worker-1")
    assert worker is not None
    assert procs.kill_process(worker.record) is procs.StopOutcome.KILLED
    assert agentrun("dev", "status", *d).returncode == 1

    revived = agentrun("dev", "up", "--workers", "1", *d)
    assert revived.returncode == 0, revived.stderr
    assert "worker-1 died: restarting" in revived.stderr
    after = state.load_state(dev_dir)
    assert after is not None
    new_worker = after.component("worker-1")
    assert new_worker is not None and new_worker.record.pid != worker.record.pid
    assert new_worker.ports == worker.ports

    again = agentrun("dev", "up", "--workers", "1", *d)
    assert again.returncode == 0 and "already up" in again.stderr

    down = agentrun("dev", "down", *d)
    assert down.returncode == 0, down.stderr
    assert not any(procs.is_alive(c.record) for c in after.components)
    assert state.load_state(dev_dir) is None
    assert sorted(p.name for p in dev_dir.iterdir()) == [".lock", "logs"]


@pytest.mark.e2e
def test_demo_runs_the_examples_to_the_readme_s_reasons_and_charges_their_sum(
    dev_dir: Path,
) -> None:
    """``make demo`` (``agentrun dev demo``), brought down after: the three examples end as the
    README shows, and the ``default`` tenant's row holds the sum of their tokens."""
    shown = agentrun("dev", "demo", "--down", "--dir", str(dev_dir), timeout=420)
    print(shown.stdout)
    assert shown.returncode == 0, shown.stderr
    runs_table, rest = shown.stdout.split("$ kubectl get agentruns", 1)[1].split("\nusage:", 1)
    rows = {line.split()[0]: line.split()[1:3] for line in runs_table.splitlines()[2:5]}
    assert rows == {
        "rectangle": ["Succeeded", "completed"],
        "collatz": ["Failed", "max_steps"],
        "inventory": ["Failed", "tool_budget_exhausted"],
    }
    usage, tenants = rest.split("$ kubectl get agenttenants", 1)
    spent = [int(m) for m in re.findall(r", (\d+) tokens \(", usage)]
    assert len(spent) == 3 and all(spent)
    header, default = (line.split() for line in tenants.splitlines()[1:3])
    assert header[:5] == ["NAME", "ACTIVE", "QUEUED", "TOKENS", "COST"]
    assert default[:4] == ["default", "0", "0", str(sum(spent))]
    assert state.load_state(dev_dir) is None


def check_the_stack_answers(env: dict[str, str], *, kubectl: Path | None) -> None:
    """kubectl sees the CRDs, the mock model lists its models, nats has JetStream."""
    assert set(env) == {
        "KUBECONFIG",
        "AGENTRUN_NATS_URL",
        "AGENTRUN_NATS_CREDS_FILE",
        "AGENTRUN_NATS_CA_FILE",
        "AGENTRUN_MODEL_URL",
        "PATH",
    }
    assert env["PATH"].endswith(":$PATH")  # the pinned kubectl first
    assert kubectl is not None
    dirs = env["PATH"].removesuffix(':"$PATH"').removesuffix(":$PATH").strip("'").split(os.pathsep)
    assert dirs[0] == str(kubectl.parent)
    assert (Path(dirs[1]) / "agentrun").exists()  # `agentrun cancel RUN` works after the eval
    crds = subprocess.run(
        [str(kubectl), "get", "crd", "-o", "name"],
        env={**os.environ, "KUBECONFIG": env["KUBECONFIG"]},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "customresourcedefinition.apiextensions.k8s.io/agentruns.agentrun.dev" in crds.stdout
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{env['AGENTRUN_MODEL_URL']}/models", timeout=10) as response:
        assert json.load(response)["object"] == "list"

    async def jetstream_answers() -> None:
        auth = NatsAuth(
            creds_file=Path(env["AGENTRUN_NATS_CREDS_FILE"]),
            ca_file=Path(env["AGENTRUN_NATS_CA_FILE"]),
        )
        client = await nats.connect(env["AGENTRUN_NATS_URL"], **connect_options(auth))
        try:
            await client.jetstream().account_info()
        finally:
            await client.close()

    asyncio.run(jetstream_answers())


def test_the_eval_hint_names_the_running_executable_when_path_does_not_find_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agentrun dev up` ends with an eval line: a bare `agentrun` not on PATH would fail."""
    script = tmp_path / ".venv" / "bin" / "agentrun"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert dev_cli._executable(str(script)) == ".venv/bin/agentrun"
    monkeypatch.setenv("PATH", f"{script.parent}:/usr/bin")
    assert dev_cli._executable(str(script)) == "agentrun"
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert dev_cli._executable(str(script)) == str(script.resolve())


def test_a_nats_cluster_is_for_the_local_stack_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert agentrun_cli.main(["dev", "up", "--chart", "--nats-servers", "3"]) == 2
    assert "--nats-servers is for the local stack" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # a cluster of two cannot elect a leader alone
        agentrun_cli.main(["dev", "up", "--nats-servers", "2"])
    assert refused.value.code == 2


@pytest.mark.e2e
def test_up_with_three_nats_servers_keeps_every_stream_at_r3(dev_dir: Path) -> None:
    d = ("--dir", str(dev_dir))
    up = agentrun("dev", "up", "--workers", "1", "--nats-servers", "3", *d)
    assert up.returncode == 0, up.stderr
    running = state.load_state(dev_dir)
    assert running is not None and running.nats_auth_dir is not None
    names = [c.name for c in running.components]
    assert [n for n in names if n.startswith("nats-server")] == [
        "nats-server-n1",
        "nats-server-n2",
        "nats-server-n3",
    ]
    auth = NatsAuth(
        creds_file=running.nats_auth_dir / "admin.creds",
        ca_file=running.nats_auth_dir / "ca.crt",
    )
    assert running.nats_url is not None
    found = asyncio.run(stream_replicas(running.nats_url, auth))
    assert found == dict.fromkeys(found, 3) and len(found) == 4, found
    down = agentrun("dev", "down", *d)
    assert down.returncode == 0, down.stderr
    assert not any(procs.is_alive(c.record) for c in running.components)


async def stream_replicas(url: str, auth: NatsAuth) -> dict[str, int]:
    """The replica count of agentrun's streams and buckets, once the operator made them all."""
    client = await nats.connect(url, **connect_options(auth))
    streams = ("AGENTRUN_TURNS", "AGENTRUN_EVENTS", "KV_AGENTRUN_LEDGER", "KV_AGENTRUN_EFFECTS")
    try:
        js = client.jetstream(timeout=5)
        async with asyncio.timeout(60):
            while True:
                try:
                    return {s: (await js.stream_info(s)).config.num_replicas or 1 for s in streams}
                except nats.js.errors.NotFoundError:
                    await asyncio.sleep(0.5)
    finally:
        await client.close()


@pytest.mark.nodebinaries  # after the background build, not waiting for it
@pytest.mark.timeout(7200)  # cold: every Go build of the suite
def test_binaries_all_builds_and_lists_every_go_binary_the_suite_uses() -> None:
    done = agentrun("dev", "binaries", "--all", timeout=7200)

    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    names = [name for name, _ in rows]
    assert names == [  # in the order of .ci/pytest-tiers' tiers
        *("etcd", "kube-apiserver", "kubectl"),
        *("helm", "prometheus", "promtool", "syft", "nats"),
        *("kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy"),
        *("coredns", "kube-router"),
    ]
    assert all(os.access(path, os.X_OK) for _, path in rows)
