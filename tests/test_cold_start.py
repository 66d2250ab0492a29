"""The cold build's start-up path: what it computes instead of asking doit must agree
with doit."""

from __future__ import annotations

from pathlib import Path

import pytest

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
