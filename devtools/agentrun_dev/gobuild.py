"""Build etcd, kube-apiserver and kubectl from the Go module proxy.

The recipe (checked on Go 1.24+): each binary is built from a throw-away wrapper module that
requires the upstream module at the pinned version, because neither module can be built with
`go install path@version` (both carry `replace` directives).

- etcd: require ``go.etcd.io/etcd/server/v3``, `go mod tidy`, `go build` the module root.
- kube-apiserver, kubectl and the node's kube-controller-manager, kube-scheduler, kubelet and
  kube-proxy: require ``k8s.io/kubernetes``, plus one
  ``replace k8s.io/X => k8s.io/X v0.<minor>.<patch>`` for every staging module that
  kubernetes' own go.mod requires at the placeholder ``v0.0.0`` (those are replaced by local
  paths upstream), then `go mod tidy` and one `go build -o DIR/` of all requested commands
  (one invocation shares the compile and link work), with the version stamped at link time
  as kubernetes' hack/lib/version.sh does (else they report ``v0.0.0-master``).

The etcd version is read from ``build/dependencies.yaml`` of the downloaded kubernetes module
and must equal the pinned one. Outputs are written under a temporary name and renamed, so an
interrupted build never leaves a half-written binary.

- prometheus and promtool: ``github.com/prometheus/prometheus`` carries no ``replace``
  directives, so both are built by one ``go install cmd/prometheus@v0.3xx.y cmd/promtool@…``
  (exactly the module's own go.sum), into a temporary GOBIN then renamed. Tags ``netgo`` and
  ``remove_all_sd`` (static scrape configs only, which halves the build), no
  ``builtinassets`` (the web UI is not needed, the HTTP API is), and the release version from
  the module's ``VERSION`` file stamped at link time as its .promu.yml does.

- kube-router (the node's NetworkPolicy enforcer): ``github.com/cloudnativelabs/kube-router/v2``
  carries no ``replace`` directives either: one ``go install cmd/kube-router@v2.x.y`` with
  ``CGO_ENABLED=0`` and the version stamped as its Makefile does (see `build_kube_router`).

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
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import yaml

from agentrun_dev import console

MIN_GO = (1, 24)
KUBE_COMMANDS = (
    "kube-apiserver",
    "kubectl",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
)
"""Commands of ``k8s.io/kubernetes/cmd/`` that `build_binaries` can build."""
PROMETHEUS_TAGS = ("netgo", "remove_all_sd")
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
        names: a subset of ``{"etcd"} | KUBE_COMMANDS``; the kubernetes ones are built by one
            ``go build``.
        log: receives progress lines, including the go commands' own output.

    Raises:
        BuildError: see the class; the message says what to do next.
        ValueError: an unknown name.
    """
    unknown = set(names) - {"etcd", *KUBE_COMMANDS}
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
                f" but agentrun expects {etcd_version}: update the pins in agentrun_dev"
            )
        log(f"[2/4] kubernetes {k8s_version} pins etcd {pinned} (build/dependencies.yaml)")
        if "etcd" in names:
            log(f"[3/4] building etcd {etcd_version}")
            _build_etcd(go, work / "etcd", out_dir, version=etcd_version)
        else:
            log("[3/4] etcd already built")
        wanted = [n for n in KUBE_COMMANDS if n in names]
        if wanted:
            log(f"[4/4] building {', '.join(wanted)} {k8s_version}")
            _build_kubernetes(
                go, work / "k8s", out_dir, k8s_dir=k8s_dir, version=k8s_version, names=wanted
            )
        else:
            log("[4/4] the kubernetes commands are already built")


PROMETHEUS_MODULE = "github.com/prometheus/prometheus"
PROMETHEUS_NAMES = ("prometheus", "promtool")
_PROMETHEUS_HINT = "set PROMETHEUS_BINARIES to a directory holding prometheus and promtool"
_GO_DIRECTIVE = re.compile(r"^go (\d+)\.(\d+)", re.MULTILINE)


