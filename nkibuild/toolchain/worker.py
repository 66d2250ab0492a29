"""Frontend worker: runs user kernel code in its own process and writes HLO protos.

Run as `python -m nkibuild.toolchain.worker --serve` by the worker pool: one JSON
job per stdin line, one JSON result per stdout line, so one process (one import
of jax/torch) serves many kernels. User code never runs inside the nkibuild process: a crash,
a hang or `sys.exit` here only fails this worker.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from nkibuild.toolchain.tracers import TRACERS, Job, project_imports
from nkibuild.toolchain.usertrace import user_traceback


def run_job(job: Job) -> dict[str, Any]:
    try:
        with project_imports(job["root"], job["path"]):
            proto, versions = TRACERS[job["frontend"]](job)
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt):
            raise
        shown = user_traceback(error, job["root"])
        return {
            "ok": False,
            "error": f"{type(error).__name__}: {error}",
            "traceback": shown.text,
            "where": shown.where,
        }
    try:
        Path(job["output"]).write_bytes(proto)
    except OSError as error:  # the machine's fault (disk full), not the kernel's
        return {"ok": False, "os_error": [error.errno, error.strerror, job["output"]]}
    return {"ok": True, "versions": versions}


def serve(results: TextIO) -> None:
    """Answer one JSON job per stdin line with one JSON result line on `results`.

    A worker serves one project: the first job's root (each job's project modules are
    dropped after it, but what a kernel leaves behind, e.g. in a library's registry,
    must never reach another project), so a job from elsewhere is refused."""
    project = None
    for line in sys.stdin:
        if line.strip():
            job = json.loads(line)
            project = project or job["root"]
            if job["root"] == project:
                result = run_job(job)
            else:
                error = f"this worker serves {project}, not {job['root']} (an nkibuild bug)"
                result = {"ok": False, "error": error, "traceback": ""}
            result["pid"] = os.getpid()
            results.write(json.dumps(result) + "\n")
            results.flush()


def stop_when_orphaned(interval: float = 0.2) -> None:
    """A build killed by SIGKILL cannot stop its workers, and a worker busy with a job
    would not see its closed stdin: once the parent is gone, end the worker's whole
    process group (it leads one) instead of finishing work no one waits for."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    if argv != ["--serve"]:
        print("usage: python -m nkibuild.toolchain.worker --serve", file=sys.stderr)
        return 2
    stop_when_orphaned()
    # The protocol keeps the real stdout; anything user code prints goes to stderr.
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
