"""`nkibuild clean` removes only what nkibuild wrote: a build dir marked as its own that
holds no sources, never through a symbolic link, and from a dist dir only the project's
own wheels (issue 30, class 5)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import failed, ok, softmax_manifest, softmax_project

from nkibuild.cli.clean import clean
from nkibuild.errors import UsageError
from nkibuild.session import acquire_build_lock

MANIFEST = softmax_manifest("{name: tidy-kernels, version: 1.0.0, split-targets: true}")
OWN = ["tidy_kernels-1.0.0-py3-none-any.whl", "tidy_kernels_trn1-1.0.0-py3-none-any.whl"]
OWN.append("tidy_kernels_trn2-1.0.0-py3-none-any.whl")
# A shared wheelhouse: other projects', other tools', this project's older release, notes.
OTHERS = [
    "numpy-2.0.0-cp311-cp311-manylinux_2_17_x86_64.whl",
    "other_kernels-1.0.0-py3-none-any.whl",
    "tidy_kernels-0.9.0-py3-none-any.whl",
    "README.txt",
    ".hidden",
]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return softmax_project(tmp_path / "p", MANIFEST)


def marked(directory: Path) -> Path:
    """A build dir as nkibuild leaves it: its lock file in state/, some outputs."""
    acquire_build_lock(directory).release()
    (directory / "compile" / "k").mkdir(parents=True)
    (directory / "compile" / "k" / "model.neff").write_bytes(b"neff")
    return directory


def files_under(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def wheelhouse(directory: Path, names: list[str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text(name)
    return directory


def test_a_marked_build_dir_and_the_projects_wheels_are_removed(project: Path) -> None:
    marked(project / "build")
    wheelhouse(project / "dist", OWN)
    printed = ok(run_nkibuild(["clean", "--all"], project)).stdout.splitlines()
    assert printed == ["removed build", "removed dist"]
    assert sorted(p.name for p in project.iterdir()) == ["kernels", "nkibuild.yaml"]


def test_a_shared_wheelhouse_keeps_every_file_but_the_projects_wheels(project: Path) -> None:
    dist = wheelhouse(project / "wheelhouse", OWN + OTHERS)
    (dist / "sub").mkdir()
    (dist / "sub" / OWN[0]).write_text("a copy the user keeps")
    (dist / OWN[1]).unlink()
    (dist / OWN[1]).symlink_to(project / "kernels" / "reference.py")  # a link, not a wheel
    (dist / OWN[2]).unlink()
    (dist / OWN[2]).mkdir()  # a directory of that name
    removed = clean(project / "build", dist, project / "nkibuild.yaml")
    assert removed == [f"removed {dist / OWN[0]}"]
    assert sorted(p.name for p in dist.iterdir()) == sorted([*OWN[1:], *OTHERS, "sub"])
    assert all((dist / n).read_text() == n for n in OTHERS)
    assert (project / "kernels" / "reference.py").is_file()


@pytest.mark.parametrize("target", ["outside", "inside", "sources", "dangling"])
def test_a_symlinked_build_dir_is_refused_and_nothing_is_removed(
    project: Path, tmp_path: Path, target: str
) -> None:
    places = {
        "outside": marked(tmp_path / "elsewhere"),
        "inside": marked(project / "real-build"),
        "sources": project / "kernels",
        "dangling": tmp_path / "nowhere",
    }
    (project / "build").symlink_to(places[target])
    wheelhouse(project / "dist", OWN)
    before = {p: files_under(p) for p in (tmp_path, project)}
    result = failed(run_nkibuild(["clean", "--all"], project), 2)
    assert f"build is a symbolic link (to {places[target]})" in result.stderr
    assert "removes nothing through one" in result.stderr
    assert {p: files_under(p) for p in (tmp_path, project)} == before
    assert (project / "build").is_symlink()


@pytest.mark.parametrize("build_dir", [".", "kernels", "..", "kernels/.."])
def test_a_build_dir_holding_the_sources_is_refused_even_if_marked(
    project: Path, build_dir: str
) -> None:
    directory = project / build_dir
    acquire_build_lock(directory).release()  # a build was once run with this --build-dir
    before = files_under(project.parent)
    with pytest.raises(UsageError, match="holds the project's sources"):
        clean(directory, None, project / "nkibuild.yaml")
    assert files_under(project.parent) == before


@pytest.mark.parametrize("content", ["user files", "empty", "state linked", "state a file"])
def test_a_build_dir_nkibuild_did_not_mark_is_refused(
    project: Path, tmp_path: Path, content: str
) -> None:
    directory = project / "scratch"
    directory.mkdir()
    if content == "user files":
        (directory / "notes.txt").write_text("mine")
        (directory / "state").mkdir()
        (directory / "state" / "data.json").write_text("{}")
    elif content == "state linked":  # a marked state dir elsewhere does not mark this one
        (directory / "state").symlink_to(marked(tmp_path / "other") / "state")
    elif content == "state a file":
        (directory / "state").write_text("build.lock")
    before = files_under(tmp_path)
    result = failed(run_nkibuild(["clean", "--build-dir", "scratch"], project), 2)
    assert "scratch is not an nkibuild build dir" in result.stderr
    assert files_under(tmp_path) == before and directory.is_dir()


def test_a_symlinked_dist_dir_is_refused_before_anything_is_removed(
    project: Path, tmp_path: Path
) -> None:
    marked(project / "build")
    (project / "dist").symlink_to(wheelhouse(tmp_path / "wheels", OWN + OTHERS))
    with pytest.raises(UsageError, match="dist is a symbolic link"):
        clean(project / "build", project / "dist", project / "nkibuild.yaml")
    assert (project / "build" / "compile" / "k" / "model.neff").is_file()
    assert sorted(os.listdir(tmp_path / "wheels")) == sorted(OWN + OTHERS)


def test_a_broken_manifest_still_lets_clean_remove_the_build_dir(project: Path) -> None:
    marked(project / "build")
    wheelhouse(project / "dist", OWN)
    (project / "nkibuild.yaml").write_text("format-version: 1\npackage: [\n")
    # --all needs the manifest to know its wheels: refused whole, nothing removed.
    assert "nkibuild.yaml" in failed(run_nkibuild(["clean", "--all"], project), 2).stderr
    assert (project / "build").is_dir() and len(list((project / "dist").iterdir())) == 3
    assert ok(run_nkibuild(["clean"], project)).stdout.splitlines() == ["removed build"]
    assert sorted(os.listdir(project / "dist")) == sorted(OWN)
