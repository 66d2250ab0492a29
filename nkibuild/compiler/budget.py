"""Admission of concurrent compiles: under a memory budget, and once per cache key.

doit's `-j N` bounds how many compiles run; this bounds how much memory they may
need together, so large kernels do not OOM each other. Compiles are admitted in
arrival order (a big one waiting is not starved by small ones behind it), one
whose estimate exceeds the whole budget runs with nothing beside it, and a retry
after an OOM kill can ask to run alone.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager


class MemoryBudget:
    def __init__(self, total: int | None = None, jobs: int = 1) -> None:
        self._condition = threading.Condition()
        self._queue: deque[object] = deque()
        self._in_use = 0
        self._running = 0
        self._alone = False
        self.total = total  # bytes; None: unlimited
        self.jobs = max(1, jobs)  # the build's tasks at once

    def charge(self, estimate: int | None) -> int:
        """What a compile is counted as: its estimate, or a fair share when nothing is known."""
        if self.total is None:
            return 0
        if estimate is None:
            return self.total // self.jobs
        return min(estimate, self.total)

    @contextmanager
    def reserve(self, estimate: int | None, *, alone: bool = False) -> Iterator[None]:
        charge = self.charge(estimate)
        with self._condition:
            ticket = object()
            self._queue.append(ticket)
            try:
                self._condition.wait_for(lambda: self._admits(ticket, charge, alone))
            finally:
                self._queue.remove(ticket)
                self._condition.notify_all()
            self._running += 1
            self._in_use += charge
            self._alone = alone
        try:
            yield
        finally:
            with self._condition:
                self._running -= 1
                self._in_use -= charge
                self._alone = False
                self._condition.notify_all()

    def _admits(self, ticket: object, charge: int, alone: bool) -> bool:
        if self._queue[0] is not ticket or self._alone:
            return False
        if self._running == 0:
            return True
        if alone:
            return False
        return self.total is None or self._in_use + charge <= self.total


class KeyLocks:
    """One lock per cache key: units with equal keys (the same kernel in two projects of
    a release) compile once; the second waits, then finds the first's NEFF cached."""

    def __init__(self) -> None:
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()

    def lock(self, digest: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(digest, threading.Lock())
