"""Build etcd, kube-apiserver and kubectl from the Go module proxy.

The recipe (checked on Go 1.24+): each binary is built from a throw-away wrapper module that
requires the upstream module at the pinned version, because neither module can be built with
`go install path@version` (both carry `replace` directives).

- etcd: require ``go.etcd.io/etcd/server/v3``, `go mod tidy`, `go build` the module root.
- kube-apiserver and kubectl: require ``k8s.io/kubernetes``, plus one
  ``replace k8s.io/X => k8s.io/X v0.<minor>.<patch>`` for every staging module that
  kubernetes' own go.mod requires at the placeholder ``v0.0.0`` (those are replaced by local
  paths upstream), then `go mod tidy` and `go build` the two commands.

The etcd version is read from ``build/dependencies.yaml`` of the downloaded kubernetes module
and must equal the pinned one. Outputs are written under a temporary name and renamed, so an
interrupted build never leaves a half-written binary.

What belongs here: the build recipe only. Where binaries are cached, locking, and choosing
between prebuilt and built binaries are `binaries`' job.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path

import yaml

from agentrun.devenv import console

MIN_GO = (1, 24)
_HEARTBEAT_SECONDS = 30.0
_STAGING_REQUIRE = re.compile(r"^\s*(k8s\.io/[a-z0-9-]+) v0\.0\.0$", re.MULTILINE)
_TOOLS_GO = """//go:build tools

package tools

