"""A doit reporter that turns doit's callbacks into a BuildSummary and display events.

It never prints: rendering belongs to the `display` the CLI passes in.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from nkibuild.cache.stats import TierCounts

REPORT_FORMAT = 1


@dataclass
class TaskOutcome:
    name: str
    status: str  # "done", "up-to-date", "failed", "blocked" (a dependency failed), "skipped"
    seconds: float = 0.0
    detail: str = ""  # e.g. the cache origin of a compile, or the failure message
    notices: tuple[str, ...] = ()  # warnings that did not fail the task
    compile_seconds: float | None = None  # a compile's: of the compile that made its NEFF
    peak_memory: int | None = None  # bytes, of that compile (0: not measured)


@dataclass
class BuildSummary:
    outcomes: list[TaskOutcome] = field(default_factory=list)
    runtime_errors: list[str] = field(default_factory=list)

    def names(self, status: str) -> list[str]:
        return [o.name for o in self.outcomes if o.status == status]

    @property
    def executed(self) -> list[str]:
        return self.names("done")

    @property
    def up_to_date(self) -> list[str]:
        return self.names("up-to-date")

    @property
    def failures(self) -> list[TaskOutcome]:
        return [o for o in self.outcomes if o.status == "failed"]

    @property
    def compiles(self) -> list[TaskOutcome]:
        # A release namespaces tasks: "<distribution>/compile:<unit>".
        return [o for o in self.outcomes if o.name.partition(":")[0].endswith("compile")]

    @property
    def origins(self) -> Counter[str]:
        """How compiles were satisfied: compiled, ray, cache-local, cache-remote, build-dir."""
        return Counter(o.detail for o in self.compiles if o.status == "done")

    @property
    def notices(self) -> list[str]:
        return [f"{o.name}: {notice}" for o in self.outcomes for notice in o.notices]

    @property
    def ok(self) -> bool:
        return not self.failures and not self.names("blocked") and not self.runtime_errors

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "executed": self.executed,
            "up_to_date": self.up_to_date,
            "failed": {o.name: o.detail for o in self.failures},
            "blocked": self.names("blocked"),
            "compile_origins": dict(self.origins),
            "compiles": compile_counts(self.origins),
            "notices": self.notices,
            "runtime_errors": self.runtime_errors,
        }


def compile_counts(origins: Mapping[str, int]) -> dict[str, int]:
    """Where the NEFFs of the compiles that ran came from, one count per source.

    The one place these categories are defined: the summary line, `build --json`
    and the release report all show these counts, so they cannot disagree.
    """
    return {
        "compiled": origins.get("compiled", 0) + origins.get("ray", 0),
        "compiled_on_ray": origins.get("ray", 0),
        "reused_from_build_dir": origins.get("build-dir", 0),
        "local_cache_hits": origins.get("cache-local", 0),
        "remote_cache_hits": origins.get("cache-remote", 0),
    }


def build_report(
    summary: BuildSummary,
    cache: Mapping[str, TierCounts],
    *,
    command: str,
    interrupted: bool,
    seconds: float,
) -> dict[str, Any]:
    """The `--report FILE` document (docs/cli.md): the summary of `build --json`, the
    cache tiers' counts of this build and one record per compile unit that finished."""
    from nkibuild.cache.stats import totals

    status = "interrupted" if interrupted else "ok" if summary.ok else "failed"
    return {
        "format": REPORT_FORMAT,
        "command": command,
        "status": status,
        "seconds": round(seconds, 3),
        **summary.to_json(),
        "ok": status == "ok",
        "cache": {tier: counts.to_json() for tier, counts in totals([cache]).items()},
        "units": [unit_report(outcome) for outcome in summary.compiles],
    }


def unit_report(outcome: TaskOutcome) -> dict[str, Any]:
    done = outcome.status == "done"
    return {
        "unit": outcome.name.partition(":")[2],
        "task": outcome.name,
        "status": outcome.status,
        "origin": outcome.detail if done else None,
        "seconds": round(outcome.seconds, 3),
        "compile_seconds": outcome.compile_seconds,
        "peak_memory": outcome.peak_memory,
        "error": outcome.detail if outcome.status in ("failed", "blocked") else None,
    }


