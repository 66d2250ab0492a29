"""The local executor: neuronx-cc on this machine, within the session's memory budget;
a compile the OOM killer took is retried once, alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.compiler.neuronxcc import run_compiler
from nkibuild.compiler.process import ProcessOutcome
from nkibuild.compiler.record import PEAK_FILE
from nkibuild.frontends import HloArtifact
from nkibuild.fsutil import atomic_write_text
from nkibuild.plan import BuildUnit
from nkibuild.quantities import format_size
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.cache import CacheKey
    from nkibuild.compiler import CompileOptions, Produced


class LocalExecutor:
    """Runs the compiler in this process's session (the default executor)."""

    def produce(
        self,
        unit: BuildUnit,
        artifact: HloArtifact,
        toolchain: Toolchain,
        out_dir: Path,
        key: CacheKey,
        options: CompileOptions,
        notices: list[str],
    ) -> Produced:
        from nkibuild.compiler import Produced

        timeout = unit.compile_timeout or options.timeout
        outcome = _compile(unit, artifact, toolchain, out_dir, timeout, options, notices)
        return Produced("compiled", outcome.seconds, outcome.peak_memory)


def _compile(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    timeout: float | None,
    options: CompileOptions,
    notices: list[str],
) -> ProcessOutcome:
    """Compile within the memory budget; a compile the OOM killer took is retried once alone."""
    budget, processes = options.budget, options.processes
    estimate = memory_estimate(unit, out_dir)
    with budget.reserve(estimate):
        outcome = run_compiler(unit, artifact, toolchain, out_dir, timeout, processes)
    if outcome.killed:
        _record_peak(out_dir, outcome)
        killed_at = format_size(outcome.peak_memory)
        with budget.reserve(max(estimate or 0, outcome.peak_memory), alone=True):
            outcome = run_compiler(
                unit, artifact, toolchain, out_dir, timeout, processes, retry=True
            )
        notices.append(
            f"neuronx-cc was killed by SIGKILL at {killed_at} (out of memory?); it succeeded "
            "when retried alone. Set compile-memory for this kernel to schedule it safely"
        )
    _record_peak(out_dir, outcome)
    return outcome


def memory_estimate(unit: BuildUnit, out_dir: Path) -> int | None:
    """The larger of the manifest's hint and the peak measured at the unit's last compile."""
    known = [m for m in (unit.compile_memory, _last_peak(out_dir)) if m]
    return max(known) if known else None


def _last_peak(out_dir: Path) -> int | None:
    try:
        return int(json.loads((out_dir / PEAK_FILE).read_text())["peak_memory"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _record_peak(out_dir: Path, outcome: ProcessOutcome) -> None:
    record = {"peak_memory": outcome.peak_memory, "returncode": outcome.returncode}
    atomic_write_text(out_dir / PEAK_FILE, json.dumps(record), durable=False)  # a hint
