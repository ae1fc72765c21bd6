"""The llama-cpp-python server's cache: builds of other keys go once unused for a week, so
checkouts of two versions sharing the cache keep each other's builds."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agentrun_dev import llamaserver


def build(base: Path, key: str, *, used: float | None) -> Path:
    """A finished build of ``key`` last used at ``used`` (None: unfinished, no marker)."""
    venv = base / f"llama-cpp-python-{llamaserver.LLAMA_CPP_PYTHON_VERSION}-{key}" / "venv"
    venv.mkdir(parents=True)
    (base / f"wheels-{key}").mkdir()
    if used is not None:
        marker = venv / ".agentrun-complete"
        marker.write_text(llamaserver.LLAMA_CPP_PYTHON_VERSION)
        os.utime(marker, (used, used))
    return venv.parent


def test_other_keys_builds_go_once_unused_for_a_week_and_the_older_layout_at_once(
    tmp_path: Path,
) -> None:
    now = time.time()
    key = llamaserver.build_key()
    ours = build(tmp_path, key, used=now - 30 * 24 * 3600)  # ours is never removed
    recent = build(tmp_path, "a" * 12, used=now - 3600)
    stale = build(tmp_path, "b" * 12, used=now - llamaserver.UNUSED_FOR - 60)
    unfinished = build(tmp_path, "c" * 12, used=None)
    older_layout = tmp_path / f"llama-cpp-python-{llamaserver.LLAMA_CPP_PYTHON_VERSION}"
    (older_layout / "venv").mkdir(parents=True)
    (tmp_path / "wheels").mkdir()

    llamaserver._forget_other_builds(tmp_path, key, now=now)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [ours.name, recent.name, f"wheels-{key}", "wheels-" + "a" * 12]
    )
    assert not stale.exists() and not unfinished.exists() and not older_layout.exists()


def test_the_build_key_changes_with_the_cmake_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    key = llamaserver.build_key()
    assert len(key) == 12
    monkeypatch.setattr(llamaserver, "CMAKE_ARGS", llamaserver.CMAKE_ARGS + " -DGGML_AVX512=ON")
    assert llamaserver.build_key() != key
