"""The compile orchestrator: where a unit's NEFF comes from (see the package docstring)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from nkibuild.cache import CacheChain, CacheKey
from nkibuild.cache.trust import MAX_LOG_TAIL
from nkibuild.compiler.budget import KeyLocks, MemoryBudget
from nkibuild.compiler.checks import checked_neff, verified_result
from nkibuild.compiler.job import CompileJob, Produced, cache_key
from nkibuild.compiler.local import LocalExecutor
from nkibuild.compiler.neuronxcc import FailedCompile
from nkibuild.compiler.process import ProcessRegistry
from nkibuild.compiler.record import (
    KEY_FILE,
    LOG_FILE,
    NEFF_FILE,
    RESULT_FILE,
    CompiledNeff,
    is_finished,
    last_result,
    write_result,
)
from nkibuild.errors import BuildError
from nkibuild.frontends import HloArtifact
from nkibuild.fsutil import atomic_write_text, reported_at
from nkibuild.plan import BuildUnit
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.context import BuildContext


class Executor(Protocol):
    """Puts a NEFF for `job.unit` at `job.out_dir/model.neff`, or raises BuildError."""

    def produce(self, job: CompileJob, options: CompileOptions, notices: list[str]) -> Produced: ...


@dataclass(frozen=True)
class CompileOptions:
    """How compiles run (not what they produce): the session's budget, key locks and
    process registry, or fresh ones for a lone compile (e.g. on a Ray worker)."""

    cache: CacheChain | None = None
    timeout: float | None = None  # for units whose manifest sets none
    retries: int = 1  # of a compile that was OOM-killed or hit an internal error
    retry_failed: bool = False  # compile again a key whose failure a cache records
    executor: Executor = field(default_factory=LocalExecutor)
    budget: MemoryBudget = field(default_factory=MemoryBudget)
    key_locks: KeyLocks = field(default_factory=KeyLocks)
    processes: ProcessRegistry = field(default_factory=ProcessRegistry)


def run(context: BuildContext, unit: BuildUnit) -> CompiledNeff:
    """The compile stage of a build: the unit's extracted artifact -> its NEFF."""
    from nkibuild.cache import open_cache_chain
    from nkibuild.frontends import load_extracted

    layout = context.layout
    artifact = load_extracted(layout.extract_dir(unit.extract), unit.name)
    settings, session = context.settings, context.session
    cache = settings.cache
    executor: Executor = LocalExecutor()
    if settings.executor == "ray":
        from nkibuild.compiler.ray_executor import RayExecutor

        executor = RayExecutor(session.ray, cache, settings.ray_address)
    options = CompileOptions(
        cache=open_cache_chain(
            cache.local_dir, cache.remote_url, read_only=cache.read_only, stats=session.cache_stats
        ),
        timeout=settings.compile_timeout,
        retries=settings.compile_retries,
        retry_failed=settings.retry_failed,
        executor=executor,
        budget=session.budget,
        key_locks=session.key_locks,
        processes=session.processes,
    )
    return compile_unit(unit, artifact, context.toolchain, layout.compile_dir(unit), options)


def compile_unit(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    options: CompileOptions,
) -> CompiledNeff:
    key = cache_key(unit, artifact.content_hash, toolchain)
    previous = last_result(out_dir)
    if previous is not None and is_finished(previous, key.digest):
        return replace(previous, origin="build-dir")
    with reported_at(out_dir):  # a failed write (disk full) names the unit's directory
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / RESULT_FILE).unlink(missing_ok=True)
        key_json = json.dumps(key.to_json(), sort_keys=True)  # one line: the C encoder
        atomic_write_text(out_dir / KEY_FILE, key_json, durable=False)  # for `explain` only
        cache = options.cache
        notices: list[str] = []
        # Units with equal keys (the same kernel in two projects of a release) compile
        # once: the second waits here, then finds the first's NEFF in the cache.
        with options.key_locks.lock(key.digest):
            produced = _cache_hit(cache, key, unit, artifact, out_dir, notices)
            if produced is None:
                if cache is not None and not options.retry_failed:
                    _raise_known_failure(cache, key, unit.name)
                last_peak = previous.peak_memory if previous is not None else 0
                job = CompileJob(unit, artifact, toolchain, out_dir, key, last_peak)
                produced = _produce(job, options, notices)
            result = verified_result(unit, toolchain, out_dir, key.digest, produced)
            if produced.origin == "compiled" and cache is not None:
                meta = {
                    "unit": unit.name,
                    "compile_seconds": result.compile_seconds,
                    "peak_memory": result.peak_memory,
                    "compiler_version": result.compiler_version,
                }
                neff, log = out_dir / NEFF_FILE, out_dir / LOG_FILE
                cache.publish(key, neff, meta, log, result.sha256, vouched=True)
        result = replace(result, notices=(*notices, *(cache.notices if cache else ())))
        write_result(out_dir, result)
    return result


def _produce(job: CompileJob, options: CompileOptions, notices: list[str]) -> Produced:
    """The executor's NEFF. A compile that failed on its own is recorded in the caches
    under its key, so that the next build, here or on another machine, reports it at
    once instead of running an hour-long compile known to fail."""
    try:
        return options.executor.produce(job, options, notices)
    except FailedCompile as error:
        if options.cache is not None and error.returncode is not None:
            failure = {
                "returncode": error.returncode,
                "message": error.message[:MAX_LOG_TAIL],
                "log_tail": (error.log_tail or "")[-MAX_LOG_TAIL:],
            }
            meta = {"unit": job.unit.name, "compiler_version": job.toolchain.compiler_version}
            options.cache.publish(job.key.failure, None, {**meta, "failure": failure}, vouched=True)
        raise


def _raise_known_failure(cache: CacheChain, key: CacheKey, unit: str) -> None:
    """A failure a cache records for this very key, reported instead of compiling: a new
    compiler version, flag or HLO is another key, and is tried."""
    hit = cache.known_failure(key)
    if hit is None:
        return
    failure = hit.meta["failure"]
    raise BuildError(
        f"{failure['message']} (a known failure: this key, {key.digest[:16]}, failed to "
        f"compile before, as the cache at {hit.location} records; not compiled again. "
        "Pass --retry-failed to compile it anyway)",
        unit=unit,
        returncode=failure["returncode"],
        log_tail=failure["log_tail"] or None,
    )


def _cache_hit(
    cache: CacheChain | None,
    key: CacheKey,
    unit: BuildUnit,
    artifact: HloArtifact,
    out_dir: Path,
    notices: list[str],
) -> Produced | None:
    """A fetched NEFF, checked like a compiled one; a wrong one is dropped and compiled anew."""
    if cache is None:
        return None
    hit = cache.fetch(key, out_dir / NEFF_FILE)
    if hit is None:
        return None
    info, problem = checked_neff(unit, artifact, out_dir / NEFF_FILE)
    if info is not None and problem is None:
        return Produced.from_cache(f"cache-{hit.kind}", hit.meta, info)  # local or remote
    (out_dir / NEFF_FILE).unlink()
    cache.discard(key, hit.location)
    notices.append(f"the cache at {hit.location} held {problem}; discarded, compiling instead")
    return None
