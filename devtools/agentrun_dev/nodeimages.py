"""The small images a node needs, built here: the pod sandbox (pause) and a busybox image.

No registry is reachable and no fetched code is committed, so:

- pause: `PAUSE_SOURCE`, a few lines of C written here (sleep until SIGINT / SIGTERM, reap
  children), compiled with ``gcc -static`` into an image holding only ``/pause``.
- busybox: Debian's statically linked ``/bin/busybox`` (package ``busybox-static``) with a
  symlink per applet in ``/bin``, so ``sh``, ``httpd``, ``wget``, ``nslookup`` … exist.

`build_rootfs_image` is the generic step: a root filesystem directory → a ``docker-archive``
tarball tagged with the image name (buildah ``from scratch``, ``copy``, ``config``, ``commit``,
with a private vfs storage in a temporary directory, so nothing is mounted and nothing is
left in the host's container storage). Archives are cached under
``<cache root>/images/node/`` by a hash of their inputs; `containerd.import_image` loads them.

What belongs here: building these archives. Importing them is `containerd`'s job.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from agentrun_dev import binaries, console

PAUSE_IMAGE = "agentrun.dev/pause:3.10"
"""The node's ``sandbox_image``."""
BUSYBOX_IMAGE = "agentrun.dev/busybox:1.35"
"""Busybox from Debian 12's ``busybox-static`` (1.35)."""
BUSYBOX_BINARY = Path("/bin/busybox")
PAUSE_SOURCE = """\
/* The pod sandbox's process: hold the pod's namespaces until told to stop. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, 0, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction quit = {.sa_handler = stop};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  sigaction(SIGINT, &quit, 0);
  sigaction(SIGTERM, &quit, 0);
  sigaction(SIGCHLD, &child, 0);
  for (;;) pause();
}
"""
_TIMEOUT = 600.0


class ImageBuildError(RuntimeError):
    """gcc or buildah is missing or failed; the message says which and what to install."""


@dataclasses.dataclass(frozen=True, slots=True)
class ImageArchive:
    """A built image archive."""

    name: str
    """``repository:tag`` inside the archive."""
    archive: Path


def pause_image(*, log: console.Log = console.log_to_stderr) -> ImageArchive:
    """The pause image archive, from the cache or built now (needs gcc and buildah).

    Raises ImageBuildError.
    """
    key = _key(PAUSE_IMAGE.encode(), PAUSE_SOURCE.encode())
    return _cached(PAUSE_IMAGE, key, build=_build_pause, log=log)


def busybox_image(*, log: console.Log = console.log_to_stderr) -> ImageArchive:
    """The busybox image archive, from the cache or built now (needs busybox-static, buildah).

    Raises ImageBuildError if ``/bin/busybox`` is missing or the build fails.
    """
    if not BUSYBOX_BINARY.is_file():
        raise ImageBuildError(f"{BUSYBOX_BINARY} missing: apt-get install busybox-static")
    key = _key(BUSYBOX_IMAGE.encode(), b"cmd sh", BUSYBOX_BINARY.read_bytes())
    return _cached(BUSYBOX_IMAGE, key, build=_build_busybox, log=log)


