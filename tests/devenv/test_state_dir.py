"""Where ``agentrun dev`` finds the local stack's state: the option, ``$AGENTRUN_DEV_DIR``, the
nearest ``.agentrun/dev`` with a state here or above (as git finds ``.git``), else here."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun_dev import state


def started_in(root: Path) -> Path:
    """A stack's state directory under ``root``, as ``agentrun dev up`` leaves it."""
    directory = root / state.DEFAULT_DIR
    directory.mkdir(parents=True)
    (directory / state.STATE_FILE).write_text("{}")
    return directory


def test_a_subdirectory_finds_the_stack_started_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(state.DIR_ENV, raising=False)
    found = started_in(tmp_path)
    mine = tmp_path / "my" / "manifests"
    mine.mkdir(parents=True)
    monkeypatch.chdir(mine)
    assert state.resolve_dir() == found


def test_without_a_stack_above_it_is_the_current_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(state.DIR_ENV, raising=False)
    (tmp_path / state.DEFAULT_DIR).mkdir(parents=True)  # a directory without a state
    mine = tmp_path / "mine"
    mine.mkdir()
    monkeypatch.chdir(mine)
    assert state.resolve_dir() == mine / state.DEFAULT_DIR


def test_the_option_and_the_environment_come_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started_in(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(state.DIR_ENV, str(tmp_path / "elsewhere"))
    assert state.resolve_dir() == tmp_path / "elsewhere"
    assert state.resolve_dir(tmp_path / "given") == tmp_path / "given"