def build_prometheus(
    out_dir: Path,
    *,
    module_version: str,
    names: Collection[str] = PROMETHEUS_NAMES,
    log: console.Log = console.log_to_stderr,
) -> None:
    """Build prometheus and/or promtool at `module_version` into `out_dir`.

    Args:
        out_dir: destination directory (created if needed); each binary appears there only
            once complete (built into a temporary GOBIN beside it, then renamed).
        module_version: the Go module version of ``github.com/prometheus/prometheus``, e.g.
            ``"v0.316.0"`` (Prometheus 3.16.0; the release is read from its VERSION file).
        names: a subset of ``{"prometheus", "promtool"}``.
        log: receives progress lines, including the go commands' own output.

    Raises:
        BuildError: no Go on PATH, a Go older than the module's ``go`` directive, a go
            command failed, or a built binary does not report the expected release.
        ValueError: an unknown name.
    """
    unknown = set(names) - set(PROMETHEUS_NAMES)
    if unknown:
        raise ValueError(f"cannot build {sorted(unknown)}")
    wanted = [n for n in PROMETHEUS_NAMES if n in names]
    go = _Go(binary=find_go(hint=_PROMETHEUS_HINT), env=_go_env(), log=log)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-gobuild-") as tmp:
        work = Path(tmp)
        module_dir, go_mod = go.download_module(
            PROMETHEUS_MODULE, module_version, cwd=work, hint=_PROMETHEUS_HINT, step="[1/3]"
        )
        release = prometheus_release_of(module_dir)
        required = go_directive_of(go_mod)
        log(
            f"[2/3] {module_version} is Prometheus {release}; it needs Go ≥{required[0]}."
            f"{required[1]}"
        )
        log(f"[3/3] building {', '.join(wanted)} {release} (tags {','.join(PROMETHEUS_TAGS)})")
        _install_prometheus(
            go, work, out_dir, module_version=module_version, release=release, names=wanted
        )


COREDNS_MODULE = "github.com/coredns/coredns"
COREDNS_PLUGINS = (
    "bind",
    "cache",
    "errors",
    "forward",
    "health",
    "kubernetes",
    "loadbalance",
    "log",
    "loop",
    "ready",
    "reload",
)
"""The plugins of the cluster-DNS build: what a kubeadm Corefile uses, plus ``bind`` and
``log``."""
_COREDNS_MAIN = """package main

import (
{imports}
\t"github.com/coredns/coredns/coremain"
)

func main() {{
\tcoremain.Run()
}}
"""


def build_coredns(
    out_dir: Path, *, module_version: str, log: console.Log = console.log_to_stderr
) -> None:
    """Build ``coredns`` at `module_version` with `COREDNS_PLUGINS` into ``out_dir/coredns``.

    Args:
        out_dir: destination directory (created if needed); the binary appears only complete.
        module_version: a ``github.com/coredns/coredns`` version, e.g. ``"v1.12.1"``; stamped
            as CoreDNS' own Makefile does (``coremain.GitCommit``).
        log: receives progress lines, including the go commands' own output.

    Raises:
        BuildError: no Go, a Go older than the module's ``go`` directive, or a go command
            failed.
    """
    go = _Go(binary=find_go(hint=_COREDNS_HINT), env=_go_env(), log=log)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-gobuild-") as tmp:
        work = Path(tmp)
        go.download_module(
            COREDNS_MODULE, module_version, cwd=work, hint=_COREDNS_HINT, step="[1/2]"
        )
        log(f"[2/2] building coredns {module_version} with {', '.join(COREDNS_PLUGINS)}")
        _write_wrapper(
            work,
            module="agentrun.dev/corednswrap",
            require=f"{COREDNS_MODULE} {module_version}",
            extra=[],
            imports=[],
        )
        (work / "tools.go").unlink()
        imports = "\n".join(f'\t_ "{COREDNS_MODULE}/plugin/{p}"' for p in COREDNS_PLUGINS)
        (work / "main.go").write_text(_COREDNS_MAIN.format(imports=imports))
        go.run(["mod", "tidy"], cwd=work)
        ldflags = f"-X {COREDNS_MODULE}/coremain.GitCommit={module_version}"
        go.build(".", out_dir / "coredns", cwd=work, ldflags=ldflags)


