"""A yes/no check run in a forked copy of this process, on the machine's other core.

A cold build validates its manifest before anything else can start: importing
jsonschema and checking the document take ~80-100 ms of one core while the other idles.
A forked child inherits the parsed document and answers only "valid" (exit 0) or not;
the build process meanwhile does work that does not depend on the answer (imports)
and joins the child before it acts on the manifest. A child that gives no answer (reaped
by the system, or still running after ANSWER_TIMEOUT) counts as "not shown valid": the
manifest is then checked in-process. The child writes nothing (its
stdout and stderr go to /dev/null) and leaves by `os._exit`: no atexit handler, no
buffer flushed twice, no exception reaching the parent's code.

Only where forking is safe: Linux, and a process with no other thread (a thread
holding a lock at the fork would leave it held in the child forever). And only where
a core is idle: the child runs in the build's session, which the kernel schedules as
one group (autogrouping), so on a machine whose cores are all busy the child's CPU
would be taken from the build process itself, and the fork would only add its cost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

_PASSED, _FAILED, _CRASHED = 0, 1, 2
# Longer than any check takes (~0.1 s); past it the child is taken as stuck.
ANSWER_TIMEOUT = 10.0


class ForkedCheck:
    """A running check; `passed()` waits for its answer, `cancel()` kills it."""

    def __init__(self, pid: int) -> None:
        self._pid: int | None = pid
        self._status: int | None = None

    @classmethod
    def start(cls, check: Callable[[], bool]) -> ForkedCheck | None:
        """`check()` running in a child process; None where no child can run it."""
        if not sys.platform.startswith("linux") or threading.active_count() != 1:
            return None
        if not _idle_core():
            return None
        # Ctrl-C held back across the fork: the child then dies of it (SIG_DFL) instead
        # of raising KeyboardInterrupt into a copy of the build, the parent raises it.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            pid = os.fork()
        except OSError:  # no process left under the user's limit: check in-process
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            return None
        if pid == 0:
            _run_child(check, blocked)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return cls(pid)

    def passed(self, timeout: float = ANSWER_TIMEOUT) -> bool:
        """Whether the check answered yes within `timeout` seconds (False if it said no,
        failed, was killed, or is still running then: it is killed, and the caller checks
        in-process)."""
        deadline = time.monotonic() + timeout
        while self._pid is not None:
            try:
                pid, status = os.waitpid(self._pid, os.WNOHANG)
            except ChildProcessError:  # reaped by the system (SIGCHLD ignored): no answer
                self._pid = None
                break
            if pid:
                self._pid, self._status = None, status
            elif time.monotonic() > deadline:  # stuck (a lock another thread held?)
                self.cancel()
            else:
                time.sleep(0.001)
        return self._status is not None and os.waitstatus_to_exitcode(self._status) == _PASSED

    def cancel(self) -> None:
        """Kill and reap the child if it still runs (the parent was interrupted)."""
        if self._pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # reaped by the system already
            os.waitpid(self._pid, 0)
        self._pid = None


def _run_child(check: Callable[[], bool], mask: set[signal.Signals]) -> None:
    code = _CRASHED
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        # Python's streams too: one may write to another descriptor (a capture).
        sys.stdout = sys.stderr = open(devnull, "w", closefd=False)  # noqa: SIM115
        code = _PASSED if check() else _FAILED
    finally:  # whatever happened (a failure is "not shown valid"), the child ends here
        os._exit(code)


def _idle_core(loadavg: str = "/proc/loadavg") -> bool:
    """Whether a core is left for the child: no more tasks runnable now, as
    /proc/loadavg counts them (this process among them, and the compiler's `--version`
    query the build may have started, which ends soon), than this process's cores."""
    try:
        with open(loadavg) as handle:
            runnable = int(handle.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return False
    return runnable <= len(os.sched_getaffinity(0))
