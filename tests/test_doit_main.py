"""nkibuild's own runs of doit (graph/loader.py `doit_main`) and plain doit running a
user's dodo.py both use nkibuild's state backend, found as a doit plugin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
from helpers import build, softmax_manifest, softmax_project

from nkibuild.context import load_context
from nkibuild.graph.loader import doit_config
from nkibuild.graph.run import pending_tasks
from nkibuild.graph.state import BACKEND_NAME, DEP_FILE
from nkibuild.graph.tasks import task_dicts
from nkibuild.settings import BuildOptions


def test_a_build_saves_doits_state_as_json_and_doit_decides_from_it(tmp_path: Path) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    summary = build(project)
    assert summary.ok, summary.to_json()
    state = json.loads((project / "build" / "state" / DEP_FILE).read_text())
    assert {"bundle", "wheel", "compile:softmax/default/trn2"} <= set(state)
    next((project / "dist").glob("*.whl")).unlink()
    assert build(project).executed == ["wheel"]  # doit's outputs check reran it


def test_listing_what_doit_would_run(tmp_path: Path) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    assert build(project).ok
    context = load_context(
        project / "nkibuild.yaml",
        project / "build",
        project / "dist",
        BuildOptions(toolchain="fake"),
    )
    dicts = task_dicts(context)
    assert pending_tasks(dicts, doit_config(context.layout.state_dir)) == []
    next((project / "dist").glob("*.whl")).unlink()
    assert pending_tasks(dicts, doit_config(context.layout.state_dir)) == ["wheel"]


def test_plain_doit_finds_the_state_backend_by_its_entry_point(tmp_path: Path) -> None:
    """A user's dodo.py naming nkibuild's backend, run by doit's own command line."""
    state = tmp_path / "state.json"
    target = tmp_path / "made.txt"

    def task_make() -> dict[str, Any]:
        return {"actions": [lambda: target.write_text("made") > 0], "targets": [str(target)]}

    dodo = {
        "DOIT_CONFIG": {"backend": BACKEND_NAME, "dep_file": str(state)},
        "task_make": task_make,
    }
    assert DoitMain(ModuleTaskLoader(dodo), config_filenames=()).run(["run"]) == 0
    assert target.read_text() == "made"
    assert "make" in json.loads(state.read_text())