_COREDNS_HINT = "or put a coredns binary on PATH"


def prometheus_release_of(module_dir: Path) -> str:
    """The Prometheus release (``"3.16.0"``) in the module's ``VERSION`` file.

    Raises BuildError if the file is missing or does not hold a version.
    """
    path = module_dir / "VERSION"
    try:
        release = path.read_text().strip()
    except OSError as exc:
        raise BuildError(f"cannot read {path}: {exc}") from exc
    if not re.fullmatch(r"\d+\.\d+\.\d+\S*", release):
        raise BuildError(f"{path} holds {release!r}, not a version")
    return release


def go_directive_of(go_mod: str) -> tuple[int, int]:
    """The (major, minor) Go version that a go.mod's ``go`` directive requires.

    ``"go 1.26.7"`` gives ``(1, 26)``: a newer patch release is fetched by Go itself when
    ``GOTOOLCHAIN`` allows, else go says so. No directive means Go 1.16, as go assumes.
    """
    match = _GO_DIRECTIVE.search(go_mod)
    return (1, 16) if match is None else (int(match[1]), int(match[2]))


def prometheus_ldflags(*, release: str, module_version: str) -> str:
    """``-ldflags`` value that stamps `release` into prometheus and promtool.

    The variables of Prometheus' .promu.yml in ``github.com/prometheus/common/version``; the
    revision is the module version (a module zip has no git metadata). No build date or user,
    so the output is reproducible. ``prometheus --version`` then prints
    ``prometheus, version 3.16.0 (branch: module, revision: v0.316.0)``.
    """
    values = {"Version": release, "Revision": module_version, "Branch": "module"}
    return " ".join(
        f"-X github.com/prometheus/common/version.{key}={value}" for key, value in values.items()
    )


_KUBE_HINT = "set KUBEBUILDER_ASSETS to a directory holding kube-apiserver and etcd"


def find_go(*, minimum: tuple[int, int] = MIN_GO, hint: str = _KUBE_HINT) -> Path:
    """The `go` binary on PATH, checked to be at least Go `minimum` (default 1.24).

    `hint` is the alternative to installing Go that error messages offer (default: set
    ``KUBEBUILDER_ASSETS``). Raises BuildError with what to do if it is missing or too old.
    """
    wanted = f"Go ≥{minimum[0]}.{minimum[1]}"
    found = shutil.which("go")
    if found is None:
        raise BuildError(f"go not found on PATH: install {wanted} or {hint}")
    result = subprocess.run(
        [found, "env", "GOVERSION"], capture_output=True, text=True, check=False
    )
    version = result.stdout.strip()
    match = re.match(r"go(\d+)\.(\d+)", version)
    if result.returncode != 0 or match is None:
        raise BuildError(f"cannot tell the version of {found}: {result.stderr.strip()}")
    if (int(match[1]), int(match[2])) < minimum:
        raise BuildError(f"{found} is {version}; install {wanted} or {hint}")
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
        short = f"go {args[0]} {args[-1]}" if args[0] in ("build", "install") else command
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

    def build_many(
        self, packages: Mapping[str, str], out_dir: Path, *, cwd: Path, ldflags: str = ""
    ) -> None:
        """One ``go build -o DIR/`` of `packages` (output name → main package).

        Each package's binary is named after its last path element, built into a temporary
        directory beside `out_dir`, then renamed to ``out_dir/<name>``.
        """
        staging = Path(tempfile.mkdtemp(prefix=f".gobuild-{os.getpid()}-", dir=out_dir))
        flags = ["-ldflags", ldflags] if ldflags else []
        try:
            self.run(["build", *flags, "-o", f"{staging}/", *packages.values()], cwd=cwd)
            for name, package in packages.items():
                os.replace(staging / package.rsplit("/", 1)[-1], out_dir / name)
                self.log(f"  wrote {out_dir / name}")
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def download(self, module: str, version: str, *, cwd: Path, sum_: str | None = None) -> Path:
        """``go mod download -json module@version``; returns the module's source directory.

        `sum_` (``"h1:…"``, as go.sum writes it) pins the module's content: a download whose
        hash differs raises BuildError (the Go checksum database checks it too)."""
        output = self.run(["mod", "download", "-json", f"{module}@{version}"], cwd=cwd, quiet=True)
        try:  # go may print "go: downloading …" lines around the JSON object
            info = json.loads(output[output.index("{") : output.rindex("}") + 1])
        except ValueError as exc:
            raise BuildError(f"go mod download printed no JSON: {output[-2000:]}") from exc
        if "Error" in info or "Dir" not in info:
            raise BuildError(
                f"go mod download {module}@{version} failed: {info.get('Error', info)}"
            )
        if sum_ is not None and info.get("Sum") != sum_:
            raise BuildError(
                f"{module}@{version} has the hash {info.get('Sum')!r}, not the pinned {sum_!r}"
            )
        self.log(f"  {module}@{version} is in {info['Dir']}")
        return Path(info["Dir"])

    def download_module(
        self, module: str, version: str, *, cwd: Path, hint: str, step: str
    ) -> tuple[Path, str]:
        """Log `step` (e.g. ``"[1/2]"``), ``download`` `module` at `version`, then check that
        the Go on PATH is at least what its ``go`` directive requires (``find_go`` with
        `hint`). Returns the module's source directory and its go.mod text; raises
        BuildError (a failed download, too old a Go)."""
        self.log(f"{step} downloading {module}@{version} from the Go module proxy")
        module_dir = self.download(module, version, cwd=cwd)
        go_mod = (module_dir / "go.mod").read_text()
        find_go(minimum=go_directive_of(go_mod), hint=hint)
        return module_dir, go_mod


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
    packages = {n: f"k8s.io/kubernetes/cmd/{n}" for n in names}
    _write_wrapper(
        work,
        module="agentrun.dev/k8swrap",
        require=f"k8s.io/kubernetes {version}",
        extra=replaces,
        imports=list(packages.values()),
    )
    go.run(["mod", "tidy"], cwd=work)
    go.build_many(packages, out_dir, cwd=work, ldflags=version_ldflags(version))


