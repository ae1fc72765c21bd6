"""Virtualenvs the benchmarks build for themselves, cached per machine: the in-process peer's
(``bench_peer.py``) and the other tree's of an A/B comparison (``bench_ab.py``).

What belongs here: creating a virtualenv once under the agentrun cache directory
(``platformdirs.user_cache_dir("agentrun")``, as the pinned binaries), under an exclusive lock
so that parallel sessions on one machine wait for one build instead of racing. What goes into
each virtualenv is the caller's.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from agentrun_dev import binaries, console

STAMP = ".installed"


def cache_dir(*parts: str) -> Path:
    """``<agentrun cache>/bench/<parts…>``."""
    root: Path = binaries.cache_root()
    return root.joinpath("bench", *parts)


def ensure_venv(
    directory: Path, *, installs: Sequence[Sequence[str]], log: console.Log = console.log_to_stderr
) -> Path:
    """A virtualenv at ``directory/venv`` with ``pip install <args>`` done for each of
    ``installs``; built once (a stamp file marks it complete) and reused. Returns its python.

    Raises subprocess.CalledProcessError (the output goes to ``directory/install.log``) when
    ``venv`` or ``pip`` fails; the next call starts over.
    """
    venv = directory / "venv"
    python = venv / "bin" / "python"
    if (venv / STAMP).is_file():
        return python
    with binaries.build_lock(directory, what=f"the virtualenv {venv}", log=log):
        if (venv / STAMP).is_file():
            return python
        log(f"creating {venv} (once per machine; a minute or two)")
        commands = [[sys.executable, "-m", "venv", "--clear", str(venv)]]
        commands += [[str(python), "-m", "pip", "install", "--quiet", *args] for args in installs]
        with (directory / "install.log").open("w") as out:
            for command in commands:
                subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=True)
        (venv / STAMP).touch()
    return python
