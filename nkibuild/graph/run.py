"""Run a build: take the project's build lock, then let doit execute the task graph."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass

from nkibuild.errors import UsageError
from nkibuild.fsutil import atomic_write_text
from nkibuild.graph.loader import NkibuildLoader, to_tasks
from nkibuild.graph.report import BuildReporter, BuildSummary, Display
from nkibuild.graph.tasks import BuildContext, task_dicts

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
    from filelock import FileLock, Timeout

    state_dir = context.layout.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    # doit neither locks its state file nor saves it before the end of a run:
    # two concurrent runs would both execute everything, and the last writer wins.
    lock = FileLock(str(state_dir / LOCK_FILE))
    try:
        lock.acquire(timeout=options.lock_timeout)
    except Timeout:
        raise UsageError(
            f"another nkibuild build is running in {context.layout.build_dir} "
            f"(lock {state_dir / LOCK_FILE}); wait for it or use another --build-dir"
        ) from None
    try:
        return _run_locked(context, options, display)
    finally:
        lock.release()


def _run_locked(context: BuildContext, options: RunOptions, display: Display) -> BuildSummary:
    check_selection(context, options.selection)
    reporter = BuildReporter(display)
    loader = NkibuildLoader(context, extra_config={"reporter": reporter})
    from doit.doit_cmd import DoitMain

    argv = ["run"]
    if options.jobs > 1:
        # Actions wait on subprocesses (compiler, frontend workers): threads are enough.
        argv += ["-n", str(options.jobs), "-P", "thread"]
    if options.keep_going:
        argv.append("--continue")
    DoitMain(loader, config_filenames=()).run([*argv, *options.selection])
    summary = reporter.summary
    last_run = context.layout.state_dir / LAST_RUN_FILE
    atomic_write_text(last_run, json.dumps(summary.to_json(), indent=2))
    return summary


def check_selection(context: BuildContext, selection: Sequence[str]) -> None:
    """Unknown task names are a usage error with suggestions, before doit runs."""
    if not selection:
        return
    names = [task.name for task in to_tasks(task_dicts(context), [])]
    for pattern in selection:
        if not fnmatch.filter(names, pattern):
            import difflib

            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see `nkibuild list`"
            raise UsageError(f"no task matches {pattern!r}{hint}")
