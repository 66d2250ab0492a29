"""Edited kernels extracted and compiled while the build decides (compiler/ahead.py).

A compile ahead must change nothing a build leaves or reports: each unit is compiled
once and reported as compiled, the artifacts and NEFFs are those a build without it
writes, a compile that fails ahead fails its task without a second compiler run, a
source changed meanwhile is extracted and compiled again, and a build that fails
before its tasks take the work stops the compiler and leaves nothing behind.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest
from helpers import QuietDisplay, module, prebuilt_project

import nkibuild.compiler
from nkibuild.compiler import RESULT_FILE
from nkibuild.context import load_context
from nkibuild.fsutil import LEFTOVER_PATTERNS, leftovers
from nkibuild.graph import uptodate
from nkibuild.graph.report import BuildSummary
from nkibuild.graph.run import LAST_RUN_FILE, RunOptions, run_build
from nkibuild.settings import BuildOptions

EDITED = "k1"
TARGETS = ["trn1", "trn2"]
EDITED_UNITS = [f"{EDITED}/default/{target}" for target in TARGETS]
AHEAD_THREAD = "nkibuild-ahead"
# The reference build takes its NEFFs from the cache the first one filled.
AS_MADE = ("compile_seconds", "peak_memory", "origin")


def two_target_project(root: Path) -> Path:
    return prebuilt_project(root, targets="[trn1, trn2]")


def build(root: Path, *selection: str, jobs: int = 2) -> BuildSummary:
    context = load_context(
        root / "nkibuild.yaml", root / "build", root / "dist", BuildOptions(toolchain="fake")
    )
    return run_build(context, RunOptions(selection=selection, jobs=jobs), QuietDisplay())


def edit(root: Path, name: str) -> None:
    (root / "kernels" / f"{EDITED}.pb").write_bytes(module(name, 9))  # k1's shape


def built_then_edited(root: Path, name: str, counter: Path) -> Path:
    """The two-target project built at `root`, then k1 edited to a module named `name`;
    compiler runs counted from then on."""
    two_target_project(root)
    assert build(root).ok
    edit(root, name)
    counter.unlink(missing_ok=True)
    return root


def outputs(root: Path) -> dict[str, object]:
    """What the build leaves of extractions and compiles, by path in the project: bytes,
    and each compile record but how its NEFF was made (the compile logs aside: they name
    temp paths)."""
    found = [*(root / "build" / "extract").rglob("*"), *(root / "build" / "compile").rglob("*")]
    left: dict[str, object] = {}
    for path in sorted(p for p in found if p.is_file() and p.name != "compile.log"):
        left[str(path.relative_to(root))] = path.read_bytes()
        if path.name == RESULT_FILE:
            record = json.loads(path.read_bytes())
            left[str(path.relative_to(root))] = {
                key: value for key, value in record.items() if key not in AS_MADE
            }
    return left


def proven_whole(root: Path) -> bool:
    """A build now runs nothing, and its proof covers every task without doit."""
    ran = build(root).executed
    last_run = json.loads((root / "build" / "state" / LAST_RUN_FILE).read_text())
    return ran == [] and last_run["up_to_date_decision"]["handed_to_doit"] == 0


def compiler_runs(counter: Path) -> list[str]:
    """The targets of the compiler runs counted since `counter` was last removed (the
    double's counter lines are its argv, whose paths are relative)."""
    lines = counter.read_text().splitlines() if counter.exists() else []
    return [line.split("--target ")[1].split()[0] for line in lines]


@pytest.fixture
def compiled_in(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """(thread name, unit) of every compile_unit call, the compile tasks' and the ahead's."""
    calls: list[tuple[str, str]] = []
    original = nkibuild.compiler.compile_unit

    def compile_unit(unit, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((threading.current_thread().name, unit.name))
        return original(unit, *args, **kwargs)

    monkeypatch.setattr(nkibuild.compiler, "compile_unit", compile_unit)
    return calls


@pytest.fixture
def after_deciding(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[], None]], None]:
    """Run a callable once the decision is made and the compiles ahead have ended (a
    small project decides in milliseconds: without the wait doit's tasks would often
    come first, which is the other case)."""
    then: list[Callable[[], None]] = []
    original = uptodate.decide

    def decide(*args: Any, **kwargs: Any) -> uptodate.Decision:
        decision = original(*args, **kwargs)
        for thread in threading.enumerate():
            if thread.name == AHEAD_THREAD:
                thread.join()
        for action in then:
            action()
        return decision

    monkeypatch.setattr(uptodate, "decide", decide)
    return then.append


@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "compiler-runs"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_COUNTER", str(path))
    return path


@pytest.fixture
def decided_while_compiling(counter: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision returns once the first compiler ahead has started (compiles then
    take 1.5 s): doit's tasks come while it runs."""
    monkeypatch.setenv("NKIBUILD_FAKE_CC_CPU_SECONDS", "1.5")
    original = uptodate.decide

    def decide(*args: Any, **kwargs: Any) -> uptodate.Decision:
        decision = original(*args, **kwargs)
        deadline = time.monotonic() + 30
        while not compiler_runs(counter) and time.monotonic() < deadline:
            time.sleep(0.01)
        return decision

    monkeypatch.setattr(uptodate, "decide", decide)


def compiler_spans(times: Path) -> list[tuple[float, float]]:
    """(start, end) of each compiler run the double recorded (NKIBUILD_FAKE_CC_TIMES)."""
    return sorted(tuple(map(float, line.split())) for line in times.read_text().splitlines())


def test_an_edited_kernel_is_compiled_while_the_build_decides(
    tmp_path: Path,
    isolated_cache: Path,
    compiled_in: list[tuple[str, str]],
    after_deciding: Callable[[Callable[[], None]], None],
    counter: Path,
) -> None:
    root = built_then_edited(tmp_path / "ahead", "k1_edited", counter)
    compiled_in.clear()
    after_deciding(lambda: None)

    summary = build(root)

    assert summary.ok, summary.failures
    assert compiled_in[:2] == [(AHEAD_THREAD, unit) for unit in EDITED_UNITS]
    assert compiler_runs(counter) == TARGETS  # once each
    assert summary.origins == {"compiled": 2}  # as this build compiled them
    assert sorted(summary.executed) == sorted(
        [f"extract:{EDITED}/default", *(f"compile:{unit}" for unit in EDITED_UNITS), "bundle",
         "wheel"]
    )  # fmt: skip
    reference = two_target_project(tmp_path / "reference")
    edit(reference, "k1_edited")
    assert build(reference).ok
    assert outputs(root) == outputs(reference)
    assert proven_whole(root)


def test_a_compile_that_failed_ahead_fails_its_task_without_a_second_run(
    tmp_path: Path,
    isolated_cache: Path,
    after_deciding: Callable[[Callable[[], None]], None],
    counter: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = built_then_edited(tmp_path / "ahead", "k1_broken", counter)
    after_deciding(lambda: None)
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "exit1")
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT_MATCH", f"/{EDITED}/default/trn2/")

    summary = build(root)

    (failure,) = summary.failures
    assert failure.name == f"compile:{EDITED}/default/trn2"
    assert "injected fault exit1" in failure.detail  # the compiler's log tail, as always
    assert compiler_runs(counter) == TARGETS  # trn2's failed ahead, and did not run again
    monkeypatch.delenv("NKIBUILD_FAKE_CC_FAULT")
    again = build(root)
    assert again.ok and again.origins == {"compiled": 1}  # trn1's NEFF was kept


def test_a_source_changed_after_its_compile_ahead_is_extracted_and_compiled_again(
    tmp_path: Path,
    isolated_cache: Path,
    after_deciding: Callable[[Callable[[], None]], None],
    counter: Path,
) -> None:
    root = built_then_edited(tmp_path / "ahead", "k1_first", counter)
    after_deciding(lambda: edit(root, "k1_second"))

    summary = build(root)

    assert summary.ok, summary.failures
    runs = compiler_runs(counter)
    assert runs[:2] == TARGETS and sorted(runs[2:]) == TARGETS  # ahead, then for the second edit
    assert summary.origins == {"compiled": 2}
    reference = two_target_project(tmp_path / "reference")
    edit(reference, "k1_second")
    assert build(reference).ok
    assert outputs(root) == outputs(reference)


def test_the_tasks_do_not_wait_for_a_compile_ahead_to_take_its_artifact(
    tmp_path: Path,
    isolated_cache: Path,
    counter: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """The decision ends while the first unit compiles ahead: the extract task copies the
    staged artifact into place at once, and doit compiles the other unit meanwhile."""
    root = built_then_edited(tmp_path / "ahead", "k1_overlapped", counter)
    times = tmp_path / "compile-times"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_TIMES", str(times))
    request.getfixturevalue("decided_while_compiling")
    summary = build(root)

    assert summary.ok, summary.failures
    assert compiler_runs(counter) == TARGETS  # one ahead, one by its task
    assert summary.origins == {"compiled": 2}  # the first's task waited for it
    (_, first_end), (second_start, _) = compiler_spans(times)
    assert second_start < first_end  # they overlapped
    monkeypatch.undo()
    reference = two_target_project(tmp_path / "reference")
    edit(reference, "k1_overlapped")
    assert build(reference).ok
    assert outputs(root) == outputs(reference)
    assert [p for p in (root / "build" / "extract").rglob(".*")] == []  # no staging left
    assert proven_whole(root)


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_compile_ahead_is_one_of_the_compilers_jobs_allows(
    tmp_path: Path,
    isolated_cache: Path,
    counter: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    jobs: int,
) -> None:
    """k1 edited (compiled ahead) while k0's compiles are pending too (their directory
    removed): doit's compiles wait for the one ahead, as -j allows."""
    root = two_target_project(tmp_path / "ahead")
    assert build(root).ok
    shutil.rmtree(root / "build" / "compile" / "k0")
    shutil.rmtree(isolated_cache)  # k0 is compiled again, not fetched
    edit(root, "k1_among_others")
    counter.unlink()
    times = tmp_path / "compile-times"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_TIMES", str(times))
    request.getfixturevalue("decided_while_compiling")
    assert build(root, jobs=jobs).ok
    spans = compiler_spans(times)
    assert len(spans) == 4  # k1's two and k0's two
    running = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    assert max(accumulate(change for _, change in running)) <= jobs


def test_a_build_that_fails_before_its_tasks_take_the_work_stops_the_compile_ahead(
    tmp_path: Path,
    isolated_cache: Path,
    counter: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = two_target_project(tmp_path / "ahead")
    assert build(root).ok
    edit(root, "k1_slow")
    counter.unlink()
    monkeypatch.setenv("NKIBUILD_FAKE_CC_CPU_SECONDS", "60")
    original = uptodate.decide

    def interrupted(*args: Any, **kwargs: Any) -> uptodate.Decision:
        original(*args, **kwargs)
        deadline = time.monotonic() + 30
        while not compiler_runs(counter) and time.monotonic() < deadline:
            time.sleep(0.01)  # the compile ahead's compiler has started
        raise KeyboardInterrupt

    monkeypatch.setattr(uptodate, "decide", interrupted)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        build(root)
    assert time.monotonic() - started < 20  # the 60 s compiler was stopped
    assert compiler_runs(counter) == ["trn1"]  # stopped before trn2's started

    monkeypatch.setattr(uptodate, "decide", original)
    monkeypatch.delenv("NKIBUILD_FAKE_CC_CPU_SECONDS")
    summary = build(root)
    assert summary.ok and summary.origins == {"compiled": 2}
    # What the wheel stage sets aside in the state dir stays until its next run.
    left = leftovers(root / "build", LEFTOVER_PATTERNS)
    assert [path for path in left if path.parent != root / "build" / "state"] == []


def test_a_failed_build_leaves_no_work_dir_of_a_compile_ahead(
    tmp_path: Path, isolated_cache: Path, counter: Path, request: pytest.FixtureRequest
) -> None:
    """k0 broken, k1 edited: the build fails at k0's extraction (-j1) while k1 compiles
    ahead; the session stops that compiler and removes its work dir."""
    root = two_target_project(tmp_path / "ahead")
    assert build(root).ok
    (root / "kernels" / "k0.pb").write_bytes(b"not an HLO module")
    edit(root, "k1_in_a_failed_build")
    counter.unlink()
    request.getfixturevalue("decided_while_compiling")
    summary = build(root, jobs=1)
    assert [failure.name for failure in summary.failures] == ["extract:k0/default"]
    assert sorted((root / "build").rglob(".work-*")) == []


def test_an_error_in_the_compile_ahead_is_left_to_the_tasks(
    tmp_path: Path,
    isolated_cache: Path,
    after_deciding: Callable[[Callable[[], None]], None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread meets what the tasks will report (here a remote cache that cannot be
    opened): no traceback of its own, the tasks' messages as always."""
    root = two_target_project(tmp_path / "ahead")
    assert build(root).ok
    edit(root, "k1_unreachable_cache")
    monkeypatch.setenv("NKIBUILD_REMOTE_CACHE", "nosuchproto://bucket/x")
    uncaught: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: uncaught.append(hook.thread.name))
    after_deciding(lambda: None)
    summary = build(root)
    assert uncaught == []
    assert sorted(failure.name for failure in summary.failures) == [
        f"compile:{unit}" for unit in EDITED_UNITS
    ]
    for failure in summary.failures:
        assert "remote cache nosuchproto://bucket/x cannot be opened" in failure.detail
        assert "Traceback" not in failure.detail


def test_a_selection_build_compiles_nothing_ahead(
    tmp_path: Path, isolated_cache: Path, compiled_in: list[tuple[str, str]]
) -> None:
    root = two_target_project(tmp_path / "ahead")
    assert build(root).ok
    edit(root, "k1_selected")
    compiled_in.clear()
    summary = build(root, "compile:*")
    assert summary.origins == {"compiled": 2}
    assert [thread for thread, _ in compiled_in if thread == AHEAD_THREAD] == []
