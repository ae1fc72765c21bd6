"""``make release``'s parts that need neither root nor the images: one version for the wheel,
the image tag and the chart; the chart packaged at it; checksums ``sha256sum -c`` accepts; an
SSH signature that verifies against the publisher's key and not after a change."""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml

from agentrun_dev import dist, helm

REPO = Path(__file__).resolve().parents[2]


def test_the_chart_says_the_project_s_version() -> None:
    dist.check_chart_version(REPO)  # raises naming both when they differ


def test_set_version_rewrites_every_copy_and_a_mismatch_is_named(tmp_path: Path) -> None:
    project = tmp_path / "checkout"
    (project / "devtools").mkdir(parents=True)
    (project / "charts").mkdir()
    shutil.copy(REPO / "pyproject.toml", project / "pyproject.toml")
    shutil.copy(REPO / "devtools" / "pyproject.toml", project / "devtools" / "pyproject.toml")
    shutil.copytree(REPO / "charts" / "agentrun", project / "charts" / "agentrun")
    dist.set_version(project, "1.2.3")
    assert dist.project_version(project) == "1.2.3"
    dist.check_chart_version(project)
    chart = yaml.safe_load((project / "charts" / "agentrun" / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == ("1.2.3", "1.2.3")
    assert 'version = "1.2.3"' in (project / "devtools" / "pyproject.toml").read_text()
    (project / "pyproject.toml").write_text(
        (project / "pyproject.toml").read_text().replace('"1.2.3"', '"1.2.4"', 1)
    )
    with pytest.raises(dist.ReleaseError, match=r"pyproject\.toml 1\.2\.4"):
        dist.check_chart_version(project)
    with pytest.raises(dist.ReleaseError, match="not a SemVer"):
        dist.set_version(project, "v1")


def test_the_chart_package_carries_the_version_and_the_crds(
    helm_binary: Path, tmp_path: Path
) -> None:
    runner = helm.Helm(helm_binary, home=tmp_path / "home")
    package = dist.package_chart(runner, REPO, tmp_path, version="9.8.7")
    with tarfile.open(package) as archive:
        names = archive.getnames()
        chart = yaml.safe_load(archive.extractfile("agentrun/Chart.yaml").read())  # type: ignore[union-attr]
    assert (chart["version"], chart["appVersion"]) == ("9.8.7", "9.8.7")
    assert "agentrun/crds/agentrun.dev_agentruns.yaml" in names
    assert "agentrun/templates/user-roles.yaml" in names


def test_checksums_verify_and_the_signature_verifies_only_the_signed_sums(tmp_path: Path) -> None:
    release = tmp_path / "agentrun-9.8.7"
    release.mkdir()
    files = []
    for name, body in (("agentrun-9.8.7.tgz", b"chart"), ("image.docker.tar", b"layers")):
        (release / name).write_bytes(body)
        files.append(release / name)
    sums = dist.write_checksums(release, files)
    check = subprocess.run(["sha256sum", "-c", sums.name], cwd=release, capture_output=True,
                           text=True, check=False)  # fmt: skip
    assert check.returncode == 0 and check.stdout.count(": OK") == 2
    key = tmp_path / "release-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "release@agentrun",
                    "-f", str(key)], check=True)  # fmt: skip
    signature = dist.sign(sums, key)
    assert signature.name == "SHA256SUMS.sig"
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"release@agentrun {key.with_suffix('.pub').read_text()}")
    assert dist.verify(sums, allowed_signers=signers, identity="release@agentrun")
    assert not dist.verify(sums, allowed_signers=signers, identity="someone@else")
    sums.write_text(sums.read_text().replace("  image", "  other"))
    assert not dist.verify(sums, allowed_signers=signers, identity="release@agentrun")
