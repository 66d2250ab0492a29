"""The cold build's start-up path: what it computes instead of asking doit must agree
with doit, and a first build reports a manifest as a later one does."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project

from nkibuild.context import load_context
from nkibuild.errors import UsageError
from nkibuild.graph.loader import to_tasks
from nkibuild.graph.run import check_selection, task_names
from nkibuild.graph.tasks import task_dicts
from nkibuild.settings import BuildOptions


@pytest.fixture
def dicts(example_project: Path, tmp_path: Path) -> list[dict]:
    context = load_context(
        example_project / "nkibuild.yaml",
        tmp_path / "build",
        tmp_path / "dist",
        BuildOptions("fake"),
    )
    return task_dicts(context)


def test_task_names_are_the_names_doit_gives(dicts: list[dict]) -> None:
    names = task_names(dicts)
    assert sorted(names) == sorted(task.name for task in to_tasks(dicts, []))
    assert len(names) == len(set(names))  # one group task per basename
    assert {"extract", "compile", "bundle", "wheel"} <= set(names)


def test_selection_by_group_pattern_and_subtask_is_accepted(dicts: list[dict]) -> None:
    check_selection(dicts, ["compile", "compile:*", "extract:*", "wheel"])


def test_unknown_selection_names_close_tasks(dicts: list[dict]) -> None:
    with pytest.raises(UsageError, match=r"no task matches 'compil'; did you mean compile"):
        check_selection(dicts, ["compil"])


def test_a_first_build_reports_a_manifest_in_error_as_a_later_one(tmp_path: Path) -> None:
    manifest = softmax_manifest(kernel="    dtype: float33\n")
    project = softmax_project(tmp_path / "p", manifest)
    first = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert not (project / "build" / "state").exists()  # a first build, then a later one
    (project / "build" / "state").mkdir(parents=True)
    later = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert (first.returncode, first.stdout, first.stderr) == (
        later.returncode,
        later.stdout,
        later.stderr,
    )
    assert first.returncode == 2
    assert "nkibuild.yaml:10:5: " in first.stderr
    assert "unknown key 'dtype'" in first.stderr
