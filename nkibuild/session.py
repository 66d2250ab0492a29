"""One build session: everything a build (or a release) owns while it runs.

A `BuildSession` holds the frontend workers (and the trace failures they
reported), the compile memory budget, the per-cache-key locks, the registry of
running compiler processes, the compiler versions already asked for, the Ray
connection it opened and what doit's state backend could not save. Nothing of
that lives at module level: two sessions in one process (two builds in two
threads, two PEP 517 hook calls) share nothing.

`BuildSession.running()` is the build's lifetime: it takes the build
directories' locks, keeps a marker in each while it runs (a marker found by the
next session means the last one was killed before its cleanup ran, so the temp
files and staging directories it was writing are swept away: only names nkibuild's
writers make, only those made since that session began; nothing else can be using
them, since the sweeping session holds the lock), and on the way out
stops every compiler, worker and Ray connection it started.

doit constructs its state backend itself; the backend finds the session of the
build that is running doit through `current_session()`, a context variable.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from nkibuild.errors import UsageError, storage_error
from nkibuild.fsutil import LEFTOVER_PATTERNS, atomic_write_text, leftovers

if TYPE_CHECKING:
    from nkibuild.cache.stats import CacheCounters
    from nkibuild.compiler.budget import KeyLocks, MemoryBudget
    from nkibuild.compiler.process import ProcessRegistry
    from nkibuild.frontends.failures import TraceFailures
    from nkibuild.toolchain import VersionMemo
    from nkibuild.toolchain.worker_pool import WorkerPool

T = TypeVar("T")

LOCK_FILE = "build.lock"
RUNNING_FILE = "running.json"

_CURRENT: contextvars.ContextVar[BuildSession] = contextvars.ContextVar("nkibuild_session")


@dataclass(frozen=True)
class SessionDirs:
    """A directory to lock (its `state/` holds the lock and the marker) and the
    directories whose leftovers an interrupted session there may have left."""

    locked: Path
    swept: tuple[Path, ...] = ()


class RayConnection:
    """The Ray connection a session opened (Ray itself allows one per process)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._opened = False

    def get(self, address: str | None) -> Any:
        try:
            import ray
        except ImportError:
            raise UsageError("--executor ray needs Ray: pip install 'nkibuild[ray]'") from None
        with self._guard:  # compile actions run in doit's threads
            if not ray.is_initialized():
                ray.init(
                    address=address,
                    ignore_reinit_error=True,
                    include_dashboard=False,
                    log_to_driver=False,
                )
                self._opened = True
        return ray

    def close(self) -> None:
        with self._guard:
            if self._opened:
                import ray

                ray.shutdown()
                self._opened = False


