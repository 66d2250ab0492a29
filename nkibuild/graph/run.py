"""Run a build: take the project's build lock, then let doit execute the task graph."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild.errors import UsageError, describe_os_error
from nkibuild.fsutil import atomic_write_text
from nkibuild.graph.report import BuildReporter, BuildSummary, Display
from nkibuild.graph.snapshot import Graph, task_name

if TYPE_CHECKING:
    from nkibuild.context import BuildContext, Layout
    from nkibuild.session import BuildSession

LAST_RUN_FILE = "last-run.json"


@dataclass(frozen=True)
class RunOptions:
    selection: tuple[str, ...] = ()
    jobs: int = 1
    keep_going: bool = False
    lock_timeout: float = 0.0


def run_build(context: BuildContext, options: RunOptions, display: Display) -> BuildSummary:
    """Execute the selected tasks of a loaded project (default: everything up to the wheel)."""
    from nkibuild.graph.snapshot import of_context

    return run_graph(of_context(context), context.layout, context.session, options, display)


def run_graph(
    graph: Graph, layout: Layout, session: BuildSession, options: RunOptions, display: Display
) -> BuildSummary:
    """Execute the selected tasks of `graph` in `session`, under the build dir's lock."""
    from nkibuild.session import SessionDirs

    running = session.running(
        [SessionDirs(layout.build_dir, swept=(layout.dist_dir,))],
        max_compile_memory=graph.max_compile_memory,
        jobs=options.jobs,
        lock_timeout=options.lock_timeout,
    )
    with running:
        return _run_locked(graph, layout, session, options, display)


def _run_locked(
    graph: Graph, layout: Layout, session: BuildSession, options: RunOptions, display: Display
) -> BuildSummary:
    from nkibuild.graph.loader import doit_config

    check_selection(graph.tasks, options.selection)
    config = doit_config(layout.state_dir)
    summary = run_task_graph(session, graph.tasks, config, options, display)
    try:
        # Not fsync'ed: a report, whole or absent after a power loss.
        # The toolchain too: commands that read this build's state default to it.
        text = json.dumps({**summary.to_json(), "toolchain": graph.toolchain_setting}, indent=2)
        atomic_write_text(layout.state_dir / LAST_RUN_FILE, text, durable=False)
    except OSError as error:  # the build itself is done: report, don't lose its summary
        summary.runtime_errors.append(
            f"the build's record was not saved: {describe_os_error(error)}"
        )
    return summary


def recorded_options(state_dir: Path) -> dict[str, Any]:
    """The options the last build in this build dir used (for `BuildOptions.recorded`);
    none when there was none or its record is unreadable."""
    from nkibuild.confine import read_regular
    from nkibuild.toolchain import TOOLCHAIN_MODES

    try:  # bounded: a FIFO or a huge file planted there is no record
        record = json.loads(read_regular(state_dir / LAST_RUN_FILE, 1 << 20))
        toolchain = record.get("toolchain")
    except (OSError, ValueError, AttributeError):  # AttributeError: JSON but not an object
        return {}
    return {"toolchain": toolchain} if toolchain in TOOLCHAIN_MODES else {}


def run_task_graph(
    session: BuildSession,
    dicts: list[dict],
    config: dict,
    options: RunOptions,
    display: Display,
) -> BuildSummary:
    """Let doit run task dicts with `config` (dep_file, default_tasks, ...); report through
    `display`. The caller runs `session` and holds whatever locks the outputs need."""
    from nkibuild.graph.loader import NkibuildLoader, doit_main

    reporter = BuildReporter(display)
    loader = NkibuildLoader(extra_config={**config, "reporter": reporter}, tasks=dicts)

    argv = ["run"]
    if options.jobs > 1:
        # Actions wait on subprocesses (compiler, frontend workers): threads are enough.
        argv += ["-n", str(options.jobs), "-P", "thread"]
    if options.keep_going:
        argv.append("--continue")
    session.state_failures.clear()
    with session.current():
        code = doit_main(loader).run([*argv, *options.selection])
    summary = reporter.summary
    for error in session.state_failures:  # the build's progress was not saved: not a success
        summary.runtime_errors.append(f"doit's state was not saved: {describe_os_error(error)}")
    if code not in (0, 1) and summary.ok:
        summary.runtime_errors.append(f"doit stopped before running the tasks (exit {code})")
    return summary


def pending_tasks(dicts: list[dict], config: dict) -> list[str]:
    """Tasks doit would run now (its own up-to-date decision, as `doit list --status`)."""
    import contextlib
    import io

    from nkibuild.graph.loader import NkibuildLoader, doit_main

    loader = NkibuildLoader(extra_config=config, tasks=dicts)
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        code = doit_main(loader).run(["list", "--all", "--status", "--template", "{status} {name}"])
    if code != 0:
        raise UsageError(f"doit could not list the tasks (exit {code}): {listing.getvalue()}")
    real = {task_name(task) for task in dicts}  # not doit's group tasks, never "up to date"
    names = [line[2:] for line in listing.getvalue().splitlines() if line.startswith("R ")]
    return [name for name in names if name in real]


def task_names(dicts: list[dict]) -> list[str]:
    """The names doit gives the tasks of `dicts`: each task's, and a group task per
    basename with subtasks (`compile` for `compile:*`). Read from the dicts: building
    doit's tasks only to name them."""
    groups = {task["basename"]: None for task in dicts if "name" in task}
    return [*(task_name(task) for task in dicts), *groups]


def check_selection(dicts: list[dict], selection: Sequence[str]) -> None:
    """Unknown task names are a usage error with suggestions, before doit runs."""
    if not selection:
        return
    names = task_names(dicts)
    for pattern in selection:
        # As doit: only "*" makes a pattern; anything else names one task (or group).
        matches = fnmatch.filter(names, pattern) if "*" in pattern else pattern in names
        if not matches:
            import difflib

            close = difflib.get_close_matches(pattern, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see `nkibuild list`"
            raise UsageError(f"no task matches {pattern!r}{hint}")
