"""Tasks the up-to-date proof hands to doit, told which inputs may have changed
(graph/handover.py): doit decides as it would, skipping the comparison of the rest."""

from __future__ import annotations

import os
from pathlib import Path

from doit.dependency import Dependency, MD5Checker
from doit.task import Task

from nkibuild.graph.handover import InputsChanged, UnlessInputsChanged
from nkibuild.graph.intact import OutputsIntact
from nkibuild.graph.state import AtomicJsonDB


def saved_task(tmp_path: Path, files: list[Path]) -> tuple[Dependency, Task]:
    for index, path in enumerate(files):
        path.write_text(f"content {index}")
    task = Task("bundle", None, file_dep=[str(path) for path in files])
    manager = Dependency(AtomicJsonDB, str(tmp_path / "state.json"), checker_cls=MD5Checker)
    manager.save_success(task)
    return manager, task


def checked(manager: Dependency, task: Task, candidates: list[Path]) -> bool | None:
    check = InputsChanged([str(path) for path in candidates])
    check.setup(manager, {task.name: task})
    return check(task, {})


def test_a_changed_candidate_runs_the_task_as_doit_would(tmp_path: Path) -> None:
    files = [tmp_path / f"record{index}.json" for index in range(4)]
    manager, task = saved_task(tmp_path, files)
    assert checked(manager, task, files[:2]) is None  # as saved: doit decides
    files[3].write_text("changed, but not a candidate")
    assert checked(manager, task, files[:2]) is None
    assert manager.get_status(task, {task.name: task}).status == "run"  # doit sees it
    files[1].write_text("changed content")
    assert checked(manager, task, files[:2]) is False
    assert manager.get_status(task, {task.name: task}).status == "run"


def test_a_touched_candidate_decides_nothing(tmp_path: Path) -> None:
    files = [tmp_path / "record.json", tmp_path / "source.pb"]
    manager, task = saved_task(tmp_path, files)
    os.utime(files[0], ns=(1, 1))  # new timestamp, same content: doit's md5 says unchanged
    assert checked(manager, task, files) is None
    assert manager.get_status(task, {task.name: task}).status == "up-to-date"


def test_missing_or_never_saved_candidates(tmp_path: Path) -> None:
    files = [tmp_path / "record.json"]
    manager, task = saved_task(tmp_path, files)
    files[0].unlink()
    assert checked(manager, task, files) is None  # doit's own check reports it missing
    new = tmp_path / "new.json"
    new.write_text("a file_dep the task never saved")
    assert checked(manager, task, [new]) is False


def test_a_task_that_runs_anyway_skips_its_outputs_check(tmp_path: Path) -> None:
    files = [tmp_path / "record.json"]
    manager, task = saved_task(tmp_path, files)
    looked: list[str] = []

    class Counted(OutputsIntact):
        def __call__(self, task: Task, values: dict) -> bool | None:
            looked.append(task.name)
            return True

    inputs = InputsChanged([str(files[0])])
    inputs.setup(manager, {task.name: task})
    outputs = UnlessInputsChanged(Counted(()), inputs)
    assert (inputs(task, {}), outputs(task, {})) == (None, True)  # nothing found: it looks
    files[0].write_text("changed content")
    assert (inputs(task, {}), outputs(task, {})) == (False, None)  # runs anyway: skipped
    assert looked == ["bundle"]
