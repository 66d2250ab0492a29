"""Ctrl-C (SIGINT) during a build: it stops within seconds, takes its compilers and
frontend workers with it (checked in the process table), and the next build resumes."""

from __future__ import annotations

import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from campaign import (
    Project,
    finished_tasks,
    record,
    trial_counts,
    wait_for_lines,
    wait_for_no_processes,
)

PROMPT_S = 5.0


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project.copy_of_examples(tmp_path)


def cold(project: Project) -> None:
    for directory in (project.cache, project.root / "build", project.root / "dist"):
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("trials", trial_counts(fast=2, full=20))
def test_ctrl_c_stops_promptly_and_the_next_build_resumes(
    project: Project, tmp_path: Path, trials: int
) -> None:
    built = project.build()
    assert built.returncode == 0, built.stderr
    reference = project.wheel()
    stopped_in: Counter[str] = Counter()
    slowest = 0.0
    for trial in range(trials):
        cold(project)
        counter = tmp_path / f"compiles-{trial}"
        # Compiles take a minute here, so an interrupt in the compile phase finds two
        # compilers running (-j 2); an early one, once the first extraction is done,
        # finds a frontend worker tracing the next.
        log = tmp_path / f"interrupted-{trial}.log"
        build = project.start_build(
            "-j", "2",
            log=log,
            NKIBUILD_FAKE_CC_CPU_SECONDS="60",
            NKIBUILD_FAKE_CC_COUNTER=str(counter),
        )  # fmt: skip
        phase = "compile" if trial % 2 == 0 else "extract"
        if phase == "compile":
            wait_for_lines(counter, 2)
        else:
            deadline = time.monotonic() + 60
            while not finished_tasks(log.read_text(), "extract:"):
                assert build.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.01)
        interrupted = time.monotonic()
        build.send_signal(signal.SIGINT)
        returncode = build.wait(timeout=60)
        seconds = time.monotonic() - interrupted
        slowest = max(slowest, seconds)
        context = f"trial {trial} ({phase}, stopped after {seconds:.2f} s)"
        assert returncode == 130, context
        assert seconds < PROMPT_S, context
        assert wait_for_no_processes(project, timeout=1.0) == [], context
        stopped_in[phase] += 1

        resumed = project.build()
        assert resumed.returncode == 0, f"{context}\n{resumed.stdout}{resumed.stderr}"
        assert project.wheel() == reference, context
        assert project.leftovers() == [], context
        assert project.corrupt_cache_entries() == 0, context
    record(
        "SIGINT (Ctrl-C) during a build, then a normal build",
        trials=trials,
        interrupted_in=dict(stopped_in),
        slowest_stop_s=round(slowest, 2),
        result=f"exit 130 within {PROMPT_S:g} s, no compiler or worker left in the process "
        "table, resumed build byte-identical",
    )
