"""The cold build's start-up path: what it computes instead of asking doit must agree
with doit, and the manifest checked by a forked child must be checked as in-process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project

from nkibuild.context import load_context
from nkibuild.errors import ManifestError, UsageError
from nkibuild.graph.loader import to_tasks
from nkibuild.graph.run import check_selection, task_names
from nkibuild.graph.tasks import task_dicts
from nkibuild.manifest import forkcheck, load_manifest
from nkibuild.manifest.forkcheck import ForkedCheck
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


ALONE = "NKIBUILD_TEST_ALONE"  # set in the new interpreter a test is run alone in


@pytest.fixture
def idle_core(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """As on an idle machine: the check forks whatever this one's load. It never forks
    a process with another thread, and a pytest worker may hold some of earlier tests
    for good (fsspec's IO loop, moto's server): there, the test runs alone in a new
    interpreter instead, and is reported skipped here once it passed there."""
    if threading.active_count() != 1:
        assert ALONE not in os.environ, "threads even in a new interpreter"
        command = [sys.executable, "-m", "pytest", request.node.nodeid, "-q"]
        command += ["-p", "no:cacheprovider", "-p", "no:xdist"]
        cwd, env = request.config.rootpath, {**os.environ, ALONE: "1"}
        result = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr
        pytest.skip("other threads in this worker: passed alone in a new interpreter")
    monkeypatch.setattr(forkcheck, "_idle_core", lambda: True)


def test_no_fork_when_every_core_is_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkcheck, "_idle_core", lambda: False)
    assert ForkedCheck.start(lambda: True) is None


def test_an_idle_core_is_read_from_the_runnable_count(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    loadavg = tmp_path / "loadavg"
    for runnable, idle in ((1, True), (cores, True), (cores + 1, False)):
        loadavg.write_text(f"3.50 2.40 1.30 {runnable}/120 4242\n")
        assert forkcheck._idle_core(str(loadavg)) is idle
    loadavg.write_text("")
    assert not forkcheck._idle_core(str(loadavg))  # unreadable: no fork


@pytest.mark.usefixtures("idle_core")
def test_a_forked_check_answers_from_another_process() -> None:
    parent = os.getpid()
    check = ForkedCheck.start(lambda: os.getpid() != parent)
    assert check is not None
    assert check.passed()
    assert check.passed()  # the answer is kept once the child is reaped


@pytest.mark.usefixtures("idle_core")
@pytest.mark.parametrize("answer", [lambda: False, lambda: 1 / 0])
def test_a_forked_check_that_says_no_or_fails_has_not_passed(answer) -> None:
    check = ForkedCheck.start(answer)
    assert check is not None
    assert not check.passed()


@pytest.mark.usefixtures("idle_core")
def test_a_forked_check_writes_nothing_and_runs_nothing_of_the_parent(capfd) -> None:
    def noisy() -> bool:
        print("from the child")
        print("and its stderr", file=sys.stderr)
        raise KeyboardInterrupt  # must end the child, never reach the code below

    check = ForkedCheck.start(noisy)
    assert check is not None
    assert not check.passed()
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")


def sleeping_check() -> tuple[ForkedCheck, int]:
    """A forked check that would answer only after a minute, and its child's pid."""
    check = ForkedCheck.start(lambda: time.sleep(60) is None)
    assert check is not None
    child = check._pid
    assert child is not None
    return check, child


@pytest.mark.usefixtures("idle_core")
def test_a_cancelled_check_is_killed_and_reaped() -> None:
    check, child = sleeping_check()
    started = time.monotonic()
    check.cancel()
    assert time.monotonic() - started < 10
    assert not check.passed()
    with pytest.raises(ChildProcessError):  # reaped: no zombie left
        os.waitpid(child, os.WNOHANG)


@pytest.mark.usefixtures("idle_core")
def test_a_check_that_does_not_answer_in_time_is_killed_and_not_passed() -> None:
    check, child = sleeping_check()
    started = time.monotonic()
    assert not check.passed(timeout=0.2)  # the caller then checks in-process
    assert time.monotonic() - started < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(child, os.WNOHANG)


