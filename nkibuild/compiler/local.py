"""The local executor: neuronx-cc on this machine, within the session's memory budget;
a compile the OOM killer took is retried once, alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.compiler.job import CompileJob, Produced
from nkibuild.compiler.neuronxcc import run_compiler
from nkibuild.compiler.process import ProcessOutcome
from nkibuild.compiler.record import PEAK_FILE
from nkibuild.fsutil import atomic_write_text
from nkibuild.plan import BuildUnit
from nkibuild.quantities import format_size

if TYPE_CHECKING:
    from nkibuild.compiler import CompileOptions


class LocalExecutor:
    """Runs the compiler in this process's session (the default executor)."""

    def produce(self, job: CompileJob, options: CompileOptions, notices: list[str]) -> Produced:
        """Compile within the memory budget. A compile the OOM killer took, or one that
        ended with neuronx-cc's internal-error status, is retried (`options.retries` times;
        after an OOM kill alone); deterministic failures never are."""
        unit, out_dir = job.unit, job.out_dir
        timeout = unit.compile_timeout or options.timeout
        estimate = memory_estimate(unit, out_dir, job.last_peak)
        if job.last_peak and job.last_peak > (_last_peak(out_dir) or 0):  # no second read
            # The result.json that held it is gone until this compile finishes: one that
            # does not (a failure, a kill, Ctrl-C) must not take the measured peak with it.
            _record_peak(out_dir, job.last_peak, None)
        alone = False
        for attempt in range(1, options.retries + 2):
            with options.budget.reserve(estimate, alone=alone):
                outcome, neff = run_compiler(
                    unit,
                    job.artifact,
                    job.toolchain,
                    out_dir,
                    timeout,
                    options.processes,
                    attempt=attempt,
                    last=attempt > options.retries,
                )
            if neff is not None:  # none only for a failure that may be retried
                # Its peak goes into result.json; an older attempt's would only mislead.
                (out_dir / PEAK_FILE).unlink(missing_ok=True)
                return Produced("compiled", outcome.seconds, outcome.peak_memory, neff)
            _record_peak(out_dir, outcome.peak_memory, outcome.returncode)
            notices.append(_retry_notice(outcome, attempt))
            if outcome.killed:
                estimate, alone = max(estimate or 0, outcome.peak_memory), True
        raise AssertionError("run_compiler raises on its last attempt")  # pragma: no cover


def _retry_notice(outcome: ProcessOutcome, attempt: int) -> str:
    if outcome.killed:
        return (
            f"neuronx-cc was killed by SIGKILL at {format_size(outcome.peak_memory)} "
            f"(out of memory?) on attempt {attempt}; it was retried alone. Set compile-memory "
            "for this kernel to schedule it safely"
        )
    return (
        f"neuronx-cc exited {outcome.returncode} (an internal error, sometimes transient) "
        f"on attempt {attempt}; it was retried. That attempt's log is in compile.log"
    )


def memory_estimate(unit: BuildUnit, out_dir: Path, last_peak: int = 0) -> int | None:
    """The largest of the manifest's hint, the peak of the unit's last finished compile
    (`last_peak`, from its result.json) and that of a later attempt that did not finish."""
    known = [m for m in (unit.compile_memory, last_peak, _last_peak(out_dir)) if m]
    return max(known) if known else None


def _last_peak(out_dir: Path) -> int | None:
    """The peak an unfinished attempt recorded; None for none, or for a record that holds
    no peak (damaged, or not a positive number of bytes)."""
    try:
        peak = int(json.loads((out_dir / PEAK_FILE).read_text())["peak_memory"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return peak if peak > 0 else None


def _record_peak(out_dir: Path, peak: int, returncode: int | None) -> None:
    record = {"peak_memory": peak, "returncode": returncode}
    atomic_write_text(out_dir / PEAK_FILE, json.dumps(record), durable=False)  # a hint
