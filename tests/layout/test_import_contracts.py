"""The layering is a contract: ``lint-imports`` (import-linter) checks the ``[tool.importlinter]``
contracts of ``pyproject.toml`` on an installed copy of the runtime and the dev tooling, and a
broken one fails naming the two modules of each import that breaks it, relative imports too.

The copy is what ``make lint`` checks too (``agentrun_dev.layout``): the editable install maps
``operator/`` to ``agentrun.operator`` through an import hook that import-linter cannot see."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from agentrun_dev import layout

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "pyproject.toml"

VIOLATIONS = {
    "agentrun/operator/runs/leak.py": (
        "from ..tenants.policy import TenantPolicy\n",
        "agentrun.operator.runs.leak -> agentrun.operator.tenants.policy",
    ),
    "agentrun/operator/platform/leak.py": (
        "from .. import runs\n",
        "agentrun.operator.platform.leak -> agentrun.operator.runs",
    ),
    "agentrun/kernel/leak.py": ("import asyncio\n", "agentrun.kernel.leak -> asyncio"),
    "agentrun/worker/leak.py": (
        "from ..operator.runs import RunKey\n",
        "agentrun.worker.leak -> agentrun.operator.runs",
    ),
    "agentrun/operator/leak.py": ("", "- agentrun.operator.leak"),
    "agentrun/operator/schedules/leak.py": (
        "import kopf\nfrom kubernetes_asyncio import client\n",
        "agentrun.operator.schedules.leak -> kubernetes_asyncio",
    ),
    "agentrun/operator/schedules/leak2.py": (
        "import kopf\n",
        "agentrun.operator.schedules.leak2 -> kopf",
    ),
    "agentrun/operator/runs/peek.py": (
        "from . import views\n",
        "agentrun.operator.runs.peek -> agentrun.operator.runs.views",
    ),
    "agentrun/operator/tenants/leak.py": (
        "from .. import agents\n",
        "No cycles are allowed in agentrun.operator",
    ),
    "agentrun/operator/agents/leak.py": (
        "from .. import tenants\n",
        "No cycles are allowed in agentrun.operator",
    ),
}
"""A module added to the copy → (its source, a line the report must hold): a kind reaching into
another kind's module; the platform importing a kind; the kernel importing an I/O library; the
worker importing the operator; a module at the operator's top outside every folder; a kind
importing the Kubernetes client or kopf; a module beside the dispatcher reading its views; two
kinds importing each other's ports (a circle)."""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runtime and the dev tooling installed as a wheel lays them out."""
    return layout.install_copy(REPO, tmp_path_factory.mktemp("layout") / "site")


def test_the_repository_keeps_every_import_contract(installed: Path) -> None:
    contracts = tomllib.loads(CONFIG.read_text())["tool"]["importlinter"]["contracts"]
    result = layout.lint_imports(installed, config=CONFIG)
    assert result.ok, result.output
    assert f"Contracts: {len(contracts)} kept, 0 broken." in result.output
    assert (installed / "agentrun" / "operator" / "runs" / "dispatch.py").is_file()


def test_breaking_a_contract_fails_and_names_both_modules(installed: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(installed, tmp_path / "site"))
    for path, (source, _) in VIOLATIONS.items():
        (copy / path).write_text(source)
    result = layout.lint_imports(copy, config=CONFIG)
    assert not result.ok
    for path, (_, named) in VIOLATIONS.items():
        assert named in result.output, f"{path}: {named!r} not in\n{result.output}"
    broken = re.search(r"Contracts: (\d+) kept, (\d+) broken", result.output)
    # the kernel's, the programs' independence, the operator's layers, the tenants' port, the
    # Kubernetes client's, kopf's, the dispatcher's views and the circles contract
    assert broken is not None and int(broken.group(2)) == 8, result.output
