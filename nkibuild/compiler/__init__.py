"""Compile stage: HloArtifact + BuildUnit -> CompiledNeff.

Order of lookup: this build dir (a rerun after a killed build), the shared
cache, then neuronx-cc. A NEFF is verified by the NEFF reader before it is
renamed into place; `result.json` is written last and marks completion.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.cache import CacheChain, CacheKey, file_sha256
from nkibuild.cache.chain import CacheHit
from nkibuild.compiler.budget import COMPILE_BUDGET, MemoryBudget
from nkibuild.compiler.process import ProcessOutcome, run_process
from nkibuild.errors import BuildError, tail
from nkibuild.frontends import HloArtifact
from nkibuild.fsutil import atomic_copy, atomic_write_text, reported_at
from nkibuild.manifest.model import TensorSpec
from nkibuild.plan import BuildUnit
from nkibuild.quantities import format_size
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.formats.neff import NeffTensor

NEFF_FILE = "model.neff"
LOG_FILE = "compile.log"
HLO_INPUT = "model.hlo_module.pb"
RESULT_FILE = "result.json"
KEY_FILE = "key.json"  # the cache key's inputs, for `nkibuild explain`
PEAK_FILE = "peak-memory.json"  # measured at the last compile, for scheduling the next
STDOUT_FILE = "stdout.log"
WORK_PREFIX = ".work-"
COMPILE_OUTPUTS = (NEFF_FILE, RESULT_FILE)


@dataclass(frozen=True)
class CompiledNeff:
    """A verified NEFF for one build unit and what the bundle needs to load it."""

    unit: str
    kernel: str
    variant: str
    target: str
    lnc: int
    neff_path: Path
    sha256: str
    cache_key: str
    compiler_version: str
    placeholder: bool
    inputs: tuple[TensorSpec, ...]  # the NEFF's own names, in parameter order
    outputs: tuple[TensorSpec, ...]
    origin: str  # "compiled", "cache" or "build-dir"
    compile_seconds: float
    peak_memory: int = 0  # bytes, of the compile that made the NEFF (0: unknown)
    compile_args: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()  # e.g. a corrupt cache entry that was discarded

    def to_json(self) -> dict[str, object]:
        data = dict(vars(self))
        data["neff_path"] = NEFF_FILE
        data["inputs"] = [t.to_json() for t in self.inputs]
        data["outputs"] = [t.to_json() for t in self.outputs]
        data["notices"] = list(self.notices)
        data["compile_args"] = list(self.compile_args)
        return data


def cache_key(unit: BuildUnit, hlo_hash: str, toolchain: Toolchain) -> CacheKey:
    """Everything that determines the NEFF: the normalized HLO (with its sidecars) and how
    it is compiled. Nothing about where or when enters."""
    return CacheKey.of(
        hlo=hlo_hash,
        compile_args=unit.compile_args(),
        compiler_version=toolchain.compiler_version,
        target=unit.target,
        lnc=unit.lnc,
        neuron_cc_flags=toolchain.neuron_cc_flags,
    )


@dataclass(frozen=True)
class CompileOptions:
    """How compiles run in this build (not what they produce)."""

    cache: CacheChain | None = None
    timeout: float | None = None  # for units whose manifest sets none
    budget: MemoryBudget = field(default_factory=lambda: COMPILE_BUDGET)


def compile_unit(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    options: CompileOptions,
) -> CompiledNeff:
    with reported_at(out_dir):  # a failed write (disk full) names the unit's directory
        return _compile_unit(unit, artifact, toolchain, out_dir, options)


def _compile_unit(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    options: CompileOptions,
) -> CompiledNeff:
    key = cache_key(unit, artifact.content_hash, toolchain)
    previous = finished_result(out_dir, key.digest)
    if previous is not None:
        return replace(previous, origin="build-dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULT_FILE).unlink(missing_ok=True)
    key_json = json.dumps(key.to_json(), indent=2, sort_keys=True)
    atomic_write_text(out_dir / KEY_FILE, key_json, durable=False)  # for `explain` only
    cache = options.cache
    notices: list[str] = []
    # Units with equal keys (the same kernel in two projects of a release) compile once:
    # the second waits here, then finds the first's NEFF in the cache.
    with key_lock(key.digest):
        hit = _cache_hit(cache, key, unit, artifact, out_dir, notices)
        if hit is not None:
            origin, seconds = "cache", float(hit.meta.get("compile_seconds", 0.0))
            peak = int(hit.meta.get("peak_memory", 0))
        else:
            timeout = unit.compile_timeout or options.timeout
            outcome = _compile(unit, artifact, toolchain, out_dir, timeout, options.budget, notices)
            origin, seconds, peak = "compiled", outcome.seconds, outcome.peak_memory
        result = _verified_result(unit, artifact, toolchain, out_dir, key.digest, origin, seconds)
        result = replace(result, peak_memory=peak, compile_args=tuple(unit.compile_args()))
        if origin == "compiled" and cache is not None:
            meta = {
                "unit": unit.name,
                "compile_seconds": round(seconds, 3),
                "peak_memory": peak,
                "compiler_version": result.compiler_version,
            }
            cache.publish(key, out_dir / NEFF_FILE, meta, out_dir / LOG_FILE)
    result = replace(result, notices=(*notices, *(cache.notices if cache else ())))
    atomic_write_text(out_dir / RESULT_FILE, json.dumps(result.to_json(), indent=2))
    return result


_KEY_LOCKS: dict[str, threading.RLock] = {}
_KEY_LOCKS_GUARD = threading.Lock()


def key_lock(digest: str) -> threading.RLock:
    """Held while a NEFF for `digest` is produced in this process (reentrant: a caller
    may hold it around compile_unit, which takes it too)."""
    with _KEY_LOCKS_GUARD:
        return _KEY_LOCKS.setdefault(digest, threading.RLock())


def _cache_hit(
    cache: CacheChain | None,
    key: CacheKey,
    unit: BuildUnit,
    artifact: HloArtifact,
    out_dir: Path,
    notices: list[str],
) -> CacheHit | None:
    """A fetched NEFF, checked like a compiled one; a wrong one is dropped and compiled anew."""
    if cache is None:
        return None
    hit = cache.fetch(key, out_dir / NEFF_FILE)
    if hit is None:
        return None
    problem = neff_problem(unit, artifact, out_dir / NEFF_FILE)
    if problem is None:
        return hit
    (out_dir / NEFF_FILE).unlink()
    cache.discard(key, hit.location)
    notices.append(f"the cache at {hit.location} held {problem}; discarded, compiling instead")
    return None


def load_result(out_dir: Path) -> CompiledNeff:
    data = json.loads((out_dir / RESULT_FILE).read_text())
    data["neff_path"] = out_dir / NEFF_FILE
    data["inputs"] = tuple(TensorSpec.from_json(t) for t in data["inputs"])
    data["outputs"] = tuple(TensorSpec.from_json(t) for t in data["outputs"])
    data["notices"] = tuple(data.get("notices", ()))
    data["compile_args"] = tuple(data.get("compile_args", ()))
    return CompiledNeff(**data)


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


def finished_result(out_dir: Path, digest: str) -> CompiledNeff | None:
    """The finished, intact NEFF in `out_dir` for the key `digest`, if there is one
    (e.g. from an earlier run whose doit state was lost when it was killed)."""
    try:
        result = load_result(out_dir)
        if result.cache_key == digest and file_sha256(result.neff_path) == result.sha256:
            return result
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _compile(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    timeout: float | None,
    budget: MemoryBudget,
    notices: list[str],
) -> ProcessOutcome:
    """Compile within the memory budget; a compile the OOM killer took is retried once alone."""
    estimate = memory_estimate(unit, out_dir)
    with budget.reserve(estimate):
        outcome = _run_compiler(unit, artifact, toolchain, out_dir, timeout)
    if outcome.killed:
        _record_peak(out_dir, outcome)
        killed_at = format_size(outcome.peak_memory)
        with budget.reserve(max(estimate or 0, outcome.peak_memory), alone=True):
            outcome = _run_compiler(unit, artifact, toolchain, out_dir, timeout, retry=True)
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


def _run_compiler(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    timeout: float | None,
    *,
    retry: bool = False,
) -> ProcessOutcome:
    """One neuronx-cc run; a verified NEFF lands in out_dir or a BuildError is raised.

    A compile killed by SIGKILL is returned, not raised, the first time: the
    caller retries it alone, since the OOM killer may have picked it for the
    memory of its neighbours.
    """
    _remove_stale_work_dirs(out_dir)
    # neuronx-cc has no work-dir flag: the cwd is its work dir, so each compile gets its own.
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=out_dir))
    try:
        output, log, hlo = work / NEFF_FILE, work / LOG_FILE, work / HLO_INPUT
        # The artifact may have been built elsewhere: point its references here first.
        hlo.write_bytes(artifact.compilable_hlo())
        command = compiler_command(unit, toolchain, hlo, output, log)
        try:
            outcome = run_process(command, work, work / STDOUT_FILE, timeout)
        except OSError as error:
            raise BuildError(
                f"could not start neuronx-cc: {error}", unit=unit.name, command=command
            ) from None
        _keep_log(work, out_dir)
        if outcome.killed and not retry:
            return outcome
        _check_outcome(unit, command, out_dir, outcome, timeout, retry)
        if not output.exists() or output.stat().st_size == 0:
            raise _failure(unit, command, out_dir, "neuronx-cc exited 0 but wrote no NEFF")
        _check_neff(unit, artifact, output, command, out_dir)
        os.replace(output, out_dir / NEFF_FILE)
        return outcome
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _check_outcome(
    unit: BuildUnit,
    command: list[str],
    out_dir: Path,
    outcome: ProcessOutcome,
    timeout: float | None,
    retry: bool,
) -> None:
    if outcome.timed_out:
        message = f"neuronx-cc did not finish within {timeout:g} s and was stopped"
    elif outcome.killed:
        message = (
            "neuronx-cc was killed (SIGKILL) twice, the second time running alone; "
            f"peak memory {format_size(outcome.peak_memory)}: most likely out of memory. "
            "Set compile-memory for this kernel or lower --max-compile-memory / -j"
        )
    elif outcome.returncode < 0:
        message = f"neuronx-cc was killed by {_signal_name(-outcome.returncode)}"
    elif outcome.returncode != 0:
        message = "neuronx-cc failed"
    else:
        return
    raise _failure(unit, command, out_dir, message, outcome.returncode)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _remove_stale_work_dirs(out_dir: Path) -> None:
    # Left by a killed build; the build lock guarantees no live compile uses them.
    for stale in out_dir.glob(WORK_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)


def _keep_log(work: Path, out_dir: Path) -> None:
    """The compiler's log file followed by what it printed, kept under the build dir."""
    log = work / LOG_FILE
    printed = (work / STDOUT_FILE).read_bytes() if (work / STDOUT_FILE).exists() else b""
    if printed:
        with open(log, "ab") as handle:
            handle.write(b"\n--- neuronx-cc stdout/stderr ---\n" + printed)
    if log.exists():
        atomic_copy(log, out_dir / LOG_FILE, durable=False)  # for people to read