import (
{imports}
)
"""


class BuildError(RuntimeError):
    """The Go toolchain is missing or too old, a go command failed, or a pin did not match."""


def build_binaries(
    out_dir: Path,
    *,
    k8s_version: str,
    etcd_version: str,
    names: Collection[str],
    log: console.Log = console.log_to_stderr,
) -> None:
    """Build the requested binaries into `out_dir`.

    Args:
        out_dir: destination directory (created if needed).
        k8s_version: e.g. ``"v1.34.4"``; kube-apiserver and kubectl are built at it.
        etcd_version: e.g. ``"v3.6.5"``; must equal what that kubernetes release pins.
        names: a subset of ``{"etcd", "kube-apiserver", "kubectl"}``.
        log: receives progress lines, including the go commands' own output.

    Raises:
        BuildError: see the class; the message says what to do next.
        ValueError: an unknown name.
    """
    unknown = set(names) - {"etcd", "kube-apiserver", "kubectl"}
    if unknown:
        raise ValueError(f"cannot build {sorted(unknown)}")
    go = find_go()
    out_dir.mkdir(parents=True, exist_ok=True)
    env = _go_env()
    with tempfile.TemporaryDirectory(prefix="agentrun-gobuild-") as tmp:
        work = Path(tmp)
        log(f"[1/4] downloading k8s.io/kubernetes@{k8s_version} from the Go module proxy")
        k8s_dir = _download_module(go, "k8s.io/kubernetes", k8s_version, cwd=work, env=env, log=log)
        pinned = etcd_version_of(k8s_dir)
        if pinned != etcd_version:
            raise BuildError(
                f"k8s.io/kubernetes {k8s_version} pins etcd {pinned} in build/dependencies.yaml,"
                f" but agentrun expects {etcd_version}: update the pins in agentrun.devenv"
            )
        log(f"[2/4] kubernetes {k8s_version} pins etcd {pinned} (build/dependencies.yaml)")
        if "etcd" in names:
            log(f"[3/4] building etcd {etcd_version}")
            _build_etcd(go, work / "etcd", out_dir, version=etcd_version, env=env, log=log)
        else:
            log("[3/4] etcd already built")
        wanted = [n for n in ("kube-apiserver", "kubectl") if n in names]
        if wanted:
            log(f"[4/4] building {', '.join(wanted)} {k8s_version}")
            _build_kubernetes(
                go,
                work / "k8s",
                out_dir,
                k8s_dir=k8s_dir,
                version=k8s_version,
                names=wanted,
                env=env,
                log=log,
            )
        else:
            log("[4/4] kube-apiserver and kubectl already built")


def find_go() -> Path:
    """The `go` binary on PATH, checked to be Go ≥ 1.24.

    Raises BuildError with what to do if it is missing or too old.
    """
    found = shutil.which("go")
    if found is None:
        raise BuildError(
            "go not found on PATH: install Go ≥1.24 or set KUBEBUILDER_ASSETS to a directory"
            " holding kube-apiserver and etcd"
        )
    result = subprocess.run(
        [found, "env", "GOVERSION"], capture_output=True, text=True, check=False
    )
    version = result.stdout.strip()
    match = re.match(r"go(\d+)\.(\d+)", version)
    if result.returncode != 0 or match is None:
        raise BuildError(f"cannot tell the version of {found}: {result.stderr.strip()}")
    if (int(match[1]), int(match[2])) < MIN_GO:
        raise BuildError(
            f"{found} is {version}; install Go ≥1.24 or set KUBEBUILDER_ASSETS to a directory"
            " holding kube-apiserver and etcd"
        )
    return Path(found)


def etcd_version_of(k8s_dir: Path) -> str:
    """The etcd version (``"v3.6.5"``) that a kubernetes source tree pins.

    Read from the ``etcd`` entry of ``build/dependencies.yaml``. Raises BuildError if absent.
    """
    path = k8s_dir / "build" / "dependencies.yaml"
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise BuildError(f"cannot read {path}: {exc}") from exc
    for dependency in data.get("dependencies", []) if isinstance(data, dict) else []:
        if isinstance(dependency, dict) and dependency.get("name") == "etcd":
            return "v" + str(dependency["version"]).removeprefix("v")
    raise BuildError(f"{path} has no 'etcd' dependency entry")


def staging_replaces(k8s_go_mod: str, *, k8s_version: str) -> list[str]:
    """``replace`` lines for the staging modules a kubernetes go.mod requires at ``v0.0.0``.

    ``k8s_version`` ``"v1.34.4"`` maps them to ``v0.34.4``. Pseudo-versions such as
    ``k8s.io/utils v0.0.0-2025…`` are real versions and are not replaced.
    """
    staging_version = "v0." + k8s_version.removeprefix("v").split(".", 1)[1]
    modules = sorted(set(_STAGING_REQUIRE.findall(k8s_go_mod)))
    return [f"replace {m} => {m} {staging_version}" for m in modules]


def _build_etcd(
    go: Path,
    work: Path,
    out_dir: Path,
    *,
    version: str,
    env: Mapping[str, str],
    log: console.Log,
) -> None:
    package = "go.etcd.io/etcd/server/v3"
    _write_wrapper(
        work,
        module="agentrun.dev/etcdwrap",
        require=f"{package} {version}",
        extra=[],
        imports=[package],
    )
    _run_go(go, ["mod", "tidy"], cwd=work, env=env, log=log)
    _go_build(go, package, out_dir / "etcd", cwd=work, env=env, log=log)


def _build_kubernetes(
    go: Path,
    work: Path,
    out_dir: Path,
    *,
    k8s_dir: Path,
    version: str,
    names: list[str],
    env: Mapping[str, str],
    log: console.Log,
) -> None:
    replaces = staging_replaces((k8s_dir / "go.mod").read_text(), k8s_version=version)
    log(f"  replacing {len(replaces)} staging modules at v0.{version.split('.', 1)[1]}")
    packages = {n: f"k8s.io/kubernetes/cmd/{n}" for n in ("kube-apiserver", "kubectl")}
    _write_wrapper(
        work,
        module="agentrun.dev/k8swrap",
        require=f"k8s.io/kubernetes {version}",
        extra=replaces,
        imports=list(packages.values()),
    )
    _run_go(go, ["mod", "tidy"], cwd=work, env=env, log=log)
    for name in names:
        _go_build(go, packages[name], out_dir / name, cwd=work, env=env, log=log)


def _write_wrapper(
    work: Path, *, module: str, require: str, extra: list[str], imports: list[str]
) -> None:
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"module {module}", "", "go 1.24.0", "", f"require {require}", "", *extra]
    (work / "go.mod").write_text("\n".join(lines) + "\n")
    imports_text = "\n".join(f'\t_ "{p}"' for p in imports)
    (work / "tools.go").write_text(_TOOLS_GO.format(imports=imports_text))


def _download_module(
    go: Path, module: str, version: str, *, cwd: Path, env: Mapping[str, str], log: console.Log
) -> Path:
    output = _run_go(
        go,
        ["mod", "download", "-json", f"{module}@{version}"],
        cwd=cwd,
        env=env,
        log=console.discard,
    )
    try:  # go may print "go: downloading …" lines around the JSON object
        info = json.loads(output[output.index("{") : output.rindex("}") + 1])
    except ValueError as exc:
        raise BuildError(f"go mod download printed no JSON: {output[-2000:]}") from exc
    if "Error" in info or "Dir" not in info:
        raise BuildError(f"go mod download {module}@{version} failed: {info.get('Error', info)}")
    log(f"  {module}@{version} is in {info['Dir']}")
    return Path(info["Dir"])


def _go_build(
    go: Path, package: str, out: Path, *, cwd: Path, env: Mapping[str, str], log: console.Log
) -> None:
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        _run_go(go, ["build", "-o", str(partial), package], cwd=cwd, env=env, log=log)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    log(f"  wrote {out}")


def _run_go(
    go: Path, args: list[str], *, cwd: Path, env: Mapping[str, str], log: console.Log
) -> str:
    """Run `go args…`, streaming its output lines to `log`; return the output.

    Logs a heartbeat every 30 s of silence. Raises BuildError on a non-zero exit.
    """
    command = f"go {' '.join(args)}"
    log(f"  $ {command}   (in {cwd})")
    started = time.monotonic()
    proc = subprocess.Popen(
        [str(go), *args],
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_pump, args=(proc, lines), daemon=True)
    reader.start()
    output: list[str] = []
    try:
        while (line := _next_line(lines, started=started, command=command, log=log)) is not None:
            output.append(line)
            log(f"    go: {line}")
        code = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join()
    if code != 0:
        tail = "\n".join(output[-40:])
        raise BuildError(f"`{command}` failed with status {code} in {cwd}:\n{tail}")
    log(f"  done in {time.monotonic() - started:.0f} s: {command}")
    return "\n".join(output)


def _next_line(
    lines: queue.Queue[str | None], *, started: float, command: str, log: console.Log
) -> str | None:
    while True:
        try:
            return lines.get(timeout=_HEARTBEAT_SECONDS)
        except queue.Empty:
            log(f"  … still running {command} ({time.monotonic() - started:.0f} s)")


def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _go_env() -> dict[str, str]:
    """Environment for go commands: module mode, no enclosing workspace, user GOFLAGS kept."""
    env = dict(os.environ)
    env["GOFLAGS"] = f"{env.get('GOFLAGS', '')} -mod=mod".strip()
    env["GOWORK"] = "off"
    return env
