"""Work a build does while one of its compilers runs, instead of between two compiles.

A compile slot is on the build's critical path from one compiler's exit to the next
one's start; the thread that started a compiler only waits for it meanwhile. So what
need not happen between two compiles is queued here and done by whichever compile
thread next starts to wait: removing a finished compile's work dir (the filesystem
can take a while), extracting a prebuilt module ahead of its extract task.

The session owns one `Chores`; `finish` (at the session's end) removes the work dirs
still queued and drops the jobs no wait ran (each job's owner then does its work
itself, or cleans up after it). A killed build leaves its queued work dirs behind for
the next one to sweep (their `.work-` names are leftovers, see fsutil.LEFTOVER_PATTERNS).
"""

from __future__ import annotations

import shutil
import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path


class Chores:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._removals: list[Path] = []
        self._jobs: deque[Callable[[], None]] = deque()

    def remove_later(self, directory: Path) -> None:
        """Remove `directory` (a tree nothing reads any more) during a later wait."""
        with self._lock:
            self._removals.append(directory)

    def offer(self, job: Callable[[], None]) -> None:
        """Run `job` during a later wait, if one comes before the session ends. A job
        must not raise: a failure is its owner's to notice (e.g. by finding no result)."""
        with self._lock:
            self._jobs.append(job)

    def run(self, running: Callable[[], bool], *, jobs: bool = True) -> None:
        """Do what is queued while `running()` (the compiler this thread just started
        runs): a compile slot is not held past its compiler's exit for more than the
        chore under way then. `jobs`: run the offered jobs too, not only the removals."""
        self._remove_queued()
        while jobs and running():
            with self._lock:
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            job()

    def finish(self) -> None:
        """The session ends: remove the queued work dirs, drop the jobs not run."""
        with self._lock:
            self._jobs.clear()
        self._remove_queued()

    def _remove_queued(self) -> None:
        with self._lock:
            doomed, self._removals = self._removals, []
        for directory in doomed:
            shutil.rmtree(directory, ignore_errors=True)
