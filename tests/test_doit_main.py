"""nkibuild's own runs of doit (graph/loader.py `doit_main`): doit's `run` and `list` with
nkibuild's state backend and reporter taken as known, no installed package's plugins
looked up; plain doit still finds the backend through nkibuild's entry point."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import doit.plugin
import pytest
from doit.cmd_base import ModuleTaskLoader
from doit.doit_cmd import DoitMain
from helpers import build, softmax_manifest, softmax_project

from nkibuild.context import load_context
from nkibuild.graph.loader import doit_config
from nkibuild.graph.run import pending_tasks
from nkibuild.graph.state import BACKEND_NAME, DEP_FILE, HEADER, AtomicJsonDB
from nkibuild.graph.tasks import task_dicts
from nkibuild.settings import BuildOptions
from nkibuild.toolchain_double.hlo_writer import build_hlo_module


@pytest.fixture
def looked_up(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The entry-point groups doit scans for plugins from now on."""
    groups: list[str] = []
    scan = doit.plugin.entry_points_impl()

    def recording(**selection: Any) -> Any:
        groups.append(selection.get("group", ""))
        return scan(**selection)

    def impl() -> Callable[..., Any]:
        return recording

    monkeypatch.setattr(doit.plugin, "entry_points_impl", impl)
    return groups


def state_header(project: Path) -> str:
    return (project / "build" / "state" / DEP_FILE).read_text().partition("\n")[0]


def test_a_build_handing_doit_its_tasks_looks_up_no_plugin(
    tmp_path: Path, looked_up: list[str]
) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    summary = build(project)  # nothing built yet: every task is handed to doit
    assert summary.ok, summary.to_json()
    assert "bundle" in summary.executed and "wheel" in summary.executed
    assert state_header(project) == HEADER  # saved by nkibuild's backend, named as known
    next((project / "dist").glob("*.whl")).unlink()
    assert build(project).executed == ["wheel"]  # handed doit one task: doit's check reran it
    assert looked_up == []


def test_the_state_doit_decoded_is_freed_when_its_run_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not kept by doit's registry of its last dependency manager, nor by the checks of
    the tasks (kept until the process ends in doit's reference cycles): freed as the run
    returns, not by the interpreter's last garbage collection."""
    project = softmax_project(tmp_path / "p", softmax_manifest())
    assert build(project).ok
    module = build_hlo_module(
        "edited", [("logits", "float32", (64, 1024))], [("float32", (64, 1024))]
    )
    (project / "kernels" / "softmax.hlo.pb").write_bytes(module)
    states: list[weakref.ref[AtomicJsonDB]] = []
    opened = AtomicJsonDB.__init__

    def recorded(self: AtomicJsonDB, *args: Any, **kwargs: Any) -> None:
        states.append(weakref.ref(self))
        opened(self, *args, **kwargs)

    monkeypatch.setattr(AtomicJsonDB, "__init__", recorded)
    gc.disable()  # what is freed is freed by its last reference going
    try:
        summary = build(project)
        alive = [state for state in states if state() is not None]
    finally:
        gc.enable()
    assert "bundle" in summary.executed  # handed to doit with the inputs check
    assert states and alive == []


def test_listing_what_doit_would_run_looks_up_no_plugin(
    tmp_path: Path, looked_up: list[str]
) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    assert build(project).ok
    context = load_context(
        project / "nkibuild.yaml",
        project / "build",
        project / "dist",
        BuildOptions(toolchain="fake"),
    )
    dicts = task_dicts(context)
    assert pending_tasks(dicts, doit_config(context)) == []
    next((project / "dist").glob("*.whl")).unlink()
    assert pending_tasks(dicts, doit_config(context)) == ["wheel"]
    assert looked_up == []


def test_plain_doit_finds_the_state_backend_by_its_entry_point(
    tmp_path: Path, looked_up: list[str]
) -> None:
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
    header, _, entries = state.read_text().partition("\n")
    assert header == HEADER
    assert entries.startswith('"make"\t')
    assert "doit.BACKEND" in looked_up  # found where plain doit looks
