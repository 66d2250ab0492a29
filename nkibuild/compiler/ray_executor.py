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

import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from nkibuild.errors import BuildError, UsageError
from nkibuild.frontends import HloArtifact
from nkibuild.plan import BuildUnit
from nkibuild.settings import CacheConfig
from nkibuild.toolchain import Toolchain

_INIT_LOCK = threading.Lock()


def compile_on_ray(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    cache: CacheConfig,
    timeout: float | None,
    address: str | None,
) -> str:
    """Compile `unit` on the cluster into the caches (writable: settings checked that);
    return how the worker got it."""
    ray = _ray(address)
    task = ray.remote(_compile_task).options(
        num_cpus=1, memory=unit.compile_memory or None, name=f"compile {unit.name}"
    )
    try:
        return str(ray.get(task.remote(unit, _pack(artifact), toolchain, cache, timeout)))
    except ray.exceptions.RayTaskError as error:
        cause = error.cause if isinstance(error.cause, BuildError) else None
        if cause is not None:
            raise cause from None
        raise BuildError(f"the Ray task compiling {unit.name} failed: {error}") from None


def shutdown() -> None:
    """End this process's Ray connection, if a build opened one."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def _ray(address: str | None) -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError("--executor ray needs Ray: pip install 'nkibuild[ray]'") from None
    with _INIT_LOCK:  # compile actions run in doit's threads
        if not ray.is_initialized():
            ray.init(
                address=address,
                ignore_reinit_error=True,
                include_dashboard=False,
                log_to_driver=False,
            )
    return ray


def _pack(artifact: HloArtifact) -> dict[str, bytes]:
    """The artifact's files by relative path: all a worker needs to compile it."""
    return {
        path.relative_to(artifact.directory).as_posix(): path.read_bytes()
        for path in sorted(artifact.directory.rglob("*"))
        if path.is_file()
    }


def _compile_task(
    unit: BuildUnit,
    files: dict[str, bytes],
    toolchain: Toolchain,
    cache: CacheConfig,
    timeout: float | None,
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
        options = CompileOptions(cache=chain, timeout=timeout)
        result = compile_unit(
            unit, load_artifact(artifact_dir), toolchain, Path(scratch) / "out", options
        )
        return result.origin