def _install_prometheus(
    go: _Go, work: Path, out_dir: Path, *, module_version: str, release: str, names: list[str]
) -> None:
    """``go install`` `names` at `module_version` into a GOBIN beside `out_dir`, then rename."""
    gobin = Path(tempfile.mkdtemp(prefix=f".gobin-{os.getpid()}-", dir=out_dir))
    try:
        installer = dataclasses.replace(go, env={**go.env, "GOBIN": str(gobin)})
        packages = [f"{PROMETHEUS_MODULE}/cmd/{n}@{module_version}" for n in names]
        ldflags = prometheus_ldflags(release=release, module_version=module_version)
        tags = ",".join(PROMETHEUS_TAGS)
        installer.run(["install", "-tags", tags, "-ldflags", ldflags, *packages], cwd=work)
        for name in names:
            _check_version(gobin / name, says=f"version {release} ")
            os.replace(gobin / name, out_dir / name)
            go.log(f"  wrote {out_dir / name}")
    finally:
        shutil.rmtree(gobin, ignore_errors=True)


def _check_version(binary: Path, *, says: str) -> None:
    """Raise BuildError unless the output of ``binary --version`` contains `says`."""
    try:
        result = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot run {binary} --version: {exc}") from exc
    if says not in result.stdout + result.stderr:
        raise BuildError(
            f"{binary} --version does not say {says!r}:"
            f" {(result.stdout + result.stderr).strip()[:500]}"
        )


def _install_binary(
    go: _Go,
    package: str,
    out: Path,
    *,
    cwd: Path,
    ldflags: str,
    check: Callable[[Path], None],
    env: Mapping[str, str] | None = None,
) -> None:
    """``go install -ldflags … package@version`` (one main package) into a temporary GOBIN
    beside `out`, `check` the built binary (raises BuildError), then rename it to `out`.
    `env` adds to the go environment (e.g. ``CGO_ENABLED``)."""
    gobin = Path(tempfile.mkdtemp(prefix=f".gobin-{os.getpid()}-", dir=out.parent))
    try:
        installer = dataclasses.replace(go, env={**go.env, **(env or {}), "GOBIN": str(gobin)})
        installer.run(["install", "-ldflags", ldflags, package], cwd=cwd)
        built = gobin / package.split("@", 1)[0].rsplit("/", 1)[-1]
        check(built)
        os.replace(built, out)
        go.log(f"  wrote {out}")
    finally:
        shutil.rmtree(gobin, ignore_errors=True)


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


