"""Helpers for tests that build projects in-process."""

from __future__ import annotations

from pathlib import Path

from nkibuild.graph.report import BuildSummary, TaskOutcome
from nkibuild.graph.run import RunOptions, run_build
from nkibuild.project import load_context
from nkibuild.settings import BuildOptions


class QuietDisplay:
    def start(self, tasks: int) -> None:
        pass

    def task_started(self, name: str) -> None:
        pass

    def task_finished(self, outcome: TaskOutcome) -> None:
        pass

    def finish(self, summary: BuildSummary) -> None:
        pass


def build(
    project: Path,
    *selection: str,
    keep_going: bool = False,
    jobs: int = 1,
    options: BuildOptions | None = None,
) -> BuildSummary:
    """Build a project with the toolchain double; returns what doit reported."""
    context = load_context(
        project / "nkibuild.yaml",
        project / "build",
        project / "dist",
        options or BuildOptions(toolchain="fake"),
    )
    options = RunOptions(selection=selection, keep_going=keep_going, jobs=jobs)
    return run_build(context, options, QuietDisplay())


def write_project(root: Path, manifest: str, files: dict[str, bytes | str] | None = None) -> Path:
    """A project dir with nkibuild.yaml and the given files (text or bytes)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "nkibuild.yaml").write_text(manifest)
    for name, content in (files or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return root
