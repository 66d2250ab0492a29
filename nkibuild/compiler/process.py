"""Run one compiler process: own process group, timeout, peak memory.

neuronx-cc starts helper processes of its own, so a timeout or an interrupt
kills the whole process group, and nothing it started outlives the compile.
The peak resident memory comes from `os.wait4`, which reports the largest of
the process and its waited-for descendants.

A compiler must also die when its build is killed (SIGKILL runs no cleanup): it gets
the parent-death signal from `setpriv --pdeathsig KILL` (util-linux) put in front of
its command, or, where there is no setpriv, from a `preexec_fn`. setpriv is preferred
because a `preexec_fn` takes subprocess off its vfork path: forking the whole build
process cost about 7 ms per compile on a 2-core machine, against 1.5 ms.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nkibuild import interrupts

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_SETPRIV = "setpriv"


@dataclass(frozen=True)
class ProcessOutcome:
    returncode: int  # negative: killed by that signal
    peak_memory: int  # bytes
    seconds: float
    timed_out: bool

    @property
    def killed(self) -> bool:
        """Died of SIGKILL from outside: the Linux OOM killer's signal."""
        return self.returncode == -signal.SIGKILL and not self.timed_out


class ProcessRegistry:
    """Process groups of the compilers a build session runs now, in any of its threads,
    and how they are started (`death_guard`)."""

    def __init__(self) -> None:
        self.death_guard = DeathGuard.find()
        self._groups: set[int] = set()
        self._lock = threading.Lock()
        self._stopped = False  # after kill_all: a compiler started late is killed at once

    def add(self, pid: int) -> None:
        with self._lock:
            self._groups.add(pid)
            stopped = self._stopped
        if stopped:
            _kill_group(pid)

    def discard(self, pid: int) -> None:
        with self._lock:
            self._groups.discard(pid)

    def kill_all(self) -> None:
        """Stop every compile still running: the build was interrupted while other threads
        waited on compilers (only the main thread sees KeyboardInterrupt)."""
        with self._lock:
            self._stopped = True
            groups = list(self._groups)
        for pid in groups:
            _kill_group(pid)


def run_process(
    command: list[str],
    cwd: Path,
    output: Path,
    timeout: float | None,
    registry: ProcessRegistry | None = None,
    env: dict[str, str] | None = None,
) -> ProcessOutcome:
    """Run `command` in `cwd` with stdout and stderr to `output`; OSError if it cannot start.

    While it runs, its process group is in `registry`, so the session can kill it."""
    registry = registry if registry is not None else ProcessRegistry()
    guard = registry.death_guard
    started = time.monotonic()
    expired = threading.Event()
    process: subprocess.Popen[bytes] | None = None
    timer: threading.Timer | None = None
    try:
        with interrupts.deferred():  # a compiler started is a compiler registered
            with open(output, "wb") as sink:
                process = subprocess.Popen(
                    guard.command(command, cwd, env),
                    cwd=cwd,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=guard.preexec_fn,
                    env=env,
                )
            if timeout is not None:
                timer = threading.Timer(timeout, _expire, (process.pid, expired))
                timer.daemon = True
                timer.start()
            registry.add(process.pid)
        # Wait without reaping: while the compiler is a zombie its process group id
        # cannot be reused, so killing the group cannot hit an unrelated process.
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    except BaseException:
        if process is not None:  # interrupted: take the compiler down with us
            _kill_group(process.pid)
            process.wait()
        raise
    finally:
        if timer is not None:
            timer.cancel()
        if process is not None:
            registry.discard(process.pid)
    _kill_group(process.pid)  # helpers the compiler left behind
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return ProcessOutcome(
        returncode=process.returncode,
        peak_memory=usage.ru_maxrss * 1024,  # Linux reports KiB
        seconds=time.monotonic() - started,
        timed_out=expired.is_set(),
    )


@dataclass(frozen=True)
class DeathGuard:
    """Makes a started process get SIGKILL when the thread that started it dies (Linux)."""

    prefix: tuple[str, ...]  # put before the command (setpriv), or ()
    preexec_fn: Callable[[], None] | None  # run in the child before exec, or None

    @classmethod
    def find(cls) -> DeathGuard:
        setpriv = shutil.which(_SETPRIV) if sys.platform.startswith("linux") else None
        if setpriv is not None:
            return cls((setpriv, "--pdeathsig", "KILL", "--"), None)
        return cls.fallback()

    @classmethod
    def fallback(cls) -> DeathGuard:
        """The same signal set by a preexec_fn (where there is no setpriv; none where there
        is no prctl either). prctl is looked up before the fork: the child may only make
        the call, not load libraries."""
        if not sys.platform.startswith("linux"):
            return cls((), None)
        try:
            prctl = ctypes.CDLL(None, use_errno=True).prctl
        except (OSError, AttributeError):
            return cls((), None)
        parent = os.getpid()

        def arm() -> None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the parent died before the call
                os._exit(1)

        return cls((), arm)

    def command(self, command: list[str], cwd: Path, env: dict[str, str] | None) -> list[str]:
        """`command` behind the prefix. A command that cannot be found raises here, as
        Popen would: behind setpriv it would only make setpriv exit 127."""
        if not self.prefix:
            return command
        program = command[0]
        if os.sep in program:  # found from the cwd it runs in, as exec finds it
            program = os.path.join(cwd, program)
        path = env.get("PATH", os.defpath) if env is not None else None
        if shutil.which(program, path=path) is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command[0])
        return [*self.prefix, *command]


def _expire(pid: int, expired: threading.Event) -> None:
    """The timeout: stop the compiler's group, unless the compiler exited in time (and is
    a zombie its thread has not reaped yet)."""
    if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        expired.set()
        _kill_group(pid)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