def _failure(
    unit: BuildUnit,
    command: list[str],
    out_dir: Path,
    message: str,
    returncode: int | None = None,
) -> BuildError:
    log = out_dir / LOG_FILE
    text = log.read_text(errors="replace") if log.exists() else ""
    return BuildError(
        message,
        unit=unit.name,
        command=command,
        returncode=returncode,
        log_tail=tail(text) or "(the compiler wrote no log)",
        log_path=str(log) if log.exists() else None,
    )


def _check_neff(
    unit: BuildUnit, artifact: HloArtifact, neff: Path, command: list[str], out_dir: Path
) -> None:
    problem = neff_problem(unit, artifact, neff)
    if problem:
        raise _failure(unit, command, out_dir, f"neuronx-cc wrote {problem}")


def neff_problem(unit: BuildUnit, artifact: HloArtifact, neff: Path) -> str | None:
    """Why `neff` is not a valid NEFF for the unit (container, checksum, I/O, cores), or None."""
    from nkibuild.formats.neff import NeffFormatError, read_neff

    try:
        info = read_neff(neff)
    except NeffFormatError as error:
        return f"an invalid NEFF: {error}"
    problems = _signature_problems(artifact, _as_specs(info.inputs), _as_specs(info.outputs))
    if len(info.subgraphs) != unit.lnc:
        problems.append(f"it has {len(info.subgraphs)} subgraphs but the unit uses lnc={unit.lnc}")
    return "a NEFF that does not match the unit: " + "; ".join(problems) if problems else None


