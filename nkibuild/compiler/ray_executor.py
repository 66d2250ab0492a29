"""Compile build units on a Ray cluster (`--executor ray [--ray-address ADDR]`).

Each compile becomes a Ray task that asks for the unit's memory hint as a Ray memory
resource, so the cluster's scheduler keeps large kernels apart. The task carries the
extracted artifact (HLO, metadata, sidecars) as bytes, compiles it on a worker with
the same compile stage as a local build, and publishes the NEFF to the caches. The
driver then takes the NEFF from the cache like any cache hit: results travel through
the shared cache, never through Ray's object store, and the driver only downloads
NEFFs. Workers need the same compiler (and, for a remote cluster, the same remote
cache URL) as the driver.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.compiler.checks import checked_neff
from nkibuild.compiler.job import CompileJob, Produced
from nkibuild.compiler.record import NEFF_FILE
from nkibuild.errors import BuildError
from nkibuild.plan import BuildUnit
from nkibuild.settings import CacheConfig
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.compiler import CompileOptions
    from nkibuild.session import RayConnection


@dataclass(frozen=True)
class RayExecutor:
    """Compiles on the cluster, then takes the NEFF from the cache the worker published to."""

    connection: RayConnection
    cache: CacheConfig
    address: str | None

    def produce(self, job: CompileJob, options: CompileOptions, notices: list[str]) -> Produced:
        unit, artifact, out_dir = job.unit, job.artifact, job.out_dir
        # A module a power loss tore is refused (and forgotten) here, where its extraction
        # lives, before a worker is sent a copy of it.
        artifact.compilable_hlo(unit.name)
        ray = self.connection.get(self.address)
        timeout = unit.compile_timeout or options.timeout
        # The artifact's files by relative path: all a worker needs to compile it.
        files = {
            path.relative_to(artifact.directory).as_posix(): path.read_bytes()
            for path in sorted(artifact.directory.rglob("*"))
            if path.is_file()
        }
        task = ray.remote(_compile_task).options(
            num_cpus=1, memory=unit.compile_memory or None, name=f"compile {unit.name}"
        )
        try:
            ray.get(task.remote(unit, files, job.toolchain, self.cache, timeout, options.retries))
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, BuildError):
                raise error.cause from None
            raise BuildError(f"the Ray task compiling {unit.name} failed: {error}") from None
        hit = options.cache.fetch(job.key, out_dir / NEFF_FILE) if options.cache else None
        if hit is None:
            raise BuildError(
                "the Ray worker compiled this unit but its NEFF is not in the cache "
                f"({self.cache.remote_url or self.cache.local_dir}); do the workers share it?",
                unit=unit.name,
            )
        info, problem = checked_neff(unit, artifact, out_dir / NEFF_FILE)
        if info is None or problem is not None:
            raise BuildError(f"the Ray worker's NEFF is {problem}", unit=unit.name)
        return Produced.from_cache("ray", hit.meta, info)


def _compile_task(
    unit: BuildUnit,
    files: dict[str, bytes],
    toolchain: Toolchain,
    cache: CacheConfig,
    timeout: float | None,
    retries: int,
) -> str:
    """Runs on a Ray worker."""
    from nkibuild.cache import open_cache_chain
    from nkibuild.compiler import CompileOptions, compile_unit
    from nkibuild.frontends import load_artifact

    with tempfile.TemporaryDirectory(prefix="nkibuild-ray-") as scratch:
        artifact_dir = Path(scratch) / "artifact"
        for relative, data in files.items():
            target = artifact_dir / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        chain = open_cache_chain(cache.local_dir, cache.remote_url, read_only=False)
        # The driver looked for a known failure first (unless --retry-failed): compile.
        options = CompileOptions(cache=chain, timeout=timeout, retries=retries, retry_failed=True)
        result = compile_unit(
            unit, load_artifact(artifact_dir), toolchain, Path(scratch) / "out", options
        )
        return result.origin