class BuildSession:
    """What one build owns; see the module docstring. Each part is made when first used:
    a build with nothing to do starts no worker pool and loads no compiler code."""

    def __init__(self) -> None:
        self.ray = RayConnection()
        # `neuronx-cc --version` queries by (command, compiler stamp): a release resolves
        # one toolchain per project and asks each compiler once.
        self.compiler_versions: VersionMemo = {}
        self.state_failures: list[OSError] = []  # doit state files that could not be saved
        self._parts: dict[str, Any] = {}
        self._guard = threading.Lock()  # doit's threads (-j N) ask for parts at once
        self._compile_memory: tuple[int | None, int] = (None, 1)
        self._scratch_root: Path | None = None

    def _part(self, name: str, make: Callable[[], T]) -> T:
        with self._guard:
            if name not in self._parts:
                self._parts[name] = make()
            return self._parts[name]

    @property
    def workers(self) -> WorkerPool:
        from nkibuild.toolchain.worker_pool import WorkerPool

        return self._part("workers", lambda: WorkerPool(self._scratch_root))

    @property
    def budget(self) -> MemoryBudget:
        from nkibuild.compiler.budget import MemoryBudget

        return self._part("budget", lambda: MemoryBudget(*self._compile_memory))

    @property
    def key_locks(self) -> KeyLocks:
        from nkibuild.compiler.budget import KeyLocks

        return self._part("key_locks", KeyLocks)

    @property
    def processes(self) -> ProcessRegistry:
        from nkibuild.compiler.process import ProcessRegistry

        return self._part("processes", ProcessRegistry)

    @property
    def cache_stats(self) -> CacheCounters:
        """Hits, misses, errors per cache tier."""
        from nkibuild.cache.stats import CacheCounters

        return self._part("cache_stats", CacheCounters)

    @property
    def trace_failures(self) -> TraceFailures:
        """Kernels' trace errors already shown."""
        from nkibuild.frontends.failures import TraceFailures

        return self._part("trace_failures", TraceFailures)

    @contextlib.contextmanager
    def running(
        self,
        dirs: Sequence[SessionDirs],
        *,
        max_compile_memory: int | None,
        jobs: int,
        lock_timeout: float = 0.0,
    ) -> Iterator[BuildSession]:
        with contextlib.ExitStack() as held:
            for entry in dirs:
                held.callback(acquire_build_lock(entry.locked, lock_timeout).release)
            for entry in dirs:
                _recover(entry)
            # A run's budget, workers and compiler processes are its own, made for it.
            self._compile_memory = (max_compile_memory, jobs)
            self._scratch_root = dirs[0].locked / "state"
            for name in ("budget", "workers", "processes"):
                self._parts.pop(name, None)
            try:
                yield self
            except BaseException:
                processes = self._parts.get("processes")
                if processes is not None:  # e.g. Ctrl-C: no compiler may outlive the build
                    processes.kill_all()
                self._stop_helpers()
                raise
            self._stop_helpers()
            for entry in dirs:  # a clean exit, even of a failed build: nothing to sweep
                (entry.locked / "state" / RUNNING_FILE).unlink(missing_ok=True)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """Make this the session `current_session()` returns in this thread."""
        token = _CURRENT.set(self)
        try:
            yield
        finally:
            _CURRENT.reset(token)

    def _stop_helpers(self) -> None:
        # Workers live for one build: the next may see changed user code.
        workers = self._parts.get("workers")
        if workers is not None:
            workers.close()
        self.ray.close()


def current_session() -> BuildSession | None:
    """The session running doit in this thread (for objects doit constructs itself)."""
    return _CURRENT.get(None)


class BuildLock:
    """A held build lock (`acquire_build_lock`)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def acquire_build_lock(build_dir: Path, timeout: float = 0.0) -> BuildLock:
    """The build dir's lock: doit neither locks its state file nor saves it before the
    end of a run, so two concurrent runs would both execute everything. An fcntl lock
    (`nkibuild.locks`): the kernel drops it when its holder dies, so none is ever stale,
    and two builds of one directory in one process exclude each other as two processes do."""
    from nkibuild.locks import lock_descriptor

    state_dir = build_dir / "state"
    path = state_dir / LOCK_FILE
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as error:
        refused = storage_error(error)  # a read-only or full disk: as any write that fails
        if refused is not None:
            raise refused from None
        # e.g. a symlink planted in its place
        raise UsageError(f"cannot lock the build dir: {path}: {error.strerror}") from None
    if not lock_descriptor(fd, timeout):
        os.close(fd)
        raise UsageError(
            f"another nkibuild build is running in {build_dir} "
            f"(lock {path}); wait for it or use another --build-dir"
        )
    return BuildLock(fd)


def _recover(entry: SessionDirs) -> None:
    """Sweep what a killed session left: only names nkibuild's writers make, only made
    after that session began (its marker's ctime), and in the swept (dist, out) dirs
    only at the top, where alone nkibuild writes; a user's files are never touched."""
    marker = entry.locked / "state" / RUNNING_FILE
    with contextlib.suppress(FileNotFoundError):
        began = marker.stat().st_ctime_ns
        remove_leftovers(entry.locked, since=began)
        for directory in entry.swept:
            remove_leftovers(directory, since=began, recursive=False)
    atomic_write_text(marker, f'{{"pid": {os.getpid()}}}\n', durable=False)


def remove_leftovers(directory: Path, *, since: int, recursive: bool = True) -> None:
    """Delete what an interrupted writer left under `directory`."""
    for path in leftovers(directory, LEFTOVER_PATTERNS, since=since, recursive=recursive):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
