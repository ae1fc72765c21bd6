"""``make release`` end to end: the release directory holds the chart package, both image
archives and a CycloneDX SBOM of each that names what the image really carries (Debian
packages and Python distributions of the agentrun image, nats-server's Go modules), and
``SHA256SUMS`` over all of them that ``sha256sum -c`` accepts, signed when a key is given.

syft is built once per machine from the Go module proxy (like helm), which a cold machine
pays for once."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agentrun_dev import dist

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(3600)


def components(sbom: Path) -> dict[str, set[str]]:
    """The SBOM's component names by the package type syft found them as (``deb``,
    ``python``, ``go-module``, …); a Debian package must carry its purl too."""
    data = json.loads(sbom.read_text())
    assert data["bomFormat"] == "CycloneDX" and data["specVersion"].startswith("1.")
    found: dict[str, set[str]] = {}
    for component in data.get("components", []):
        props = {p["name"]: p["value"] for p in component.get("properties", [])}
        kind = props.get("syft:package:type")
        if kind is None:
            continue
        if kind == "deb":
            assert str(component.get("purl", "")).startswith("pkg:deb/"), component
        found.setdefault(kind, set()).add(str(component["name"]))
    return found


@pytest.mark.usefixtures("helm_binary", "natscli_binary", "syft_binary")  # what it builds with
def test_make_release_builds_a_verifiable_release(tmp_path: Path) -> None:
    key = tmp_path / "release-key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "release@agentrun",
                    "-f", str(key)], check=True)  # fmt: skip
    built = dist.build_release(REPO_ROOT, tmp_path / "dist", signing_key=key, log=print)
    version = dist.project_version(REPO_ROOT)
    names = {path.name for path in built.files}
    expected = {f"agentrun-{version}.tgz", f"agentrun-image-{version}.docker.tar",
                f"agentrun-{version}-py3-none-any.whl",
                f"agentrun-image-{version}.cdx.json", "SHA256SUMS", "SHA256SUMS.sig"}  # fmt: skip
    assert expected <= names
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=built.directory,
                           capture_output=True, text=True, check=False)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == len(built.files) - 2  # all but the sums and signature
    signers = tmp_path / "allowed_signers"
    signers.write_text(f"release@agentrun {key.with_suffix('.pub').read_text()}")
    assert dist.verify(built.directory / "SHA256SUMS", allowed_signers=signers,
                       identity="release@agentrun")  # fmt: skip

    agentrun = components(built.directory / f"agentrun-image-{version}.cdx.json")
    assert {"python3.11-minimal", "libpython3.11-stdlib", "libc6", "libssl3"} <= agentrun.get(
        "deb", set()
    )
    assert {"agentrun", "kopf", "openai", "nats-py"} <= agentrun.get("python", set())
    (nats_sbom,) = [p for p in built.files if p.name.startswith("agentrun-nats-image-")
                    and p.name.endswith(".cdx.json")]  # fmt: skip
    assert "github.com/nats-io/nats-server/v2" in components(nats_sbom).get("go-module", set())