def build_rootfs_image(
    rootfs: Path,
    *,
    name: str,
    archive: Path,
    entrypoint: Sequence[str] = (),
    cmd: Sequence[str] = (),
    log: console.Log = console.log_to_stderr,
) -> ImageArchive:
    """Build an image of exactly `rootfs` (its contents at ``/``) into `archive`.

    Args:
        rootfs: directory copied into an empty (``scratch``) image.
        name: ``repository:tag`` recorded in the archive (what ``ctr images import`` names it).
        archive: the ``docker-archive`` tarball to write (replaced atomically).
        entrypoint: the image's entrypoint, e.g. ``["/pause"]``; empty for none.
        cmd: its default command (Kubernetes' ``args`` replace it), e.g. ``["sh"]``.
        log: receives progress lines.

    Raises:
        ImageBuildError: buildah is missing or a buildah command failed.
    """
    buildah = shutil.which("buildah")
    if buildah is None:
        raise ImageBuildError("buildah not found: install the node's Debian packages")
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.partial-{os.getpid()}")
    with tempfile.TemporaryDirectory(prefix="agentrun-buildah-") as tmp:
        store = [f"--root={tmp}/root", f"--runroot={tmp}/run", "--storage-driver=vfs"]

        def run(*args: str) -> str:
            return _output([buildah, *store, *args], what=f"`buildah {' '.join(args)}`")

        log(f"building image {name} with buildah")
        container = run("from", "--name", "agentrun-image", "scratch")
        run("copy", container, f"{rootfs}/", "/")
        settings = []
        if entrypoint:
            settings += ["--entrypoint", json.dumps(list(entrypoint))]
        if cmd:
            settings += ["--cmd", json.dumps(list(cmd))]
        if settings:
            run("config", *settings, container)
        try:
            run("commit", "--quiet", container, f"docker-archive:{partial}:{name}")
            os.replace(partial, archive)
        finally:
            partial.unlink(missing_ok=True)
    log(f"image {name}: {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
    return ImageArchive(name=name, archive=archive)


def _output(argv: list[str], *, what: str) -> str:
    """Run `argv` (at most ``_TIMEOUT`` seconds); its stdout, stripped. Raises ImageBuildError
    naming `what` with the command's stderr when it exits non-zero."""
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=_TIMEOUT)
    if result.returncode != 0:
        raise ImageBuildError(f"{what} failed: {result.stderr}")
    return result.stdout.strip()


def _build_pause(work: Path, archive: Path, *, log: console.Log) -> ImageArchive:
    gcc = shutil.which("gcc")
    if gcc is None:
        raise ImageBuildError("gcc not found: apt-get install gcc libc6-dev")
    rootfs = work / "rootfs"
    rootfs.mkdir()
    (work / "pause.c").write_text(PAUSE_SOURCE)
    _output(
        [gcc, "-static", "-Os", "-s", "-o", str(rootfs / "pause"), str(work / "pause.c")],
        what="gcc -static pause.c",
    )
    return build_rootfs_image(
        rootfs, name=PAUSE_IMAGE, archive=archive, entrypoint=["/pause"], log=log
    )


def _build_busybox(work: Path, archive: Path, *, log: console.Log) -> ImageArchive:
    rootfs = work / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "tmp").mkdir(mode=0o1777)
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")
    (rootfs / "etc" / "group").write_text("root:x:0:\n")
    shutil.copy2(BUSYBOX_BINARY, rootfs / "bin" / "busybox")
    listed = subprocess.run(
        [str(BUSYBOX_BINARY), "--list"], capture_output=True, text=True, check=True, timeout=60
    )
    for applet in listed.stdout.split():
        link = rootfs / "bin" / applet
        if not link.exists():
            link.symlink_to("busybox")
    return build_rootfs_image(rootfs, name=BUSYBOX_IMAGE, archive=archive, cmd=["sh"], log=log)


def _cached(name: str, key: str, *, build: _Builder, log: console.Log) -> ImageArchive:
    repository, _, tag = name.rpartition(":")
    directory = binaries.cache_root() / "images" / "node"
    archive = directory / f"{repository.rsplit('/', 1)[-1]}-{tag}-{key[:16]}.tar"
    if archive.is_file():
        return ImageArchive(name=name, archive=archive)
    with binaries.build_lock(directory, what=f"the image {name}", log=log):
        if archive.is_file():
            return ImageArchive(name=name, archive=archive)
        with tempfile.TemporaryDirectory(prefix="agentrun-image-") as tmp:
            return build(Path(tmp), archive, log=log)


class _Builder(Protocol):
    """``build(work_dir, archive, *, log) -> ImageArchive``."""

    def __call__(self, work: Path, archive: Path, *, log: console.Log) -> ImageArchive: ...


def _key(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