@pytest.mark.usefixtures("idle_core")
def test_a_child_the_system_reaped_is_no_answer_and_no_traceback() -> None:
    """A parent started with SIGCHLD ignored: the kernel reaps its children itself."""
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        check = ForkedCheck.start(lambda: True)
        assert check is not None
        assert not check.passed()
        check.cancel()
    finally:
        signal.signal(signal.SIGCHLD, previous)


@pytest.mark.usefixtures("idle_core")
def test_no_fork_while_another_thread_runs() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert ForkedCheck.start(lambda: True) is None
    finally:
        stop.set()
        thread.join()


@pytest.mark.usefixtures("idle_core")
def test_the_manifest_checked_beside_is_the_one_checked_here(example_project: Path) -> None:
    ran: list[str] = []
    path = example_project / "nkibuild.yaml"
    beside = load_manifest(path, lambda: ran.append("meanwhile"))
    assert ran == ["meanwhile"]
    assert beside == load_manifest(path)


@pytest.mark.usefixtures("idle_core")
def test_a_manifest_in_error_checked_beside_reports_as_checked_here(tmp_path: Path) -> None:
    manifest = softmax_manifest(kernel="    dtype: float33\n    colour: red\n")
    project = softmax_project(tmp_path / "p", manifest)
    ran: list[str] = []
    with pytest.raises(ManifestError) as beside:
        load_manifest(project / "nkibuild.yaml", lambda: ran.append("meanwhile"))
    with pytest.raises(ManifestError) as here:
        load_manifest(project / "nkibuild.yaml")
    assert ran == ["meanwhile"]
    assert beside.value.render() == here.value.render()
    assert "nkibuild.yaml:10:5: " in here.value.render()
    assert "unknown key 'colour'" in here.value.render()


# `nkibuild build 'compile:*'` as on an idle machine; prints the modules it imported.
IDLE_PROBE = """\
import json, sys
from nkibuild.manifest import forkcheck
from nkibuild.cli.main import main
forkcheck._idle_core = lambda: True
code = main(sys.argv[1:])
print(json.dumps(sorted(sys.modules)))
sys.exit(code)
"""


def _idle_build(project: Path, *tasks: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`nkibuild build` of `tasks` as on an idle machine, and the modules it imported."""
    args = ["build", "--toolchain", "fake", *tasks]
    command = [sys.executable, "-c", IDLE_PROBE, *args]
    result = subprocess.run(command, cwd=project, capture_output=True, text=True, check=False)
    *shown, modules = result.stdout.splitlines()
    result.stdout = "".join(f"{line}\n" for line in shown)
    return result, set(json.loads(modules))


def test_a_first_build_validates_its_manifest_in_a_child(tmp_path: Path) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    result, modules = _idle_build(project, "compile:*")
    assert result.returncode == 0, result.stderr
    assert "jsonschema" not in modules  # the child imported it
    assert (project / "build/compile/softmax/default/trn2/model.neff").is_file()
    (project / "nkibuild.yaml").write_text(softmax_manifest(defaults="{targets: [trn2]}"))
    # A build dir with state: validated here (the build may need nothing else).
    result, modules = _idle_build(project, "compile:*")
    assert result.returncode == 0, result.stderr
    assert "jsonschema" in modules


def test_a_first_build_reports_a_manifest_in_error_as_a_later_one(tmp_path: Path) -> None:
    manifest = softmax_manifest(kernel="    dtype: float33\n")
    project = softmax_project(tmp_path / "p", manifest)
    first, _ = _idle_build(project)
    (project / "build" / "state").mkdir(parents=True)
    later = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert (first.returncode, first.stdout, first.stderr) == (
        later.returncode,
        later.stdout,
        later.stderr,
    )
    assert first.returncode == 2
    assert "nkibuild.yaml:10:5: " in first.stderr
    assert "unknown key 'dtype'" in first.stderr
