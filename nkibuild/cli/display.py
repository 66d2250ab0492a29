"""Progress output: a rich live view on terminals, plain lines for logs and CI."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from nkibuild.graph.report import BuildSummary, TaskOutcome


def use_rich(stream: TextIO) -> bool:
    """Rich only for an interactive terminal; plain lines under CI, NO_COLOR or a pipe."""
    if os.environ.get("NO_COLOR") or os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return False
    return stream.isatty()


def summary_line(summary: BuildSummary) -> str:
    origins = summary.origins
    parts = [
        f"{len(summary.executed)} ran",
        f"{len(summary.up_to_date)} up to date",
        f"{origins.get('compiled', 0) + origins.get('ray', 0)} compiled",
        f"{origins.get('cache', 0) + origins.get('build-dir', 0)} compile cache hits",
    ]
    if origins.get("ray"):
        parts[2] += f" ({origins['ray']} on Ray)"
    if summary.failures:
        parts.append(f"{len(summary.failures)} failed")
    blocked = summary.names("blocked")
    if blocked:
        parts.append(f"{len(blocked)} not run (a dependency failed)")
    return ", ".join(parts)


class PlainDisplay:
    """One line per finished task; up-to-date tasks are counted, not listed."""

    def __init__(self, stream: TextIO = sys.stdout) -> None:
        self.stream = stream
        self.total = 0
        self.finished = 0

    def start(self, tasks: int) -> None:
        self.total = tasks

    def task_started(self, name: str) -> None:
        pass

    def task_finished(self, outcome: TaskOutcome) -> None:
        self.finished += 1
        if outcome.status == "up-to-date":
            return
        width = len(str(self.total))
        detail = f" ({outcome.detail})" if outcome.detail and outcome.status == "done" else ""
        self.stream.write(
            f"[{self.finished:>{width}}/{self.total}] {outcome.status:<6} {outcome.name}"
            f" {outcome.seconds:.1f}s{detail}\n"
        )
        for notice in outcome.notices:
            self.stream.write(f"    warning: {notice}\n")
        self.stream.flush()

    def finish(self, summary: BuildSummary) -> None:
        self.stream.write(summary_line(summary) + "\n")


class RichDisplay:
    """A progress bar with the running tasks, then the same summary line."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = Console()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        self.bar = self.progress.add_task("building", total=0)
        self.running: dict[str, float] = {}

    def start(self, tasks: int) -> None:
        self.progress.update(self.bar, total=tasks)
        self.progress.start()

    def task_started(self, name: str) -> None:
        self.running[name] = 0.0
        self._describe()

    def task_finished(self, outcome: TaskOutcome) -> None:
        self.running.pop(outcome.name, None)
        self.progress.advance(self.bar)
        self._describe()
        from rich.markup import escape

        if outcome.status == "done":
            detail = f" [dim]({outcome.detail})[/]" if outcome.detail else ""
            self.console.print(f"[green]✓[/] {outcome.name} [dim]{outcome.seconds:.1f}s[/]{detail}")
            for notice in outcome.notices:
                self.console.print(f"  [yellow]warning:[/] {escape(notice)}", highlight=False)
        elif outcome.status == "failed":
            self.console.print(f"[red]✗ {outcome.name}[/]")

    def finish(self, summary: BuildSummary) -> None:
        self.progress.stop()
        style = "green" if summary.ok else "red"
        self.console.print(f"[{style}]{summary_line(summary)}[/]")

    def _describe(self) -> None:
        running = ", ".join(list(self.running)[:3]) + (" …" if len(self.running) > 3 else "")
        self.progress.update(self.bar, description=running or "building")
