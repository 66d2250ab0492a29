"""Run a build: take the project's build lock, then let doit execute the task graph.

doit (graph/loader.py) is imported only to run or list tasks: a build whose every task
the up-to-date proof covers never loads it."""

from __future__ import annotations

import fnmatch
import gc
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nkibuild.context import BuildContext
from nkibuild.errors import UsageError, describe_os_error
from nkibuild.fsutil import atomic_write_text
from nkibuild.graph import uptodate
from nkibuild.graph.intact import VALUES_KEY, Recorded, recorded_outputs
from nkibuild.graph.report import BuildReporter, BuildSummary, Display
from nkibuild.graph.state import DEP_FILE
from nkibuild.graph.tasks import BUNDLE_TASK, seeing, task_dicts
from nkibuild.graph.uptodate import task_name
from nkibuild.session import BuildSession, SessionDirs

LAST_RUN_FILE = "last-run.json"


@dataclass(frozen=True)
class RunOptions:
    selection: tuple[str, ...] = ()
    jobs: int = 1
    keep_going: bool = False
    lock_timeout: float = 0.0
    # The caller owns its process (the CLI): what was loaded to decide (millions of
    # objects at 10,000 units, which live until the build ends) is moved out of the
    # garbage collector's sight before doit runs, which would scan it again in each of
    # its collections (0.15 s after an edit at 10,000 units).
    owns_process: bool = False


def run_build(context: BuildContext, options: RunOptions, display: Display) -> BuildSummary:
    """Execute the selected tasks (default: everything up to the wheel)."""
    layout = context.layout
    running = context.session.running(
        [SessionDirs(layout.build_dir, swept=(layout.dist_dir,))],
        max_compile_memory=context.settings.max_compile_memory,
        jobs=options.jobs,
        lock_timeout=options.lock_timeout,
    )
    with running:
        return _run_locked(context, options, display)


def _run_locked(context: BuildContext, options: RunOptions, display: Display) -> BuildSummary:
    dicts = task_dicts(context)
    check_selection(dicts, options.selection)
    state_dir = context.layout.state_dir
    record: dict = {}
    if options.selection:
        # doit alone decides about a selection; what it runs changes its state, so the
        # proof is dropped rather than kept beside state it no longer describes.
        uptodate.forget(state_dir)
        _loaded(options)
        summary = _run_doit(context, dicts, options, display)
    else:
        summary, record["up_to_date_decision"] = _run_whole_graph(context, dicts, options, display)
    try:
        text = json.dumps({**summary.to_json(), **record}, indent=2)
        # Not fsync'ed: a report, whole or absent after a power loss. A sync here also
        # waited for the journal to write what earlier builds left in the page cache.
        atomic_write_text(state_dir / LAST_RUN_FILE, text, durable=False)
    except OSError as error:  # the build itself is done: report, don't lose its summary
        summary.runtime_errors.append(
            f"the build's record was not saved: {describe_os_error(error)}"
        )
    return summary


def _run_whole_graph(
    context: BuildContext, dicts: list[dict], options: RunOptions, display: Display
) -> tuple[BuildSummary, dict]:
    """Ask doit only about the tasks the up-to-date proof does not cover (uptodate.py);
    returns the summary and how the proof decided (for last-run.json)."""
    state_dir = context.layout.state_dir
    dep_file = str(state_dir / DEP_FILE)
    started = time.perf_counter()
    session = context.session
    decision = uptodate.decide(state_dir, dicts, dep_file)
    figures = {
        "seconds": round(time.perf_counter() - started, 3),
        "proven": len(dicts) - len(decision.pending),
        "handed_to_doit": len(decision.pending),
        "touched_unchanged": decision.touched,
    }
    if not decision.pending:
        if decision.touched:
            uptodate.record(state_dir, decision, {}, dep_file)
        return _report_all_up_to_date(dicts, display), figures
    _loaded(options)
    from nkibuild.graph.handover import handed_over, proof_checker
    from nkibuild.graph.loader import doit_config

    config = {
        **doit_config(context),
        "default_tasks": decision.pending,
        "check_file_uptodate": proof_checker(decision),
    }
    verified: dict[str, int] = {}
    written: dict[str, Recorded] = {}
    # The bundle takes the stamps deciding saw of the files no task writes before it.
    seen = uptodate.seen_by(decision, BUNDLE_TASK)
    definition = decision.fingerprints.get(BUNDLE_TASK, "")
    handed = [seeing(task, seen, definition) for task in handed_over(decision, dicts)]
    summary = run_task_graph(
        session,
        handed,
        config,
        options,
        display,
        proven=decision.proven,
        verified=verified,
        written=written,
    )
    if not session.state_failures:  # else doit's state is what it was before
        uptodate.record(state_dir, decision, verified, dep_file, written)
    return summary, figures


def _loaded(options: RunOptions) -> None:
    """Everything doit needs is loaded: see RunOptions.owns_process."""
    if options.owns_process:
        gc.freeze()


def _report_all_up_to_date(dicts: list[dict], display: Display) -> BuildSummary:
    reporter = BuildReporter(display)
    names = [task_name(task) for task in dicts]
    reporter.start(len(names))
    for name in names:
        reporter.up_to_date(name)
    reporter.complete_run()
    return reporter.summary


class _PartlyProvenReporter(BuildReporter):
    """Reports the tasks the proof covers as up to date, then what doit does with the rest;
    notes when doit found each task up to date or ran it (`verified`: name -> time_ns),
    and the outputs a task that ran recorded as it wrote them (`written`: name -> the
    fingerprints its outputs check keeps, graph/intact.py)."""

    def __init__(
        self,
        display: Display,
        proven: Sequence[str],
        verified: dict[str, int],
        written: dict[str, Recorded],
    ) -> None:
        super().__init__(display)
        self.proven = proven
        self.verified = verified
        self.written = written

    def add_success(self, task: Any) -> None:
        self.verified[task.name] = time.time_ns()
        outputs = task.values.get(VALUES_KEY) if isinstance(task.values, dict) else None
        recorded = recorded_outputs(outputs) if outputs is not None else None
        if recorded is not None:
            self.written[task.name] = recorded
        super().add_success(task)

    def skip_uptodate(self, task: Any) -> None:
        self.verified[task.name] = time.time_ns()
        super().skip_uptodate(task)

    def start(self, tasks: int) -> None:
        super().start(tasks + len(self.proven))
        for name in self.proven:
            self.up_to_date(name)


def _run_doit(
    context: BuildContext, dicts: list[dict], options: RunOptions, display: Display
) -> BuildSummary:
    from nkibuild.graph.loader import doit_config

    return run_task_graph(context.session, dicts, doit_config(context), options, display)


def run_task_graph(
    session: BuildSession,
    dicts: list[dict],
    config: dict,
    options: RunOptions,
    display: Display,
    proven: Sequence[str] = (),
    verified: dict[str, int] | None = None,
    written: dict[str, Recorded] | None = None,
) -> BuildSummary:
    """Let doit run task dicts with `config` (dep_file, default_tasks, ...); report through
    `display`, with the tasks named in `proven` (not in `dicts`) as up to date; fills
    `verified` and `written` (see _PartlyProvenReporter). The caller runs `session` and
    holds whatever locks the outputs need."""
    from nkibuild.graph.loader import NkibuildLoader, doit_main

    reporter = _PartlyProvenReporter(
        display,
        proven,
        {} if verified is None else verified,
        {} if written is None else written,
    )
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
    doit's tasks only to name them cost a cold build ~4 ms before its first compile."""
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
