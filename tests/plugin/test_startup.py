"""The CLI programs start without the client libraries: ``--help`` and a usage error of
``kubectl agentrun`` and ``agentrun`` import none of Kubernetes, NATS, HTTP, the event model or
the local stack (each took seconds to import on a loaded machine, before a command ran).

Each case runs the program's ``main`` in a fresh interpreter and lists the modules it loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "aiohttp",
    "kubernetes_asyncio",
    "nats",
    "openai",
    "pydantic",
    "jsonschema",
    "agentrun.bus",
    "agentrun.kube",
    "agentrun.kernel",
    "agentrun.protocol",
    "agentrun_dev.stack",
    "agentrun.cli.describe",
    "agentrun.cli.logs",
)
"""Modules (and their submodules) a command's start must not import."""

PROGRAM = """
import contextlib, json, sys
from agentrun.cli import {module} as program
with contextlib.redirect_stdout(sys.stderr), contextlib.suppress(SystemExit):
    program.main({argv!r})
print(json.dumps(sorted(sys.modules)))
"""

STARTS = [
    pytest.param("kubectl", ["--help"], id="plugin-help"),
    pytest.param("kubectl", [], id="plugin-no-command"),
    pytest.param("kubectl", ["frob"], id="plugin-unknown-command"),
    pytest.param("kubectl", ["get", "--help"], id="plugin-get-help"),
    pytest.param("kubectl", ["logs"], id="plugin-logs-without-run"),
    pytest.param("kubectl", ["describe", "r", "-o", "yaml"], id="plugin-bad-output"),
    pytest.param("main", ["--help"], id="agentrun-help"),
    pytest.param("main", ["cancel"], id="agentrun-cancel-without-run"),
    pytest.param("main", ["approve", "--help"], id="agentrun-approve-help"),
    pytest.param("main", ["dev", "--help"], id="agentrun-dev-help"),
]


def loaded_modules(module: str, argv: list[str]) -> list[str]:
    """The names in ``sys.modules`` after ``agentrun.cli.<module>.main(argv)`` in a new
    interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(module=module, argv=argv)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    names: list[str] = json.loads(done.stdout)
    return names


@pytest.mark.parametrize(("module", "argv"), STARTS)
def test_help_and_usage_errors_import_no_client_library(module: str, argv: list[str]) -> None:
    loaded = loaded_modules(module, argv)
    heavy = sorted(
        name for name in loaded if any(name == h or name.startswith(f"{h}.") for h in HEAVY)
    )
    assert heavy == []
