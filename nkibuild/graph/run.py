"""Run a build: take the project's build lock, then let doit execute the task graph."""

from __future__ import annotations

import fnmatch
import gc
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.errors import UsageError
from nkibuild.fsutil import atomic_write_text
from nkibuild.graph import uptodate
from nkibuild.graph.loader import DEP_FILE, NkibuildLoader, doit_config, to_tasks
from nkibuild.graph.report import BuildReporter, BuildSummary, Display
from nkibuild.graph.tasks import BuildContext, task_dicts

if TYPE_CHECKING:
    from filelock import BaseFileLock

LOCK_FILE = "build.lock"
LAST_RUN_FILE = "last-run.json"


@dataclass(frozen=True)
class RunOptions:
    selection: tuple[str, ...] = ()
    jobs: int = 1
    keep_going: bool = False
    lock_timeout: float = 0.0


def run_build(context: BuildContext, options: RunOptions, display: Display) -> BuildSummary:
    """Execute the selected tasks (default: everything up to the wheel)."""
    from nkibuild.compiler.budget import COMPILE_BUDGET

    lock = acquire_build_lock(context.layout.build_dir, options.lock_timeout)
    COMPILE_BUDGET.configure(context.settings.max_compile_memory, options.jobs)
    # Building and checking thousands of tasks allocates millions of objects and few
    # cycles; CPython's default GC threshold would scan them dozens of times.
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    try:
        return _run_locked(context, options, display)
    except BaseException:
        from nkibuild.compiler.process import kill_running

        kill_running()  # e.g. Ctrl-C: no compiler may outlive the build
        raise
    finally:
        gc.set_threshold(*thresholds)
        from nkibuild.toolchain.worker_pool import POOL

        POOL.close()  # workers live for one build: the next may see changed user code
        close_ray()
        lock.release()


def close_ray() -> None:
    """End the Ray connection a build with --executor ray opened (no import otherwise)."""
    executor = sys.modules.get("nkibuild.compiler.ray_executor")
    if executor is not None:
        executor.shutdown()


def acquire_build_lock(build_dir: Path, timeout: float = 0.0) -> BaseFileLock:
    """The build dir's lock: doit neither locks its state file nor saves it before the
    end of a run, so two concurrent runs would both execute everything."""
    from filelock import FileLock, Timeout

    state_dir = build_dir / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(state_dir / LOCK_FILE))
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise UsageError(
            f"another nkibuild build is running in {build_dir} "
            f"(lock {state_dir / LOCK_FILE}); wait for it or use another --build-dir"
        ) from None
    return lock


def _run_locked(context: BuildContext, options: RunOptions, display: Display) -> BuildSummary:
    dicts = task_dicts(context)
    check_selection(dicts, options.selection)
    state_dir = context.layout.state_dir
    whole_graph = not options.selection
    if whole_graph:
        key = uptodate.fingerprint(dicts)
        proof_files = [*uptodate.files_of(dicts), str(state_dir / DEP_FILE)]
        if uptodate.is_proven(state_dir, key, proof_files):
            return _report_all_up_to_date(dicts, display)
    uptodate.forget(state_dir)
    sources_before = uptodate.stats(uptodate.sources_of(dicts))
    summary = _run_doit(context, dicts, options, display)
    if whole_graph and summary.ok and uptodate.stats(uptodate.sources_of(dicts)) == sources_before:
        # No input changed while doit ran, so what it saved describes the files now.
        uptodate.record(state_dir, key, proof_files)
    atomic_write_text(state_dir / LAST_RUN_FILE, json.dumps(summary.to_json(), indent=2))
    return summary


def _report_all_up_to_date(dicts: list[dict], display: Display) -> BuildSummary:
    reporter = BuildReporter(display)
    names = [task_name(task) for task in dicts]
    reporter.start(len(names))
    for name in names:
        reporter.up_to_date(name)
    reporter.complete_run()
    return reporter.summary


def _run_doit(
    context: BuildContext, dicts: list[dict], options: RunOptions, display: Display
) -> BuildSummary:
    return run_task_graph(dicts, doit_config(context), options, display)


def run_task_graph(
    dicts: list[dict], config: dict, options: RunOptions, display: Display
) -> BuildSummary:
    """Let doit run task dicts with `config` (dep_file, default_tasks, ...); report through
    `display`. The caller holds whatever locks the outputs need."""
    reporter = BuildReporter(display)
    loader = NkibuildLoader(extra_config={**config, "reporter": reporter}, tasks=dicts)
    from doit.doit_cmd import DoitMain

    argv = ["run"]
    if options.jobs > 1:
        # Actions wait on subprocesses (compiler, frontend workers): threads are enough.
        argv += ["-n", str(options.jobs), "-P", "thread"]
    if options.keep_going:
        argv.append("--continue")
    # doit's thread runner swaps sys.stdout/stderr per action to capture output; two
    # actions finishing out of order can leave one of its capture objects installed.
    streams = sys.stdout, sys.stderr
    try:
        code = DoitMain(loader, config_filenames=()).run([*argv, *options.selection])
    finally:
        sys.stdout, sys.stderr = streams
    summary = reporter.summary
    if code not in (0, 1) and summary.ok:
        summary.runtime_errors.append(f"doit stopped before running the tasks (exit {code})")
    return summary


def pending_tasks(dicts: list[dict], config: dict) -> list[str]:
    """Tasks doit would run now (its own up-to-date decision, as `doit list --status`)."""
    import contextlib
    import io

    from doit.doit_cmd import DoitMain

    loader = NkibuildLoader(extra_config=config, tasks=dicts)
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        code = DoitMain(loader, config_filenames=()).run(
            ["list", "--all", "--status", "--template", "{status} {name}"]
        )
    if code != 0:
        raise UsageError(f"doit could not list the tasks (exit {code}): {listing.getvalue()}")
    real = {task_name(task) for task in dicts}  # not doit's group tasks, never "up to date"
    names = [line[2:] for line in listing.getvalue().splitlines() if line.startswith("R ")]
    return [name for name in names if name in real]


def task_name(task: dict) -> str:
    return f"{task['basename']}:{task['name']}" if "name" in task else task["basename"]


def check_selection(dicts: list[dict], selection: Sequence[str]) -> None:
    """Unknown task names are a usage error with suggestions, before doit runs."""
    if not selection:
        return
    names = [task.name for task in to_tasks(dicts, [])]
    for pattern in selection:
        # As doit: only "*" makes a pattern; anything else names one task (or group).
        matches = fnmatch.filter(names, pattern) if "*" in pattern else pattern in names
        if not matches:
            import difflib

            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see `nkibuild list`"
            raise UsageError(f"no task matches {pattern!r}{hint}")
