"""The images `make image` builds: the agentrun image runs its console scripts as uid 65532 on
a read-only root filesystem, carries the OCI labels, stays under 210 MB, and is not rebuilt
when nothing changed; the NATS image runs nats-server likewise.

Containers run with runc from the archive's own layers (unpacked into a temporary bundle,
runc's state in a temporary root), so nothing stays mounted or registered afterwards. The
first build takes minutes (Debian packages and wheels are fetched); later runs reuse the
cached archive.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tomllib
import uuid
from pathlib import Path

import pytest

from agentrun_dev import image, natsserver

REPO_ROOT = Path(__file__).resolve().parents[2]
SIZE_LIMIT = 210_000_000
"""Bytes of the agentrun image's archive: 200 MB until google-re2 (the linear-time engine
for users' patterns) and the C++ runtime it links (libstdc++6) came in, at about 202 MB."""
pytestmark = pytest.mark.timeout(1800)


@pytest.fixture(scope="module")
def images(natscli_binary: Path) -> image.ProjectImages:
    """Both images, built now or taken from the cache (the NATS image carries the pinned
    `natscli_binary`)."""
    del natscli_binary  # asked for by name: built after collection, the test marked for it
    return image.build_project_images(REPO_ROOT, log=print)


@pytest.fixture(scope="module")
def unpacked(
    images: image.ProjectImages, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """Each image's layers unpacked once: ``{"agentrun": rootfs, "nats": rootfs}``. The
    containers mount them read-only, so the tests can share them."""
    roots = {}
    for which in ("agentrun", "nats"):
        root = tmp_path_factory.mktemp(f"rootfs-{which}")
        root.chmod(0o755)  # the image's "/", which uid 65532 must traverse
        image.extract_rootfs(getattr(images, which).archive, root)
        roots[which] = root
    return roots


def run_in_container(
    archive: Path, rootfs: Path, argv: list[str], *, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Run `argv` with runc on `rootfs` (the unpacked `archive`) as the image's User, with its
    Env and WorkingDir: the root read-only, a writable /tmp, no network but loopback."""
    bundle = tmp_path / f"bundle-{uuid.uuid4().hex[:8]}"
    bundle.mkdir()
    config = image.image_config(archive)["config"]
    assert isinstance(config, dict)
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True)
    spec = json.loads((bundle / "config.json").read_text())
    uid, gid = (int(part) for part in str(config["User"]).split(":"))
    spec["process"].update(
        terminal=False,
        args=argv,
        env=config.get("Env", []),
        cwd=config.get("WorkingDir") or "/",
        user={"uid": uid, "gid": gid},
    )
    spec["root"] = {"path": str(rootfs), "readonly": True}
    scratch = bundle / "tmp"  # like a pod's emptyDir: a host directory anyone may write
    scratch.mkdir()
    scratch.chmod(0o1777)
    spec["mounts"].append(
        {"destination": "/tmp", "type": "bind", "source": str(scratch), "options": ["rbind", "rw"]}
    )
    spec["hostname"] = "image-test"
    (bundle / "config.json").write_text(json.dumps(spec))
    state = tmp_path / "runc-state"
    name = f"image-test-{uuid.uuid4().hex[:8]}"
    try:
        return subprocess.run(
            ["runc", "--root", str(state), "run", "--bundle", str(bundle), name],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    finally:
        shutil.rmtree(bundle, ignore_errors=True)


SMOKE = """
import errno, os
import agentrun.operator.main, agentrun.worker.main, agentrun.testing.mockllm
try:
    open("/usr/local/written", "w")
except OSError as exc:
    root = errno.errorcode[exc.errno]
else:
    root = "writable"
with open("/tmp/scratch", "w") as handle:
    handle.write("ok")
print(os.getuid(), os.getgid(), root, "tmp-ok")
"""


def test_the_agentrun_image_runs_as_65532_on_a_read_only_root(
    images: image.ProjectImages, unpacked: dict[str, Path], tmp_path: Path
) -> None:
    result = run_in_container(
        images.agentrun.archive,
        unpacked["agentrun"],
        ["python3.11", "-c", SMOKE],
        tmp_path=tmp_path,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["65532", "65532", "EROFS", "tmp-ok"]


@pytest.mark.parametrize(
    "script", ["agentrun", "agentrun-operator", "agentrun-worker", "kubectl-agentrun"]
)
def test_the_console_scripts_are_on_path(
    images: image.ProjectImages, unpacked: dict[str, Path], tmp_path: Path, script: str
) -> None:
    probe = f"import shutil; print(shutil.which({script!r}))"
    result = run_in_container(
        images.agentrun.archive,
        unpacked["agentrun"],
        ["python3.11", "-c", probe],
        tmp_path=tmp_path,
    )

    assert result.stdout.strip() == f"/usr/local/bin/{script}", result.stderr


def test_the_agentrun_cli_answers_help_inside_the_image(
    images: image.ProjectImages, unpacked: dict[str, Path], tmp_path: Path
) -> None:
    result = run_in_container(
        images.agentrun.archive, unpacked["agentrun"], ["agentrun", "--help"], tmp_path=tmp_path
    )

    assert result.returncode == 0, result.stderr
    assert "usage: agentrun" in result.stdout


IMPORT_ALL = """
import importlib, pkgutil, agentrun
names = [m.name for m in pkgutil.walk_packages(agentrun.__path__, "agentrun.")]
for name in names:
    if not name.endswith(".__main__"):
        importlib.import_module(name)
print(len(names))
"""
"""Imports every module of the installed runtime (not the ``__main__`` entry points)."""


def test_every_runtime_module_imports_inside_the_image(
    images: image.ProjectImages, unpacked: dict[str, Path], tmp_path: Path
) -> None:
    """A native wheel whose shared libraries the image lacks fails here, not in a pod: the
    console scripts' ``--help`` imports only part of the package."""
    result = run_in_container(
        images.agentrun.archive,
        unpacked["agentrun"],
        ["python3.11", "-c", IMPORT_ALL],
        tmp_path=tmp_path,
    )

    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 150


def test_the_kubectl_plugin_answers_help_inside_the_image(
    images: image.ProjectImages, unpacked: dict[str, Path], tmp_path: Path
) -> None:
    # `kubectl agentrun ...` runs the kubectl-agentrun console script found on PATH.
    result = run_in_container(
        images.agentrun.archive,
        unpacked["agentrun"],
        ["kubectl-agentrun", "--help"],
        tmp_path=tmp_path,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: kubectl agentrun")
    for command in ("get", "logs", "describe", "approve", "deny", "cancel", "rerun"):
        assert command in result.stdout


def test_the_agentrun_image_is_non_root_labelled_and_small(images: image.ProjectImages) -> None:
    config = image.image_config(images.agentrun.archive)["config"]
    assert isinstance(config, dict)
    version = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
    labels = config["Labels"]

    assert config["User"] == "65532:65532"
    assert labels["org.opencontainers.image.version"] == version
    assert labels["org.opencontainers.image.revision"] == image.git_revision(REPO_ROOT)
    assert labels["org.opencontainers.image.source"] == image.SOURCE_URL
    assert image.image_size(images.agentrun.archive) <= SIZE_LIMIT


@pytest.mark.parametrize("which", ["agentrun", "nats"])
def test_the_archive_is_tagged_with_the_name_the_chart_uses(
    images: image.ProjectImages, which: str
) -> None:
    built: image.BuiltImage = getattr(images, which)
    with tarfile.open(built.archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        manifest = json.load(member)

    assert manifest[0]["RepoTags"] == [built.name]


def test_the_nats_image_runs_nats_server_as_65532(
    images: image.ProjectImages, unpacked: dict[str, Path], tmp_path: Path
) -> None:
    config = image.image_config(images.nats.archive)["config"]
    assert isinstance(config, dict)
    release = image.nats_server_version(natsserver.find_nats_server())

    result = run_in_container(
        images.nats.archive,
        unpacked["nats"],
        [*config["Entrypoint"], "--version"],
        tmp_path=tmp_path,
    )

    assert config["User"] == "65532:65532"
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith(f"v{release}")


def test_unchanged_inputs_reuse_the_archive(images: image.ProjectImages) -> None:
    again = image.build_project_images(REPO_ROOT, log=print)

    assert (again.agentrun.cached, again.nats.cached) == (True, True)
    assert (again.agentrun.archive, again.nats.archive) == (
        images.agentrun.archive,
        images.nats.archive,
    )


def test_a_derived_image_adds_a_layer_and_keeps_the_base_s_configuration(
    images: image.ProjectImages, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """`image.derived_image`: the base with a directory and an environment variable more (how
    the node's upgrade test gives the workers a previous revision's package), its user, labels
    and command kept, built once for the same inputs and again for another file."""
    added = tmp_path_factory.mktemp("added")
    (added / "skewprobe.py").write_text("WHO = 'previous'\n")
    name = f"{image.AGENTRUN_REPOSITORY}:derived-test"

    def derive() -> image.BuiltImage:
        return image.derived_image(
            images.agentrun, name=name, add=[("/opt/probe", added)],
            env=[("PYTHONPATH", "/opt/probe")], log=print,
        )  # fmt: skip

    derived = derive()
    base_config = image.image_config(images.agentrun.archive)["config"]
    config = image.image_config(derived.archive)["config"]
    assert isinstance(base_config, dict) and isinstance(config, dict)
    assert (config["User"], config["Cmd"], config["Labels"]) == (
        base_config["User"], base_config["Cmd"], base_config["Labels"],
    )  # fmt: skip
    assert "PYTHONPATH=/opt/probe" in config["Env"]
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    rootfs.chmod(0o755)
    image.extract_rootfs(derived.archive, rootfs)
    script = "import skewprobe, agentrun.worker.main; print(skewprobe.WHO)"
    result = run_in_container(
        derived.archive, rootfs, ["python3.11", "-c", script], tmp_path=tmp_path
    )
    assert (result.returncode, result.stdout.strip()) == (0, "previous"), result.stderr
    again = derive()
    assert (again.cached, again.archive) == (True, derived.archive)
    (added / "skewprobe.py").write_text("WHO = 'other'\n")
    rebuilt = derive()
    assert not rebuilt.cached and rebuilt.archive != derived.archive
    assert not derived.archive.exists()
