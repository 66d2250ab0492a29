"""What every build holds while its task graph runs, and what it leaves behind.

A session takes the build directories' locks, configures the compile memory
budget and the frontend workers' scratch space, and on the way out stops every
compiler, worker and Ray connection. It also keeps a marker in each locked
directory while it runs: a marker found by the next session means the last one
was killed (SIGKILL, power loss) before its cleanup ran, so the temp files and
staging directories it was writing are swept away. Nothing else can be using
them: the sweeping session holds the lock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.errors import UsageError
from nkibuild.fsutil import LEFTOVER_PATTERNS, atomic_write_text, leftovers

if TYPE_CHECKING:
    from filelock import BaseFileLock

LOCK_FILE = "build.lock"
RUNNING_FILE = "running.json"


@dataclass(frozen=True)
class SessionDirs:
    """A directory to lock (its `state/` holds the lock and the marker) and the
    directories whose leftovers an interrupted session there may have left."""

    locked: Path
    swept: tuple[Path, ...] = ()


@contextlib.contextmanager
def build_session(
    dirs: Sequence[SessionDirs],
    *,
    max_compile_memory: int | None,
    jobs: int,
    lock_timeout: float = 0.0,
) -> Iterator[None]:
    from nkibuild.compiler.budget import COMPILE_BUDGET
    from nkibuild.toolchain.worker_pool import POOL

    with contextlib.ExitStack() as held:
        for entry in dirs:
            held.callback(acquire_build_lock(entry.locked, lock_timeout).release)
        for entry in dirs:
            _recover(entry)
        COMPILE_BUDGET.configure(max_compile_memory, jobs)
        POOL.configure(scratch_root=dirs[0].locked / "state")
        try:
            yield
        except BaseException:
            from nkibuild.compiler.process import kill_running

            kill_running()  # e.g. Ctrl-C: no compiler or worker may outlive the build
            _stop_helpers(kill=True)
            raise
        _stop_helpers(kill=False)
        for entry in dirs:  # a clean exit, even of a failed build: nothing to sweep
            (entry.locked / "state" / RUNNING_FILE).unlink(missing_ok=True)


def acquire_build_lock(build_dir: Path, timeout: float = 0.0) -> BaseFileLock:
    """The build dir's lock: doit neither locks its state file nor saves it before the
    end of a run, so two concurrent runs would both execute everything. The lock is
    an fcntl lock: the kernel drops it when its holder dies, so none is ever stale."""
    from filelock import FileLock, Timeout

    state_dir = build_dir / "state"
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(state_dir / LOCK_FILE))
    try:
        lock.acquire(timeout=timeout)
    except Timeout:
        raise UsageError(
            f"another nkibuild build is running in {build_dir} "
            f"(lock {state_dir / LOCK_FILE}); wait for it or use another --build-dir"
        ) from None
    return lock


def _recover(entry: SessionDirs) -> None:
    marker = entry.locked / "state" / RUNNING_FILE
    if marker.exists():
        for directory in (entry.locked, *entry.swept):
            remove_leftovers(directory)
    atomic_write_text(marker, f'{{"pid": {os.getpid()}}}\n', durable=False)


def remove_leftovers(directory: Path) -> int:
    """Delete what an interrupted writer left under `directory`; how many were removed."""
    found = leftovers(directory, LEFTOVER_PATTERNS)
    for path in found:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return len(found)


def _stop_helpers(*, kill: bool) -> None:
    from nkibuild.toolchain.worker_pool import POOL

    POOL.close(kill=kill)  # workers live for one build: the next may see changed user code
    POOL.configure(scratch_root=None)
    executor = sys.modules.get("nkibuild.compiler.ray_executor")
    if executor is not None:  # only a build with --executor ray imported it
        executor.shutdown()