class Display(Protocol):
    def start(self, tasks: int) -> None: ...
    def task_started(self, name: str) -> None: ...
    def task_finished(self, outcome: TaskOutcome) -> None: ...
    def finish(self, summary: BuildSummary) -> None: ...


class BuildReporter:
    """doit reporter API (see doit.reporter.ConsoleReporter); group tasks are not reported.

    A group task is told by `has_subtask`, not by its empty `actions`: doit creates a
    task's action objects when `actions` is first read, which for tasks that do not
    run is work spent only on the report."""

    def __init__(self, display: Display) -> None:
        self.display = display
        self.summary = BuildSummary()
        self._started: dict[str, float] = {}

    def initialize(self, tasks: dict[str, Any], selected_tasks: list[str]) -> None:
        closure = _closure(tasks, selected_tasks)
        self.display.start(sum(1 for name in closure if not tasks[name].has_subtask))

    def get_status(self, task: Any) -> None:
        pass

    def execute_task(self, task: Any) -> None:
        if not task.has_subtask:
            self._started[task.name] = time.monotonic()
            self.display.task_started(task.name)

    def add_success(self, task: Any) -> None:
        if not task.has_subtask:
            values = task.values if isinstance(task.values, dict) else {}
            detail = str(values.get("origin", ""))
            notices = tuple(map(str, values.get("notices", ())))
            seconds = self._elapsed(task)
            compile_seconds, peak = values.get("compile_seconds"), values.get("peak_memory")
            self._record(
                TaskOutcome(task.name, "done", seconds, detail, notices, compile_seconds, peak)
            )

    def add_failure(self, task: Any, fail: Any) -> None:
        from doit.exceptions import UnmetDependency

        if isinstance(fail, UnmetDependency):
            # Under --keep-going doit reports tasks downstream of a failure this way.
            self._record(TaskOutcome(task.name, "blocked", 0.0, f"needs {fail.message}"))
            return
        message = fail.get_msg() if getattr(fail, "traceback", None) else fail.message
        self._record(TaskOutcome(task.name, "failed", self._elapsed(task), str(message).rstrip()))

    def skip_uptodate(self, task: Any) -> None:
        if not task.has_subtask:
            self._record(TaskOutcome(task.name, "up-to-date"))

    def skip_ignore(self, task: Any) -> None:
        if not task.has_subtask:
            self._record(TaskOutcome(task.name, "skipped"))

    def cleanup_error(self, exception: Any) -> None:
        self.summary.runtime_errors.append(exception.get_msg())

    def runtime_error(self, msg: str) -> None:
        self.summary.runtime_errors.append(msg)

    def teardown_task(self, task: Any) -> None:
        pass

    def complete_run(self) -> None:
        self.display.finish(self.summary)

    def _elapsed(self, task: Any) -> float:
        started = self._started.pop(task.name, None)
        return time.monotonic() - started if started is not None else 0.0

    def _record(self, outcome: TaskOutcome) -> None:
        self.summary.outcomes.append(outcome)
        self.display.task_finished(outcome)


class RecordingDisplay:
    """A display that keeps what it was shown, for a report written whatever happens.

    doit hands the summary to `finish` even when the build is interrupted; until then
    (or if doit never ran) the outcomes seen so far make up the summary."""

    def __init__(self, display: Display) -> None:
        self.display = display
        self.summary = BuildSummary()

    def start(self, tasks: int) -> None:
        self.display.start(tasks)

    def task_started(self, name: str) -> None:
        self.display.task_started(name)

    def task_finished(self, outcome: TaskOutcome) -> None:
        self.summary.outcomes.append(outcome)
        self.display.task_finished(outcome)

    def finish(self, summary: BuildSummary) -> None:
        self.summary = summary
        self.display.finish(summary)


def _closure(tasks: dict[str, Any], selected: list[str]) -> set[str]:
    """The selected tasks and everything they depend on (what doit may run)."""
    seen: set[str] = set()
    pending = [name for name in selected if name in tasks]
    while pending:
        name = pending.pop()
        if name not in seen:
            seen.add(name)
            task = tasks[name]
            pending += [dep for dep in (*task.task_dep, *task.setup_tasks) if dep in tasks]
    return seen
