"""``make release``: what a platform team installs, built from this checkout into one directory.

``dist/agentrun-<version>/`` holds

- ``agentrun-<version>.tgz``: the Helm chart (``helm package`` with the chart's version and
  appVersion set to the project's), its CRDs in ``crds/``;
- ``agentrun-image-<version>.docker.tar`` and ``agentrun-nats-image-<nats>.docker.tar``: the
  two images as ``docker-archive`` tarballs (``make image``; load with ``docker load``,
  ``podman load`` or ``ctr -n k8s.io images import``, or push with ``skopeo copy``);
- ``agentrun-<version>-py3-none-any.whl``: the Python package (``pip wheel --no-deps``), for
  the ``kubectl agentrun`` plugin and the ``agentrun`` command on a user's machine;
- ``*.cdx.json``: a CycloneDX SBOM of each image, made by syft (built from the Go module proxy
  at ``SYFT_VERSION``, cached per machine like helm) from the archive itself: the Debian
  packages, the Python distributions and the Go modules of nats-server;
- ``SHA256SUMS`` (``sha256sum -c`` format) over every file above, and, when a signing key is
  given, ``SHA256SUMS.sig``: an SSH signature (``ssh-keygen -Y sign``, namespace
  ``agentrun-release``) that ``ssh-keygen -Y verify`` checks offline against the publisher's
  public key.

The version has one source: ``[project].version`` of ``pyproject.toml``. The wheel, the image
tag and the packaged chart take it from there; the committed ``Chart.yaml`` must say the same
(``check_chart_version``: the dev installs run the chart from the checkout), and
``python -m agentrun_dev.dist --set-version X.Y.Z`` rewrites both.

What belongs here: assembling the release. Building the images is ``image``'s, running helm
``helm``'s.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from agentrun_dev import binaries, console, gobuild, helm, image

SYFT_MODULE = "github.com/anchore/syft"
SYFT_VERSION = "v1.57.1"
"""The syft release built (``go install``) and cached to make the images' SBOMs."""
SIGNING_NAMESPACE = "agentrun-release"
"""The ``-n`` namespace of ``ssh-keygen -Y sign|verify`` for release checksums."""
CHART = Path("charts") / "agentrun"
_VERSION_LINE = re.compile(r'^version = "[^"]*"$', re.M)
_CHART_LINES = re.compile(r'^(version: |appVersion: )"?[^"\n]*"?$', re.M)


class ReleaseError(RuntimeError):
    """A release step failed; the message says which and what to do."""


@dataclasses.dataclass(frozen=True, slots=True)
class Release:
    """A built release directory."""

    version: str
    directory: Path
    files: tuple[Path, ...]
    """Every artefact, the checksum file and its signature included."""
    signed: bool


def project_version(project: Path) -> str:
    """``[project].version`` of the checkout's ``pyproject.toml``: the release's version."""
    data = tomllib.loads((project / "pyproject.toml").read_text())
    return str(data["project"]["version"])


def check_chart_version(project: Path) -> None:
    """Raise ReleaseError unless ``Chart.yaml``'s ``version`` and ``appVersion`` are the
    project's version (``--set-version`` keeps them so)."""
    version = project_version(project)
    text = (project / CHART / "Chart.yaml").read_text()
    found = {
        m.group(1).strip(": "): m.group(0).split(":", 1)[1] for m in _CHART_LINES.finditer(text)
    }
    shown = {key: value.strip().strip('"') for key, value in found.items()}
    if shown != {"version": version, "appVersion": version}:
        raise ReleaseError(
            f"charts/agentrun/Chart.yaml says {shown}, pyproject.toml {version}: run "
            f"`python -m agentrun_dev.dist --set-version {version}`"
        )


