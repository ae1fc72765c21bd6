"""Every package folder of the runtime is in its wheel: ``[tool.setuptools] packages`` lists
subpackages one by one (``operator/`` and ``worker/`` are mapped into ``agentrun``), so a
folder left out would be missing from ``pip install .``, the image and the import contracts'
installed copy, while the editable install still found it."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = {"agentrun": "agentrun", "operator": "agentrun.operator", "worker": "agentrun.worker"}


def package_folders() -> set[str]:
    """Dotted names of every folder with an ``__init__.py`` under the runtime's roots."""
    found: set[str] = set()
    for folder, dotted in ROOTS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((dotted, *parts)))
    return found


def test_every_package_folder_is_listed_for_the_wheel() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(project["tool"]["setuptools"]["packages"])
    assert package_folders() - listed == set()
    assert "agentrun.operator.runs" in package_folders()


def test_every_listed_package_exists() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert set(project["tool"]["setuptools"]["packages"]) - package_folders() == set()