HELM_MODULE = "helm.sh/helm/v3"
_HELM_HINT = "set HELM_BINARY to a helm v3 executable"
_CLIENT_GO_REQUIRE = re.compile(r"^\s*k8s\.io/client-go v0\.(\d+)\.\d+", re.MULTILINE)


def build_helm(out: Path, *, module_version: str, log: console.Log = console.log_to_stderr) -> None:
    """Build helm at `module_version` (e.g. ``"v3.22.0"``) into the file `out`.

    ``helm.sh/helm/v3`` carries no ``replace`` directives, so ``go install
    helm.sh/helm/v3/cmd/helm@<version>`` builds exactly the module's go.sum, into a temporary
    GOBIN beside `out`, then renamed. The link-time stamps are those of helm's Makefile: the
    release version, and the default Kubernetes version of offline rendering (``helm
    template`` without ``--kube-version``) taken from the module's client-go, ``v0.37.x`` →
    ``v1.37.0``, as a released helm binary has.

    Raises:
        BuildError: no Go on PATH, a Go older than the module's ``go`` directive, a go
            command failed, or the built binary does not report `module_version`.
    """
    go = _Go(binary=find_go(hint=_HELM_HINT), env=_go_env(), log=log)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-gobuild-") as tmp:
        work = Path(tmp)
        _, go_mod = go.download_module(
            HELM_MODULE, module_version, cwd=work, hint=_HELM_HINT, step="[1/2]"
        )
        flags = helm_ldflags(module_version=module_version, go_mod=go_mod)
        log(f"[2/2] building helm {module_version}")
        _install_binary(
            go,
            f"{HELM_MODULE}/cmd/helm@{module_version}",
            out,
            cwd=work,
            ldflags=flags,
            check=lambda built: _check_helm_version(built, module_version=module_version),
        )


def helm_ldflags(*, module_version: str, go_mod: str) -> str:
    """``-ldflags`` value that stamps helm as its Makefile does for a release.

    `go_mod` is helm's own go.mod: its ``k8s.io/client-go v0.<minor>.<patch>`` gives the
    default Kubernetes version ``1.<minor>`` of offline rendering and linting (helm leaves
    ``1.20`` unstamped). Raises BuildError if go.mod requires no client-go.
    """
    match = _CLIENT_GO_REQUIRE.search(go_mod)
    if match is None:
        raise BuildError("helm's go.mod requires no k8s.io/client-go v0.x: cannot stamp it")
    values = {
        "helm.sh/helm/v3/internal/version.version": module_version,
        "helm.sh/helm/v3/internal/version.metadata": "",
        "helm.sh/helm/v3/internal/version.gitTreeState": "clean",
        "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor": "1",
        "helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor": match[1],
        "helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor": "1",
        "helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor": match[1],
    }
    return " ".join(["-s", "-w", *(f"-X {key}={value}" for key, value in values.items())])


