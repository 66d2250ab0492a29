"""Tasks the up-to-date proof hands to doit, told which inputs may have changed
(graph/handover.py): doit decides as it would, skipping the comparison of the rest."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from doit.dependency import Dependency, MD5Checker
from doit.task import Task

from nkibuild.fsutil import stat_stamp
from nkibuild.graph import uptodate
from nkibuild.graph.handover import InputsChanged, UnlessInputsChanged, proof_checker, st_mtime
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


def test_st_mtime_is_pythons_own(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("x")
    for ns in (1_795_479_363_268_452_468, 1, 999_999_999, -1, -(10**9) - 7, 10**18 + 3):
        os.utime(path, ns=(ns, ns))
        assert st_mtime(stat_stamp(str(path))) == path.stat().st_mtime, ns


def test_the_proof_checker_keeps_what_doit_would_without_a_stat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = {name: tmp_path / name for name in ("proven", "edited", "written")}
    for path in sources.values():
        path.write_text("v1")
    out = tmp_path / "out"
    out.write_text("o")
    edited, written = str(sources["edited"]), str(sources["written"])
    dicts = [
        {"basename": "w", "file_dep": [edited], "targets": [written]},
        {"basename": "t", "file_dep": [str(p) for p in sources.values()], "targets": [str(out)]},
    ]
    dep_file = str(tmp_path / "doit-state.json")
    Path(dep_file).write_text("")
    first = uptodate.decide(tmp_path, dicts, dep_file)
    assert proof_checker(first) is MD5Checker  # no proof yet: doit's own checker
    uptodate.record(tmp_path, first, dict.fromkeys(first.pending, time.time_ns()), dep_file)
    sources["edited"].write_text("v2")
    decision = uptodate.decide(tmp_path, dicts, dep_file)
    assert decision.pending == ["w", "t"]
    checker = proof_checker(decision)()
    assert type(checker).__name__ == "MD5Checker"  # as doit saves it with each task
    saved = {name: MD5Checker().get_state(str(path), None) for name, path in sources.items()}

    def no_stat(path: str) -> float:
        raise AssertionError(f"{path} stat'ed")

    with monkeypatch.context() as patched:
        patched.setattr(os.path, "getmtime", no_stat)
        assert checker.get_state(str(sources["proven"]), saved["proven"]) is None
    # Seen changed when deciding, written by a handed task, never saved, or saved with
    # another timestamp: doit's own answer.
    for name in ("edited", "written"):
        assert checker.get_state(str(sources[name]), saved[name]) == MD5Checker().get_state(
            str(sources[name]), saved[name]
        )
    assert checker.get_state(str(sources["proven"]), None) == saved["proven"]
    older = [saved["proven"][0] - 1, *saved["proven"][1:]]
    assert checker.get_state(str(sources["proven"]), older) == saved["proven"]
