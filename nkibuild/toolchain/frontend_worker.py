"""Run frontend jobs in a worker subprocess and turn its failures into BuildErrors."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nkibuild.errors import BuildError

WORKER_MODULE = "nkibuild.toolchain.worker"
LOG_TAIL_LINES = 30


def run_worker(
    python: str, jobs: Sequence[dict[str, Any]], *, timeout: float, unit: str
) -> list[dict[str, Any]]:
    """Run jobs in one fresh interpreter; returns one result dict per job."""
    with tempfile.TemporaryDirectory(prefix="nkibuild-worker-") as scratch:
        request, result = Path(scratch, "request.json"), Path(scratch, "result.json")
        request.write_text(json.dumps({"jobs": list(jobs)}))
        command = [python, "-m", WORKER_MODULE, str(request), str(result)]
        try:
            proc = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout,
                env=_worker_env(),
                cwd=scratch,
                check=False,
            )
        except subprocess.TimeoutExpired as expired:
            raise BuildError(
                f"frontend worker did not finish within {timeout:g} s",
                unit=unit,
                command=command,
                log_tail=tail(_text(expired.stderr)),
            ) from None
        if proc.returncode != 0 or not result.exists():
            raise BuildError(
                "frontend worker failed",
                unit=unit,
                command=command,
                returncode=proc.returncode,
                log_tail=tail(proc.stderr + proc.stdout),
            )
        return json.loads(result.read_text())["results"]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # Keep JAX on the CPU and quiet: extraction only traces, it never runs kernels.
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def _text(data: bytes | str | None) -> str:
    if isinstance(data, bytes):
        return data.decode(errors="replace")
    return data or ""


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])
