"""Long-lived frontend workers: one process per (project, interpreter, frontend, target, path).

Importing jax, torch or nki costs seconds; tracing a kernel costs milliseconds. So a
build keeps one worker per distinct environment and sends it every kernel that
needs it, one job at a time, over a line-based JSON protocol on its stdin/stdout.

A worker serves one project only: kernel files of two projects often share names
(`kernels/kernels.py`, `kernels/utils.py`), and a module imported for one project
must never answer for another. Workers live as long as the build session that owns
the pool.

User code runs only in these workers. Whatever it does (raise, `sys.exit`,
`os._exit`, crash, hang, print) fails only the job at hand: the job gets a
BuildError with the worker's output, and a dead or killed worker is replaced for
the next job.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from nkibuild.errors import BuildError, tail

WORKER_MODULE = "nkibuild.toolchain.worker"
# What a worker inherits from the build's environment; everything else is dropped so
# that a stray variable cannot change an extraction without entering its cache key.
PASSED_VARIABLES = ("PATH", "HOME", "USER", "LANG", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV")
PASSED_PREFIXES = ("LC_", "NEURON_", "NKI_", "XLA_", "JAX_", "PJRT_", "TORCH_", "NKIBUILD_FAKE_")


@dataclass(frozen=True)
class WorkerKey:
    project: str  # the project root: a worker never serves two projects
    python: str
    frontend: str
    target: str | None
    path: tuple[str, ...] = ()  # the toolchain's additions to the worker's PYTHONPATH

    def label(self) -> str:
        target = f", target {self.target}" if self.target else ""
        return f"{self.frontend} worker{target} for {self.project}"


PASS_ENV = "NKIBUILD_PASS_ENV"  # comma-separated names of more variables for the workers


def user_variables() -> dict[str, str | None]:
    """The variables the user passes to workers with NKIBUILD_PASS_ENV, and their values."""
    names = {name.strip() for name in os.environ.get(PASS_ENV, "").split(",") if name.strip()}
    return {name: os.environ.get(name) for name in sorted(names)}


def worker_environment(key: WorkerKey, cache_dir: Path) -> dict[str, str]:
    extra = user_variables()
    env = {
        name: value
        for name, value in os.environ.items()
        if name in PASSED_VARIABLES or name.startswith(PASSED_PREFIXES) or name in extra
    }
    # Keep JAX on the CPU and quiet: extraction only traces, it never runs kernels.
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    # The worker imports the project's kernel files: their bytecode must not land in the
    # project (`kernels/__pycache__/`), where nkibuild writes nothing outside build/ and dist/.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if "NEURON_CC_FLAGS" in env:
        from nkibuild.toolchain import without_cache_dir

        env["NEURON_CC_FLAGS"] = without_cache_dir(env["NEURON_CC_FLAGS"])[0]
    if key.path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*key.path, env.get("PYTHONPATH")]))
    # Temp files of the frontend (NKI's compiled kernels) stay in the worker's own
    # scratch dir: the only place outside the project an extraction may take files from.
    env["TMPDIR"] = str(cache_dir.parent / "tmp")
    if key.frontend == "nki":
        env["NEURON_EXTRACT_GRAPHS_ONLY"] = "1"
        env["NEURON_COMPILE_CACHE_URL"] = str(cache_dir)
        if key.target:
            env["NEURON_PLATFORM_TARGET_OVERRIDE"] = key.target
    return env


class Worker:
    """One worker process; `run` sends a job and waits for its answer."""

    def __init__(self, key: WorkerKey, scratch_root: Path | None = None) -> None:
        self.key = key
        if scratch_root is not None:
            scratch_root.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix=".worker-", dir=scratch_root))
        self.cache_dir = self.scratch / "neuron-cache"
        self.cache_dir.mkdir()
        (self.scratch / "tmp").mkdir()
        self.log_path = self.scratch / "worker.log"
        # Held open for the worker's life (it is the worker's stderr); closed in close().
        self._log: TextIO = open(  # noqa: SIM115
            self.log_path, "w+", encoding="utf-8", errors="replace"
        )
        self.command = [key.python, "-m", WORKER_MODULE, "--serve"]
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=worker_environment(key, self.cache_dir),
            cwd=self.scratch,
            start_new_session=True,  # so a timeout can kill the worker's children too
        )
        self._buffer = b""

    def run(self, job: dict[str, Any], *, timeout: float, unit: str) -> dict[str, Any]:
        log_start = self._log.tell()
        job = {**job, "cache_dir": str(self.cache_dir)}
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps(job).encode() + b"\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            raise self._died(unit, log_start) from None
        line = self._read_line(timeout, unit, log_start)
        result: dict[str, Any] = json.loads(line)
        result["log"] = self._output_since(log_start)
        result["scratch"] = str(self.scratch)  # where this worker's files may be
        return result

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """Stop the worker and its process group now. Between jobs it holds no work (each
        job's output is written before its answer), and an interpreter with jax or torch
        loaded takes a tenth of a second or more to tear itself down."""
        self._kill()
        self._log.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _read_line(self, timeout: float, unit: str, log_start: int) -> bytes:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not selector.select(remaining):
                    self._kill()
                    raise BuildError(
                        f"the {self.key.label()} did not finish within {timeout:g} s; killed it",
                        unit=unit,
                        command=self.command,
                        log_tail=tail(self._output_since(log_start)) or "(no output)",
                    )
                chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise self._died(unit, log_start)
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _died(self, unit: str, log_start: int) -> BuildError:
        returncode = self.process.wait()
        return BuildError(
            f"the {self.key.label()} died while running this kernel's code",
            unit=unit,
            command=self.command,
            returncode=returncode,
            log_tail=tail(self._output_since(log_start)) or "(no output)",
        )

    def _kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def _output_since(self, offset: int) -> str:
        try:
            self._log.flush()
            with open(self.log_path, encoding="utf-8", errors="replace") as handle:
                handle.seek(offset)
                return handle.read()
        except (OSError, ValueError):  # closed by an interrupted build meanwhile
            return ""


class WorkerPool:
    """Workers by key, created on first use and replaced when they die."""

    def __init__(self, scratch_root: Path | None = None) -> None:
        self._workers: dict[WorkerKey, Worker] = {}
        self._locks: dict[WorkerKey, threading.Lock] = {}
        self._guard = threading.Lock()
        # Where new workers keep their files (None: the system's temp dir). A build puts
        # them under its build dir, so what a killed build's workers leave is found and
        # removed by the next.
        self.scratch_root = scratch_root
        self._closed = False  # closed: the build is stopping; no new work starts

    def run(
        self, key: WorkerKey, job: dict[str, Any], *, timeout: float, unit: str
    ) -> dict[str, Any]:
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        # One job at a time per worker; other keys proceed in parallel (-j).
        with lock:
            worker = self._worker(key, unit)
            try:
                return worker.run(job, timeout=timeout, unit=unit)
            except BuildError:
                if not worker.alive():
                    worker.close()
                    del self._workers[key]
                raise

    def _worker(self, key: WorkerKey, unit: str) -> Worker:
        """The live worker for `key`, started if needed; none once the pool is closed (a
        doit thread still running after Ctrl-C must not start one nobody stops)."""
        with self._guard:
            if self._closed:
                raise BuildError("the build is stopping: this kernel was not traced", unit=unit)
            worker = self._workers.get(key)
            if worker is None or not worker.alive():
                if worker is not None:
                    worker.close()
                worker = self._workers[key] = Worker(key, self.scratch_root)
            return worker

    def close(self) -> None:
        with self._guard:
            self._closed = True
            workers, self._workers = list(self._workers.values()), {}
        for worker in workers:
            worker.close()
