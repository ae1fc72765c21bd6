"""Build etcd, kube-apiserver and kubectl from the Go module proxy.

The recipe (checked on Go 1.24+): each binary is built from a throw-away wrapper module that
requires the upstream module at the pinned version, because neither module can be built with
`go install path@version` (both carry `replace` directives).

- etcd: require ``go.etcd.io/etcd/server/v3``, `go mod tidy`, `go build` the module root.
- kube-apiserver and kubectl: require ``k8s.io/kubernetes``, plus one
  ``replace k8s.io/X => k8s.io/X v0.<minor>.<patch>`` for every staging module that
  kubernetes' own go.mod requires at the placeholder ``v0.0.0`` (those are replaced by local
  paths upstream), then `go mod tidy` and `go build` the two commands, with the version
  stamped at link time as kubernetes' hack/lib/version.sh does (else they report
  ``v0.0.0-master``).

The etcd version is read from ``build/dependencies.yaml`` of the downloaded kubernetes module
and must equal the pinned one. Outputs are written under a temporary name and renamed, so an
interrupted build never leaves a half-written binary.

What belongs here: the build recipe only. Where binaries are cached, locking, and choosing
between prebuilt and built binaries are `binaries`' job.
"""

from __future__ import annotations

import dataclasses
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
    go = _Go(binary=find_go(), env=_go_env(), log=log)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-gobuild-") as tmp:
        work = Path(tmp)
        log(f"[1/4] downloading k8s.io/kubernetes@{k8s_version} from the Go module proxy")
        k8s_dir = go.download("k8s.io/kubernetes", k8s_version, cwd=work)
        pinned = etcd_version_of(k8s_dir)
        if pinned != etcd_version:
            raise BuildError(
                f"k8s.io/kubernetes {k8s_version} pins etcd {pinned} in build/dependencies.yaml,"
                f" but agentrun expects {etcd_version}: update the pins in agentrun.devenv"
            )
        log(f"[2/4] kubernetes {k8s_version} pins etcd {pinned} (build/dependencies.yaml)")
        if "etcd" in names:
            log(f"[3/4] building etcd {etcd_version}")
            _build_etcd(go, work / "etcd", out_dir, version=etcd_version)
        else:
            log("[3/4] etcd already built")
        wanted = [n for n in ("kube-apiserver", "kubectl") if n in names]
        if wanted:
            log(f"[4/4] building {', '.join(wanted)} {k8s_version}")
            _build_kubernetes(
                go, work / "k8s", out_dir, k8s_dir=k8s_dir, version=k8s_version, names=wanted
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


def version_ldflags(k8s_version: str) -> str:
    """``-ldflags`` value that stamps `k8s_version` (``"v1.34.4"``) into kubernetes binaries.

    The same variables as kubernetes' hack/lib/version.sh, in client-go and component-base;
    tree state "archive" since a module zip has no git metadata. No build date, so the
    output is reproducible.
    """
    major, minor = k8s_version.removeprefix("v").split(".")[:2]
    values = {"gitVersion": k8s_version, "gitMajor": major, "gitMinor": minor}
    values["gitTreeState"] = "archive"
    return " ".join(
        f"-X {package}.{key}={value}"
        for package in ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
        for key, value in values.items()
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Go:
    """The go binary, the environment it runs in and where its output goes."""

    binary: Path
    env: Mapping[str, str]
    log: console.Log

    def run(self, args: list[str], *, cwd: Path, quiet: bool = False) -> str:
        """Run ``go args…`` in `cwd`, streaming its output to `log` unless `quiet`.

        Logs a heartbeat every 30 s of silence. Returns the output (stdout and stderr).
        Raises BuildError on a non-zero exit, with the last 40 lines.
        """
        command = f"go {' '.join(args)}"
        short = f"go build {args[-1]}" if args[0] == "build" else command
        self.log(f"  $ {command}   (in {cwd})")
        started = time.monotonic()
        proc = subprocess.Popen(
            [str(self.binary), *args],
            cwd=cwd,
            env=dict(self.env),
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
            while (
                line := _next_line(lines, started=started, label=short, log=self.log)
            ) is not None:
                output.append(line)
                if not quiet:
                    self.log(f"    go: {line}")
            code = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join()
        if code != 0:
            tail = "\n".join(output[-40:])
            raise BuildError(f"`{command}` failed with status {code} in {cwd}:\n{tail}")
        self.log(f"  done in {time.monotonic() - started:.0f} s: {short}")
        return "\n".join(output)

    def build(self, package: str, out: Path, *, cwd: Path, ldflags: str = "") -> None:
        """``go build`` `package` to a temporary name next to `out`, then rename it to `out`."""
        partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
        flags = ["-ldflags", ldflags] if ldflags else []
        try:
            self.run(["build", *flags, "-o", str(partial), package], cwd=cwd)
            os.replace(partial, out)
        finally:
            partial.unlink(missing_ok=True)
        self.log(f"  wrote {out}")

    def download(self, module: str, version: str, *, cwd: Path) -> Path:
        """``go mod download -json module@version``; returns the module's source directory."""
        output = self.run(["mod", "download", "-json", f"{module}@{version}"], cwd=cwd, quiet=True)
        try:  # go may print "go: downloading …" lines around the JSON object
            info = json.loads(output[output.index("{") : output.rindex("}") + 1])
        except ValueError as exc:
            raise BuildError(f"go mod download printed no JSON: {output[-2000:]}") from exc
        if "Error" in info or "Dir" not in info:
            raise BuildError(
                f"go mod download {module}@{version} failed: {info.get('Error', info)}"
            )
        self.log(f"  {module}@{version} is in {info['Dir']}")
        return Path(info["Dir"])


def _build_etcd(go: _Go, work: Path, out_dir: Path, *, version: str) -> None:
    package = "go.etcd.io/etcd/server/v3"
    _write_wrapper(
        work,
        module="agentrun.dev/etcdwrap",
        require=f"{package} {version}",
        extra=[],
        imports=[package],
    )
    go.run(["mod", "tidy"], cwd=work)
    go.build(package, out_dir / "etcd", cwd=work)


def _build_kubernetes(
    go: _Go, work: Path, out_dir: Path, *, k8s_dir: Path, version: str, names: list[str]
) -> None:
    replaces = staging_replaces((k8s_dir / "go.mod").read_text(), k8s_version=version)
    go.log(f"  replacing {len(replaces)} staging modules at v0.{version.split('.', 1)[1]}")
    packages = {n: f"k8s.io/kubernetes/cmd/{n}" for n in ("kube-apiserver", "kubectl")}
    _write_wrapper(
        work,
        module="agentrun.dev/k8swrap",
        require=f"k8s.io/kubernetes {version}",
        extra=replaces,
        imports=list(packages.values()),
    )
    go.run(["mod", "tidy"], cwd=work)
    for name in names:
        go.build(packages[name], out_dir / name, cwd=work, ldflags=version_ldflags(version))


def _write_wrapper(
    work: Path, *, module: str, require: str, extra: list[str], imports: list[str]
) -> None:
    work.mkdir(parents=True, exist_ok=True)
    lines = [f"module {module}", "", "go 1.24.0", "", f"require {require}", "", *extra]
    (work / "go.mod").write_text("\n".join(lines) + "\n")
    imports_text = "\n".join(f'\t_ "{p}"' for p in imports)
    (work / "tools.go").write_text(_TOOLS_GO.format(imports=imports_text))


def _next_line(
    lines: queue.Queue[str | None], *, started: float, label: str, log: console.Log
) -> str | None:
    while True:
        try:
            return lines.get(timeout=_HEARTBEAT_SECONDS)
        except queue.Empty:
            log(f"  … still running {label} ({time.monotonic() - started:.0f} s)")


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