def _as_specs(tensors: tuple[NeffTensor, ...]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, tuple(t.shape), t.dtype) for t in tensors)


def _signature_problems(
    artifact: HloArtifact, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
) -> list[str]:
    """Compare by position, dtype and shape: NEFF names may differ from the manifest's."""
    problems = []
    pairs = (("inputs", artifact.inputs, inputs), ("outputs", artifact.outputs, outputs))
    for kind, expected, found in pairs:
        if [(t.dtype, t.shape) for t in found] != [(t.dtype, t.shape) for t in expected]:
            problems.append(
                f"{kind} are {', '.join(map(str, found)) or 'none'}; "
                f"expected {', '.join(map(str, expected)) or 'none'}"
            )
    return problems


def _verified_result(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    digest: str,
    origin: str,
    seconds: float,
) -> CompiledNeff:
    from nkibuild.formats.neff import read_neff

    neff = out_dir / NEFF_FILE
    info = read_neff(neff)
    return CompiledNeff(
        unit=unit.name,
        kernel=unit.kernel,
        variant=unit.variant,
        target=unit.target,
        lnc=unit.lnc,
        neff_path=neff,
        sha256=file_sha256(neff),
        cache_key=digest,
        compiler_version=info.compiler_version or toolchain.compiler_version,
        placeholder=info.placeholder,
        inputs=_as_specs(info.inputs),
        outputs=_as_specs(info.outputs),
        origin=origin,
        compile_seconds=round(seconds, 3),
    )
