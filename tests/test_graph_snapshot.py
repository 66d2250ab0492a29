"""The graph snapshot (build/state/graph.json): a build whose inputs all match runs doit on
the last build's tasks without loading the project; any input that changed, and any
snapshot that cannot be trusted, means the project is loaded and the snapshot written anew."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import softmax_manifest, softmax_project

from nkibuild.cli.main import main
from nkibuild.graph.snapshot import FORMAT

SNAPSHOT = Path("build/state/graph.json")


def build(project: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> dict:
    """`nkibuild build --toolchain fake --json` in `project`; its summary."""
    code = main(["-C", str(project), "build", "--toolchain", "fake", "--json", *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def snapshot_bytes(project: Path) -> bytes:
    return (project / SNAPSHOT).read_bytes()


def snapshot_written(project: Path) -> int:
    """The snapshot file's inode: each write renames a new file into place."""
    return (project / SNAPSHOT).stat().st_ino


@pytest.fixture
def built(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    manifest = softmax_manifest(kernel="    deps: [kernels/extra/*.txt]\n", reference=True)
    project = softmax_project(tmp_path / "p", manifest, {"kernels/extra/a.txt": "a"})
    build(project, capsys=capsys)
    # A first build keeps no snapshot if the reference it parsed was written within a
    # clock tick of it (it may have been saved after its parse): the second does.
    build(project, capsys=capsys)
    assert (project / SNAPSHOT).is_file()
    return project


def test_a_build_with_nothing_changed_reuses_the_snapshot(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot_written(built)
    summary = build(built, capsys=capsys)
    assert summary["executed"] == [] and len(summary["up_to_date"]) == 5
    assert snapshot_written(built) == before


def test_a_task_run_from_the_snapshot_loads_the_project_and_runs_its_stage(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot_written(built)
    neff = built / "build/compile/softmax/default/trn1/model.neff"
    neff.unlink()
    summary = build(built, capsys=capsys)
    assert summary["executed"][0] == "compile:softmax/default/trn1"
    assert "compile:softmax/default/trn2" in summary["up_to_date"]
    assert neff.is_file() and snapshot_written(built) == before  # the snapshot was reused


def test_a_source_rewritten_with_its_own_bytes_keeps_the_snapshot(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An HLO source is a task's `file_dep`, not something validation parses: doit
    decides (its hash is unchanged), and the project is not loaded."""
    before = snapshot_written(built)
    source = built / "kernels/softmax.hlo.pb"
    source.write_bytes(source.read_bytes())
    assert build(built, capsys=capsys)["executed"] == []
    assert snapshot_written(built) == before


def _edit_manifest(project: Path) -> None:
    with (project / "nkibuild.yaml").open("a") as handle:
        handle.write("# a comment\n")


def _add_deps_match(project: Path) -> None:
    (project / "kernels/extra/b.txt").write_text("b")


CHANGES = {
    "manifest bytes": (_edit_manifest, {}, ()),
    "a new file matching deps": (_add_deps_match, {}, ()),
    "NEURON_CC_FLAGS": (None, {"NEURON_CC_FLAGS": "--verbose"}, ()),
    "SOURCE_DATE_EPOCH": (None, {"SOURCE_DATE_EPOCH": "315532800"}, ()),
    "a passed variable": (None, {"NKIBUILD_PASS_ENV": "MY_VAR", "MY_VAR": "1"}, ()),
    "the double compiler's version": (None, {"NKIBUILD_FAKE_CC_VERSION": "2.99.1.0"}, ()),
    "a command-line option": (None, {}, ("--compile-timeout", "1h")),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_each_input_the_graph_was_made_from_is_compared(
    built: Path,
    change: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    edit, environment, args = CHANGES[change]
    before = json.loads(snapshot_bytes(built))
    if edit is not None:
        edit(built)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    build(built, *args, capsys=capsys)
    after = json.loads(snapshot_bytes(built))
    assert after != before  # the project was loaded: its graph written anew
    # ... and what changed reached the tasks (a snapshot reused would keep the old ones).
    if change == "a new file matching deps":
        extract = next(t for t in after["tasks"] if t["basename"] == "extract")
        assert str(built / "kernels/extra/b.txt") in extract["file_dep"]
    if change == "the double compiler's version":
        compile_task = next(t for t in after["tasks"] if t["basename"] == "compile")
        assert compile_task["uptodate"][0]["config"]["compiler_version"] == "2.99.1.0"


def test_a_parsed_file_that_changed_is_validated_again(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reference no longer defines the function the manifest names: the build
    fails as validation says, though doit alone would find only the bundle stale."""
    (built / "kernels/reference.py").write_text("def other(x):\n    return x\n")
    code = main(["-C", str(built), "build", "--toolchain", "fake"])
    err = capsys.readouterr().err
    assert code == 2
    assert "softmax" in err and "nkibuild.yaml:" in err


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"not json",
        b"[]",
        b'{"format": 2}',
        b'{"format": 999, "tasks": []}',
    ],
    ids=["empty", "not-json", "a-list", "format-only", "other-format"],
)
def test_a_damaged_snapshot_is_no_snapshot(
    built: Path, damage: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    (built / SNAPSHOT).write_bytes(damage)
    summary = build(built, capsys=capsys)
    assert summary["executed"] == []
    assert json.loads(snapshot_bytes(built))["format"] == FORMAT  # written anew


def test_a_snapshot_whose_tasks_were_tampered_with_is_not_run(
    built: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Inputs that match, tasks that do not: the first task to run finds the real one
    differs, fails cleanly, and the next build loads the project."""
    snapshot = json.loads(snapshot_bytes(built))
    compile_task = next(t for t in snapshot["tasks"] if t["basename"] == "compile")
    compile_task["targets"].append(str(built / "build/elsewhere"))
    (built / SNAPSHOT).write_text(json.dumps(snapshot))
    (built / "build/compile/softmax/default/trn1/model.neff").unlink()
    code = main(["-C", str(built), "build", "--toolchain", "fake"])
    err = capsys.readouterr().err
    assert code == 1
    assert "the project changed while compile:softmax/default/trn1 was checked" in err
    assert "Traceback" not in err
    assert build(built, capsys=capsys)["executed"][0] == "compile:softmax/default/trn1"


def test_a_snapshot_of_a_verified_build_is_not_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify's inputs (its sources' globs) are not among what the snapshot compares."""
    project = softmax_project(tmp_path / "v", softmax_manifest(reference=True, top="verify: true"))
    build(project, capsys=capsys)
    assert not (project / SNAPSHOT).exists()
