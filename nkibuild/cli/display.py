"""Progress output: a rich live view on terminals, plain lines for logs and CI.

Both displays write to the stream they were given (default: `sys.stdout` as it is
when the display is made), never to whatever `sys.stdout` is later: doit's
PythonAction swaps the global `sys.stdout`/`sys.stderr` for capture objects while
actions run, and with `-j N` those swaps overlap the reporter's calls from other
threads, so output sent to "the current sys.stdout" lands in some action's capture.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import TextIO

from nkibuild.errors import UsageError
from nkibuild.graph.report import BuildSummary, TaskOutcome, compile_counts
from nkibuild.quantities import parse_duration


def use_rich(stream: TextIO) -> bool:
    """Rich only for an interactive terminal; plain lines under CI, NO_COLOR or a pipe."""
    if os.environ.get("NO_COLOR") or os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        return False
    return stream.isatty()


def summary_line(summary: BuildSummary) -> str:
    counts = compile_counts(summary.origins)
    parts = [
        f"{len(summary.executed)} ran",
        f"{len(summary.up_to_date)} up to date",
        f"{counts['compiled']} compiled",
        f"{counts['reused_from_build_dir']} reused from build dir",
        f"{counts['local_cache_hits']} local cache hits",
        f"{counts['remote_cache_hits']} remote cache hits",
    ]
    if counts["compiled_on_ray"]:
        parts[2] += f" ({counts['compiled_on_ray']} on Ray)"
    if summary.failures:
        parts.append(f"{len(summary.failures)} failed")
    blocked = summary.names("blocked")
    if blocked:
        parts.append(f"{len(blocked)} not run (a dependency failed)")
    return ", ".join(parts)


HEARTBEAT_ENV = "NKIBUILD_HEARTBEAT"
DEFAULT_HEARTBEAT_S = 60.0
HEARTBEAT_TASKS = 8  # listed by name in one heartbeat line; the rest are counted


def heartbeat_interval() -> float:
    """Seconds between heartbeats of the plain display (0: none), from NKIBUILD_HEARTBEAT."""
    try:
        return parse_duration(os.environ.get(HEARTBEAT_ENV, "").strip() or DEFAULT_HEARTBEAT_S)
    except ValueError as error:
        raise UsageError(f"{HEARTBEAT_ENV}: {error} (0 turns the heartbeat off)") from None


def format_elapsed(seconds: float) -> str:
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60:02d}s"
    return f"{whole // 3600}h {whole % 3600 // 60:02d}m"


class PlainDisplay:
    """One line per finished task; up-to-date tasks are counted, not listed.

    A compile can take hours, and CI systems kill steps that print nothing for a while,
    so every `heartbeat_s` seconds (default: `heartbeat_interval()`) a line says which
    tasks are still running and for how long.
    """

    def __init__(self, stream: TextIO | None = None, heartbeat_s: float | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.total = 0
        self.finished = 0
        self.heartbeat_s = heartbeat_interval() if heartbeat_s is None else heartbeat_s
        self.running: dict[str, float] = {}  # task -> time.monotonic() when it started
        self.output_lost = False  # the stream was closed under us: write nothing more
        # doit's thread runner reports from its worker threads too: keep each line whole.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def start(self, tasks: int) -> None:
        self.total = tasks
        if self.heartbeat_s > 0 and self._beat is None:
            self._stop = threading.Event()
            # A daemon: a build that dies without calling finish() must not hang on it.
            self._beat = threading.Thread(
                target=self._beat_until_stopped, name="nkibuild-heartbeat", daemon=True
            )
            self._beat.start()

    def task_started(self, name: str) -> None:
        with self._lock:
            self.running[name] = time.monotonic()

    def task_finished(self, outcome: TaskOutcome) -> None:
        with self._lock:
            self.running.pop(outcome.name, None)
            self.finished += 1
            if outcome.status != "up-to-date":
                self._write(self._line(outcome))

    def finish(self, summary: BuildSummary) -> None:
        self.close()
        with self._lock:
            self._write(summary_line(summary) + "\n")

    def close(self) -> None:
        """Stop the heartbeat (finish() does; callers whose build raised call this)."""
        beat, self._beat = self._beat, None
        if beat is not None:
            self._stop.set()
            beat.join()

    def heartbeat(self) -> None:
        """Write which tasks are running and for how long (nothing if none is)."""
        with self._lock:
            if not self.running:
                return
            now = time.monotonic()
            oldest = sorted(self.running.items(), key=lambda item: item[1])
            shown = [f"{name} ({format_elapsed(now - t)})" for name, t in oldest[:HEARTBEAT_TASKS]]
            more = len(oldest) - len(shown)
            width = len(str(self.total))
            self._write(
                f"[{self.finished:>{width}}/{self.total}] running {', '.join(shown)}"
                + (f" and {more} more" if more else "")
                + "\n"
            )

    def _beat_until_stopped(self) -> None:
        while not self._stop.wait(self.heartbeat_s) and not self.output_lost:
            self.heartbeat()

    def _line(self, outcome: TaskOutcome) -> str:
        width = len(str(self.total))
        detail = f" ({outcome.detail})" if outcome.detail and outcome.status == "done" else ""
        line = (
            f"[{self.finished:>{width}}/{self.total}] {outcome.status:<6} {outcome.name}"
            f" {outcome.seconds:.1f}s{detail}\n"
        )
        return line + "".join(f"    warning: {notice}\n" for notice in outcome.notices)

    def _write(self, text: str) -> None:
        if self.output_lost:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            # The reader went away (`nkibuild build | head`): the build itself goes on,
            # its outputs are what matters; only the progress lines have nowhere to go.
            self.output_lost = True


class RichDisplay:
    """A progress bar with the running tasks, then the same summary line."""

    def __init__(self, stream: TextIO | None = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        # file= pins the console to this stream; without it rich resolves sys.stdout
        # on every print, which is an action's capture object half of the time.
        self.console = Console(file=stream if stream is not None else sys.stdout)
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
        # task_started comes from doit's worker threads, task_finished from its main one.
        self._lock = threading.Lock()

    def start(self, tasks: int) -> None:
        self.progress.update(self.bar, total=tasks)
        self.progress.start()

    def task_started(self, name: str) -> None:
        with self._lock:
            self.running[name] = 0.0
            self._describe()

    def task_finished(self, outcome: TaskOutcome) -> None:
        with self._lock:
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
        self.close()
        style = "green" if summary.ok else "red"
        self.console.print(f"[{style}]{summary_line(summary)}[/]")

    def close(self) -> None:
        """Give the terminal back (finish() does; callers whose build raised call this)."""
        self.progress.stop()

    def _describe(self) -> None:
        running = ", ".join(list(self.running)[:3]) + (" …" if len(self.running) > 3 else "")
        self.progress.update(self.bar, description=running or "building")
