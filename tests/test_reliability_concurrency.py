"""Builds at the same time: in one project they never interleave (the second stops
with a clear message); in two projects sharing a NEFF cache they never corrupt it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from campaign import Project, record, trial_counts

LOCKED_OUT = "another nkibuild build is running"


def cold(project: Project) -> None:
    for directory in (project.cache, project.root / "build", project.root / "dist"):
        shutil.rmtree(directory, ignore_errors=True)


def start(project: Project, log: Path, **env: str) -> subprocess.Popen[bytes]:
    return project.start_build("-j", "2", log=log, **env)


@pytest.mark.parametrize("trials", trial_counts(fast=2, full=20))
def test_two_builds_in_one_project_never_interleave(tmp_path: Path, trials: int) -> None:
    project = Project.copy_of_examples(tmp_path)
    assert project.build().returncode == 0
    reference = project.wheel()
    for trial in range(trials):
        cold(project)
        logs = [tmp_path / f"build-{trial}-{n}.log" for n in (1, 2)]
        # Slow compiles keep the first build inside its lock while the second starts.
        builds = [start(project, log, NKIBUILD_FAKE_CC_CPU_SECONDS="1") for log in logs]
        codes = [build.wait(timeout=300) for build in builds]
        outputs = [log.read_text() for log in logs]
        context = f"trial {trial}: {codes}\n" + "\n".join(outputs)
        assert sorted(codes) == [0, 2], context
        refused = outputs[codes.index(2)]
        assert LOCKED_OUT in refused and "Traceback" not in refused, context
        assert project.wheel() == reference, context
        again = project.build()
        assert "0 ran" in again.stdout, again.stdout  # the winner's results were all saved
    record(
        "two builds at once in the same project",
        trials=trials,
        result=f"each time one built and the other exited 2 at once ({LOCKED_OUT}...)",
    )


@pytest.mark.parametrize("trials", trial_counts(fast=2, full=20))
def test_two_projects_sharing_a_cache_build_at_once(tmp_path: Path, trials: int) -> None:
    first = Project.copy_of_examples(tmp_path / "a")
    second = Project.copy_of_examples(tmp_path / "b")
    second.cache = first.cache
    assert first.build().returncode == 0
    reference = first.wheel()
    for trial in range(trials):
        for project in (first, second):
            cold(project)
        logs = [tmp_path / f"shared-{trial}-{n}.log" for n in (1, 2)]
        builds = [start(p, log) for p, log in zip((first, second), logs, strict=True)]
        codes = [build.wait(timeout=300) for build in builds]
        context = f"trial {trial}: {codes}\n" + "\n".join(log.read_text() for log in logs)
        assert codes == [0, 0], context
        assert first.wheel() == reference and second.wheel() == reference, context
        assert first.corrupt_cache_entries() == 0, context
    record(
        "two projects sharing one NEFF cache build at once (cold cache)",
        trials=trials,
        result="both wheels byte-identical to a clean build, 0 corrupt cache entries",
    )
