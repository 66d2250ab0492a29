"""An input that changes while the task reading it runs is never recorded as built
(issue 30, class 2): the task runs again, or stays out of date for the next build.

The edits are made by the task's own code at a known moment (a JAX kernel rewriting
its source or helper while the frontend worker traces it; the bundle stage or doit's
state save wrapped to edit a file), so nothing depends on timing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import build, softmax_manifest, softmax_project, write_project

from nkibuild.graph.intact import INPUTS_KEY, OutputsIntact, read_unchanged

pytest.importorskip("jax")

# A JAX kernel that, while traced, saves a file of its project anew for the first line
# of `saves` ("<file> <old> <new>", the test's editor), and drops that line.
KERNEL = """\
from pathlib import Path

import helper

SCALE = 2.0
SAVES = Path(__file__).parent / "saves"
lines = SAVES.read_text().splitlines() if SAVES.exists() else []
if lines:
    SAVES.write_text("".join(line + "\\n" for line in lines[1:]))
    name, old, new = lines[0].split()
    edited = Path(__file__).parent / name
    edited.write_text(edited.read_text().replace(old, new))


def scale(x):
    return helper.times(x, SCALE)
"""
HELPER = "def times(x, factor):\n    return x * factor * 2.0\n"
MANIFEST = """\
format-version: 1
package: {name: edited, version: 0.1.0}
defaults: {targets: [trn2]}
kernels:
  scale:
    frontend: jax
    source: kernels/kernel.py:scale
    deps: [kernels/helper.py]
    inputs:
      x: {shape: [8, 8], dtype: float32}
"""


def jax_project(root: Path, saves: str = "") -> Path:
    files = {"kernels/kernel.py": KERNEL, "kernels/helper.py": HELPER}
    return write_project(root, MANIFEST, {**files, **({"kernels/saves": saves} if saves else {})})


def extracted_hash(project: Path) -> str:
    artifact = project / "build/extract/scale/default/artifact.json"
    return json.loads(artifact.read_text())["content_hash"]


def clean_hash(root: Path, edited: str) -> str:
    """The HLO of a clean build of the project as it is after `edited` was saved."""
    project = jax_project(root)
    path = project / "kernels" / edited
    path.write_text(path.read_text().replace("2.0", "3.0"))
    assert build(project, "extract:*").ok
    return extracted_hash(project)


@pytest.mark.parametrize("edited", ["kernel.py", "helper.py"])
def test_a_file_saved_while_it_is_traced_is_traced_again(tmp_path: Path, edited: str) -> None:
    project = jax_project(tmp_path / "p", saves=f"{edited} 2.0 3.0\n")
    summary = build(project, "extract:*")
    assert summary.ok, summary.to_json()
    assert (project / "kernels/saves").read_text() == ""  # it was saved during the build
    assert "3.0" in (project / "kernels" / edited).read_text()
    # What was extracted and recorded is the saved file's HLO, not the one read before.
    assert extracted_hash(project) == clean_hash(tmp_path / "clean", edited)
    assert build(project, "extract:*").executed == []


def test_a_file_saved_during_every_run_fails_the_task_and_records_nothing(
    tmp_path: Path,
) -> None:
    saves = "kernel.py 2.0 3.0\nhelper.py 2.0 4.0\nkernel.py 3.0 5.0\nhelper.py 4.0 6.0\n"
    project = jax_project(tmp_path / "p", saves=saves)
    summary = build(project, "extract:*")
    assert not summary.ok
    (failure,) = summary.failures
    assert failure.name == "extract:scale/default"
    assert "changed while extract:scale/default read it, 3 times in a row" in failure.detail
    assert "Traceback" not in failure.detail
    assert (project / "kernels/saves").read_text() == "helper.py 4.0 6.0\n"  # three runs
    # Nothing was recorded: the next build (the files now still) runs it and succeeds.
    (project / "kernels/saves").unlink()
    again = build(project, "extract:*")
    assert again.ok and again.executed == ["extract:scale/default"]
    assert build(project, "extract:*").executed == []


def test_a_save_after_the_task_ran_but_before_doit_recorded_it_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from doit.dependency import Dependency

    project = jax_project(tmp_path / "p")
    source = project / "kernels/kernel.py"
    real_save = Dependency.save_success

    def save_after_an_edit(self: Dependency, task: Any, *args: Any, **kwargs: Any) -> None:
        if task.name.startswith("extract:") and "2.0" in source.read_text():
            source.write_text(source.read_text().replace("2.0", "3.0"))  # the last moment
        real_save(self, task, *args, **kwargs)

    monkeypatch.setattr(Dependency, "save_success", save_after_an_edit)
    assert build(project, "extract:*").ok
    monkeypatch.undo()
    # doit recorded the saved file as the one it built from; the read record knows better.
    again = build(project, "extract:*")
    assert again.executed == ["extract:scale/default"]
    assert extracted_hash(project) == clean_hash(tmp_path / "clean", "kernel.py")
    assert build(project, "extract:*").executed == []


@pytest.mark.parametrize("saved", ["kernels/reference.py", "nkibuild.yaml"])
def test_a_file_the_bundle_ships_saved_while_it_runs_is_bundled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, saved: str
) -> None:
    import nkibuild.bundle

    project = softmax_project(tmp_path / "p", softmax_manifest(reference=True))
    real_run: Callable[..., Any] = nkibuild.bundle.run
    runs: list[int] = []

    def run_and_save(context: Any) -> Any:
        written = real_run(context)
        runs.append(1)
        if len(runs) == 1:  # the user saves once, while the first run writes the tree
            path = project / saved
            path.write_text(path.read_text() + "# saved during the bundle\n")
        return written

    monkeypatch.setattr(nkibuild.bundle, "run", run_and_save)
    summary = build(project, "bundle")
    assert summary.ok, summary.to_json()
    assert len(runs) == 2
    monkeypatch.undo()
    bundle = project / "build/bundle/softmax-kernels/softmax_kernels"
    if saved.endswith(".py"):
        shipped = (bundle / "reference/kernels_reference.py").read_text()
        assert shipped.endswith("# saved during the bundle\n")
    assert build(project, "bundle").executed == []


def test_the_read_record_is_checked_like_an_output(tmp_path: Path) -> None:
    source = tmp_path / "k.py"
    source.write_text("a = 1\n")
    values = read_unchanged(lambda: {"x": 1}, (), [str(source)], "t")
    assert values["x"] == 1
    check = OutputsIntact([str(source)], key=INPUTS_KEY)
    assert check(None, values) is True
    source.write_text("a = 1\n")  # saved again, the same bytes: still what was read
    assert check(None, values) is True
    source.write_text("a = 2\n")
    assert check(None, values) is False
    source.unlink()
    assert check(None, values) is False
    assert check(None, {}) is None  # never ran: doit's other checks decide


def test_an_input_removed_while_the_task_runs_is_a_clean_failure(tmp_path: Path) -> None:
    from doit.exceptions import TaskFailed

    source = tmp_path / "k.py"
    source.write_text("a = 1\n")
    result = read_unchanged(source.unlink, (), [str(source)], "t")
    assert isinstance(result, TaskFailed)
    assert f"{source}: No such file or directory" in result.message