def _check_helm_version(binary: Path, *, module_version: str) -> None:
    """Raise BuildError unless ``helm version --short`` starts with `module_version`."""
    try:
        result = subprocess.run(
            [str(binary), "version", "--short"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "HELM_CONFIG_HOME": "/nonexistent", "HELM_CACHE_HOME": "/tmp"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"cannot run {binary} version: {exc}") from exc
    if not result.stdout.startswith(module_version):
        raise BuildError(
            f"{binary} version does not report {module_version}:"
            f" {(result.stdout + result.stderr).strip()[:500]}"
        )


KUBE_ROUTER_MODULE = "github.com/cloudnativelabs/kube-router/v2"
_KUBE_ROUTER_HINT = "or put a kube-router binary in the cache (see agentrun_dev.binaries)"


def build_kube_router(
    out: Path, *, module_version: str, log: console.Log = console.log_to_stderr
) -> None:
    """Build kube-router at `module_version` (e.g. ``"v2.1.0"``) into the file `out`.

    ``github.com/cloudnativelabs/kube-router/v2`` carries no ``replace`` directives, so
    ``go install …/cmd/kube-router@<version>`` builds exactly the module's go.sum, with
    ``CGO_ENABLED=0`` and the version stamped at link time as its Makefile does
    (``pkg/version.Version``; no build date, so the output is reproducible), into a temporary
    GOBIN beside `out`, then renamed.

    Raises:
        BuildError: no Go on PATH, a Go older than the module's ``go`` directive, a go
            command failed, or the built binary does not report `module_version`.
    """
    go = _Go(binary=find_go(hint=_KUBE_ROUTER_HINT), env=_go_env(), log=log)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-gobuild-") as tmp:
        work = Path(tmp)
        go.download_module(
            KUBE_ROUTER_MODULE, module_version, cwd=work, hint=_KUBE_ROUTER_HINT, step="[1/2]"
        )
        log(f"[2/2] building kube-router {module_version}")
        _install_binary(
            go,
            f"{KUBE_ROUTER_MODULE}/cmd/kube-router@{module_version}",
            out,
            cwd=work,
            ldflags=f"-X {KUBE_ROUTER_MODULE}/pkg/version.Version={module_version}",
            check=lambda built: _check_version(built, says=f"version {module_version},"),
            env={"CGO_ENABLED": "0"},
        )


def go_install(
    package: str, out: Path, *, ldflags: str = "-s -w", log: console.Log = console.log_to_stderr
) -> None:
    """``go install package@version`` (a module without ``replace`` directives, e.g. syft's
    ``cmd/syft``) into the file `out`, through a temporary GOBIN beside it.

    Raises BuildError: no Go on PATH, or the build failed.
    """
    go = _Go(binary=find_go(hint="put Go 1.24 or newer on PATH"), env=_go_env(), log=log)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-gobuild-") as tmp:
        _install_binary(go, package, out, cwd=Path(tmp), ldflags=ldflags, check=_runs)


def _runs(built: Path) -> None:
    """Raise BuildError unless `built` is an executable file."""
    if not (built.is_file() and os.access(built, os.X_OK)):
        raise BuildError(f"go install made no executable {built}")


NATSCLI_MODULE = "github.com/nats-io/natscli"
_NATSCLI_HINT = "or put a nats binary in the cache (see agentrun_dev.binaries)"


def build_natscli(
    out: Path, *, module_version: str, module_sum: str, log: console.Log = console.log_to_stderr
) -> None:
    """Build the ``nats`` CLI at `module_version` (e.g. ``"v0.5.0"``) into the file `out`.

    The module's content must hash to `module_sum` (``"h1:…"``, go.sum's form). It carries no
    ``replace`` directives, so ``go install github.com/nats-io/natscli/nats@<version>`` builds
    exactly its go.sum, static (``CGO_ENABLED=0``, it runs in the ``FROM scratch`` NATS image),
    stripped, into a temporary GOBIN beside `out`, then renamed; ``nats --version`` reports the
    module version from the binary's build information, as a release binary does.

    Raises:
        BuildError: no Go on PATH, a Go older than the module's ``go`` directive, a hash other
            than `module_sum`, a go command failed, or the binary does not report the version.
    """
    go = _Go(binary=find_go(hint=_NATSCLI_HINT), env=_go_env(), log=log)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-gobuild-") as tmp:
        work = Path(tmp)
        log(f"[1/2] downloading {NATSCLI_MODULE}@{module_version} from the Go module proxy")
        module_dir = go.download(NATSCLI_MODULE, module_version, cwd=work, sum_=module_sum)
        find_go(minimum=go_directive_of((module_dir / "go.mod").read_text()), hint=_NATSCLI_HINT)
        log(f"[2/2] building nats (natscli) {module_version}")
        _install_binary(
            go,
            f"{NATSCLI_MODULE}/nats@{module_version}",
            out,
            cwd=work,
            ldflags="-s -w",
            check=lambda built: _check_version(built, says=module_version),
            env={"CGO_ENABLED": "0"},
        )
