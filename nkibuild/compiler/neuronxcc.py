"""The neuronx-cc adapter: one compiler run in its own work directory, its log kept,
its failure described with the command and the log's tail, its NEFF checked."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.compiler.checks import checked_neff
from nkibuild.compiler.process import ProcessOutcome, ProcessRegistry, run_process
from nkibuild.compiler.record import LOG_FILE, NEFF_FILE
from nkibuild.errors import BuildError, tail
from nkibuild.frontends import HloArtifact
from nkibuild.plan import BuildUnit
from nkibuild.quantities import format_size
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.formats.neff import NeffInfo

HLO_INPUT = "model.hlo_module.pb"
# neuronx-cc's exit status for internal errors; seen intermittently on large parallel
# cold compiles (aws-neuron-sdk#1369) as well as for deterministic internal errors.
INTERNAL_ERROR_EXIT = 70
# Free space below which a failed compile is blamed on the disk, not remembered as the
# kernel's (a compiler removes its temp files as it fails: some space comes back).
FULL_DISK_BYTES = 64 << 20
STDOUT_FILE = "stdout.log"
WORK_PREFIX = ".work-"


class FailedCompile(BuildError):
    """neuronx-cc failed on its own: it exited with a failure status, not killed by a
    signal (the OOM killer, nkibuild's timeout or Ctrl-C), so the same inputs fail the
    same way and the failure is worth recording under the key (see the orchestrator)."""


def compiler_command(
    unit: BuildUnit, toolchain: Toolchain, hlo: Path, output: Path, log: Path
) -> list[str]:
    """The exact neuronx-cc invocation; the user's compiler-args come last."""
    return [
        *toolchain.compiler_command,
        "compile", "--framework", "XLA", str(hlo),
        "--output", str(output),
        "--logfile", str(log),
        *unit.compile_args(),
    ]  # fmt: skip


def run_compiler(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    timeout: float | None,
    processes: ProcessRegistry,
    *,
    attempt: int = 1,
    last: bool = True,
) -> tuple[ProcessOutcome, NeffInfo | None]:
    """One neuronx-cc run and the verified NEFF it put in out_dir, or a BuildError.

    A compile killed by SIGKILL or ending with neuronx-cc's internal-error status is
    returned with no NEFF, not raised, unless this is the `last` try: the caller may retry
    it (alone after SIGKILL: the OOM killer may have picked it for its neighbours' memory).
    """
    _remove_stale_work_dirs(out_dir)
    # neuronx-cc has no work-dir flag: the cwd is its work dir, so each compile gets its own.
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=out_dir))
    try:
        output, hlo = work / NEFF_FILE, work / HLO_INPUT
        # The artifact may have been built elsewhere: point its references here first.
        hlo.write_bytes(artifact.compilable_hlo(unit.name))  # checked against its hash
        # Paths relative to the work dir (the compiler's cwd): a real NEFF records its
        # output path, which must not differ between checkouts and machines.
        command = compiler_command(
            unit, toolchain, Path(HLO_INPUT), Path(NEFF_FILE), Path(LOG_FILE)
        )
        try:
            outcome = run_process(
                command,
                work,
                work / STDOUT_FILE,
                timeout,
                processes,
                toolchain.compiler_environment(),
            )
        except OSError as error:
            raise BuildError(
                f"could not start neuronx-cc: {error}", unit=unit.name, command=command
            ) from None
        _keep_log(work, out_dir)
        if retryable(outcome) and not last:
            return outcome, None
        _check_outcome(unit, command, out_dir, outcome, timeout, attempt)
        if not output.exists() or output.stat().st_size == 0:
            raise failure(unit, command, out_dir, "neuronx-cc exited 0 but wrote no NEFF")
        info, problem = checked_neff(unit, artifact, output)
        if info is None or problem is not None:
            raise failure(unit, command, out_dir, f"neuronx-cc wrote {problem}")
        os.replace(output, out_dir / NEFF_FILE)
        return outcome, info
    finally:
        shutil.rmtree(work, ignore_errors=True)


def retryable(outcome: ProcessOutcome) -> bool:
    """A failure that may not happen again: an OOM kill, or an internal error."""
    return outcome.killed or (outcome.returncode == INTERNAL_ERROR_EXIT and not outcome.timed_out)


def _check_outcome(
    unit: BuildUnit,
    command: list[str],
    out_dir: Path,
    outcome: ProcessOutcome,
    timeout: float | None,
    attempt: int,
) -> None:
    tries = {1: "", 2: " twice"}.get(attempt, f" {attempt} times")
    if outcome.timed_out:
        message = f"neuronx-cc did not finish within {timeout:g} s and was stopped"
    elif outcome.killed:
        alone = ", the last time running alone" if attempt > 1 else ""
        message = (
            f"neuronx-cc was killed (SIGKILL){tries}{alone}; "
            f"peak memory {format_size(outcome.peak_memory)}: most likely out of memory. "
            "Set compile-memory for this kernel or lower --max-compile-memory / -j"
        )
    elif outcome.returncode < 0:
        message = f"neuronx-cc was killed by {_signal_name(-outcome.returncode)}"
    elif outcome.returncode != 0:  # after every retry it was given (see `retryable`)
        message = "neuronx-cc failed"
        if outcome.returncode == INTERNAL_ERROR_EXIT:
            message += f" with an internal error (exit {outcome.returncode}){tries}"
        if shutil.disk_usage(out_dir).free < FULL_DISK_BYTES:  # not the kernel's failure
            message += " while its disk was full (not recorded as a known failure)"
            raise failure(unit, command, out_dir, message, outcome.returncode)
        raise failure(unit, command, out_dir, message, outcome.returncode, FailedCompile)
    else:
        return
    raise failure(unit, command, out_dir, message, outcome.returncode)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _remove_stale_work_dirs(out_dir: Path) -> None:
    # Left by a killed build; the build lock guarantees no live compile uses them.
    # os.scandir, not Path.glob: once per compile, on the slot's path to its next start.
    with os.scandir(out_dir) as entries:
        stale = [entry.path for entry in entries if entry.name.startswith(WORK_PREFIX)]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)


def _keep_log(work: Path, out_dir: Path) -> None:
    """The compiler's log file followed by what it printed, kept under the build dir."""
    log = f"{work}/{LOG_FILE}"  # joined as strings: once per compile, between two compiles
    try:
        printed = Path(f"{work}/{STDOUT_FILE}").read_bytes()
    except FileNotFoundError:
        printed = b""
    if printed:
        with open(log, "ab") as handle:
            handle.write(b"\n--- neuronx-cc stdout/stderr ---\n" + printed)
    with contextlib.suppress(FileNotFoundError):  # no log and nothing printed: none to keep
        os.replace(log, f"{out_dir}/{LOG_FILE}")  # for people to read; the work dir goes


def failure(
    unit: BuildUnit,
    command: list[str],
    out_dir: Path,
    message: str,
    returncode: int | None = None,
    kind: type[BuildError] = BuildError,
) -> BuildError:
    log = out_dir / LOG_FILE
    text = log.read_text(errors="replace") if log.exists() else ""
    return kind(
        message,
        unit=unit.name,
        command=command,
        returncode=returncode,
        log_tail=tail(text) or "(the compiler wrote no log)",
        log_path=str(log) if log.exists() else None,
    )