def set_version(project: Path, version: str) -> None:
    """Write ``version`` into ``pyproject.toml``, ``devtools/pyproject.toml`` and the chart's
    ``version`` and ``appVersion``. Raises ReleaseError for a version that is not SemVer."""
    if not re.fullmatch(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?", version):
        raise ReleaseError(f"{version!r} is not a SemVer version (X.Y.Z or X.Y.Z-pre)")
    for pyproject in (project / "pyproject.toml", project / "devtools" / "pyproject.toml"):
        text = pyproject.read_text()
        pyproject.write_text(_VERSION_LINE.sub(f'version = "{version}"', text, count=1))
    chart = project / CHART / "Chart.yaml"
    text = chart.read_text()
    text = re.sub(r"^version: .*$", f"version: {version}", text, count=1, flags=re.M)
    text = re.sub(r"^appVersion: .*$", f'appVersion: "{version}"', text, count=1, flags=re.M)
    chart.write_text(text)


def package_chart(helm_runner: helm.Helm, project: Path, out: Path, *, version: str) -> Path:
    """``helm package`` of the checkout's chart into `out`, at `version`; the package's path."""
    helm_runner(
        "package", str(project / CHART), "--version", version, "--app-version", version,
        "--destination", str(out),
    )  # fmt: skip
    package = out / f"agentrun-{version}.tgz"
    if not package.is_file():
        raise ReleaseError(f"helm package made no {package.name} in {out}")
    return package


def syft_binary(*, root: Path | None = None, log: console.Log = console.log_to_stderr) -> Path:
    """syft at `SYFT_VERSION`, built once per machine from the Go module proxy and cached
    (``<cache root>/syft/<version>/bin/syft``). Raises gobuild.BuildError."""
    base = binaries.cache_root() if root is None else root
    binary = base / "syft" / SYFT_VERSION / "bin" / "syft"
    if not binaries.is_executable(binary):
        with binaries.build_lock(binary.parent.parent, what=f"syft {SYFT_VERSION}", log=log):
            if not binaries.is_executable(binary):
                log(f"building syft {SYFT_VERSION} from the Go module proxy into {binary}")
                started = time.monotonic()
                gobuild.go_install(f"{SYFT_MODULE}/cmd/syft@{SYFT_VERSION}", binary, log=log)
                log(f"built syft in {time.monotonic() - started:.0f}s")
    return binary


def image_sbom(syft: Path, archive: Path, out: Path) -> Path:
    """A CycloneDX (JSON) SBOM of the ``docker-archive`` `archive`, written to `out`, made
    offline by syft from the archive's layers. Raises ReleaseError if syft fails."""
    result = subprocess.run(
        [str(syft), "scan", f"docker-archive:{archive}", "--output", f"cyclonedx-json={out}"],
        capture_output=True, text=True, check=False, timeout=900,
        env={"SYFT_CHECK_FOR_APP_UPDATE": "false", "PATH": "/usr/bin:/bin",
             "HOME": tempfile.gettempdir()},
    )  # fmt: skip
    if result.returncode != 0 or not out.is_file():
        raise ReleaseError(f"syft could not scan {archive.name}: {result.stderr[-2000:]}")
    return out


def write_checksums(directory: Path, files: list[Path]) -> Path:
    """``SHA256SUMS`` in `directory` over `files` (names relative to it, sorted), in the
    format ``sha256sum -c`` reads."""
    lines = []
    for path in sorted(files, key=lambda p: p.name):
        digest = hashlib.sha256()
        with path.open("rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {path.relative_to(directory)}\n")
    sums = directory / "SHA256SUMS"
    sums.write_text("".join(lines))
    return sums


def sign(sums: Path, key: Path) -> Path:
    """``SHA256SUMS.sig``: an SSH signature of `sums` with the private key `key`
    (``ssh-keygen -Y sign -n agentrun-release``). Raises ReleaseError if ssh-keygen fails."""
    result = subprocess.run(
        ["ssh-keygen", "-Y", "sign", "-f", str(key), "-n", SIGNING_NAMESPACE, str(sums)],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    signature = sums.with_name(sums.name + ".sig")
    if result.returncode != 0 or not signature.is_file():
        raise ReleaseError(f"ssh-keygen could not sign {sums.name}: {result.stderr.strip()}")
    return signature


def verify(sums: Path, *, allowed_signers: Path, identity: str) -> bool:
    """Whether ``SHA256SUMS.sig`` is `identity`'s signature of `sums` (``ssh-keygen -Y
    verify`` with `allowed_signers`, the file listing publishers' public keys)."""
    result = subprocess.run(
        ["ssh-keygen", "-Y", "verify", "-f", str(allowed_signers), "-I", identity,
         "-n", SIGNING_NAMESPACE, "-s", str(sums) + ".sig"],
        stdin=sums.open("rb"), capture_output=True, check=False, timeout=60,
    )  # fmt: skip
    return result.returncode == 0


def build_release(
    project: Path,
    out_root: Path,
    *,
    signing_key: Path | None = None,
    log: console.Log = console.log_to_stderr,
) -> Release:
    """Build the release of the checkout at `project` into ``out_root/agentrun-<version>``
    (replaced if present). Raises ReleaseError, image.ImageError, helm.HelmError or
    gobuild.BuildError."""
    version = project_version(project)
    check_chart_version(project)
    directory = out_root / f"agentrun-{version}"
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="agentrun-release-helm-") as home:
        runner = helm.Helm(helm.ensure_helm(log=log), home=Path(home))
        files = [package_chart(runner, project, directory, version=version)]
    files.append(image.build_wheel(project, directory, log=log))
    images = image.build_project_images(project, log=log)
    syft = syft_binary(log=log)
    nats_tag = images.nats.name.rpartition(":")[2]
    for built, stem in ((images.agentrun, f"agentrun-image-{version}"),
                        (images.nats, f"agentrun-nats-image-{nats_tag}")):  # fmt: skip
        archive = directory / f"{stem}.docker.tar"
        shutil.copyfile(built.archive, archive)
        log(f"SBOM of {built.name}")
        files += [archive, image_sbom(syft, archive, directory / f"{stem}.cdx.json")]
    sums = write_checksums(directory, files)
    files.append(sums)
    signed = signing_key is not None
    if signing_key is not None:
        files.append(sign(sums, signing_key))
    return Release(version, directory, tuple(files), signed)


def main(argv: list[str] | None = None) -> int:
    """``python -m agentrun_dev.dist [PROJECT] [--out DIR] [--signing-key KEY]`` builds the
    release; ``--set-version X.Y.Z`` only rewrites the version."""
    parser = argparse.ArgumentParser(prog="python -m agentrun_dev.dist", description=__doc__)
    parser.add_argument("project", nargs="?", default=".", type=Path)
    parser.add_argument("--out", type=Path, default=Path("dist"))
    parser.add_argument("--signing-key", type=Path, help="SSH private key signing SHA256SUMS")
    parser.add_argument("--set-version", metavar="X.Y.Z")
    args = parser.parse_args(argv)
    project = args.project.resolve()
    try:
        if args.set_version:
            set_version(project, args.set_version)
            print(f"version {args.set_version}: pyproject.toml, devtools, Chart.yaml")
            return 0
        built = build_release(project, args.out.resolve(), signing_key=args.signing_key)
    except (ReleaseError, image.ImageError, helm.HelmError, gobuild.BuildError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"agentrun {built.version} in {built.directory}:")
    for path in built.files:
        print(f"  {path.name}  ({path.stat().st_size / 1e6:.1f} MB)")
    if not built.signed:
        print("  not signed: pass --signing-key (make release SIGNING_KEY=path) to sign")
    return 0


if __name__ == "__main__":
    sys.exit(main())
