"""Build options resolved once per invocation: command line > environment > manifest.

Like cibuildwheel's options, every source is read here and nowhere else; later
stages get final values in `BuildSettings`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from nkibuild.errors import UsageError
from nkibuild.manifest.model import Manifest
from nkibuild.quantities import parse_duration, parse_size

T = TypeVar("T")

ENV_TOOLCHAIN = "NKIBUILD_TOOLCHAIN"
ENV_COMPILER = "NKIBUILD_NEURONX_CC"
ENV_CACHE_DIR = "NKIBUILD_CACHE_DIR"
ENV_REMOTE_CACHE = "NKIBUILD_REMOTE_CACHE"
ENV_CACHE_READ_ONLY = "NKIBUILD_CACHE_READ_ONLY"
ENV_MAX_COMPILE_MEMORY = "NKIBUILD_MAX_COMPILE_MEMORY"
ENV_COMPILE_TIMEOUT = "NKIBUILD_COMPILE_TIMEOUT"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class BuildOptions:
    """What the caller asked for; None means "not given here, look further"."""

    toolchain: str | None = None
    compiler: Path | None = None
    use_cache: bool = True
    cache_dir: Path | None = None
    remote_cache: str | None = None
    cache_read_only: bool = False
    max_compile_memory: int | None = None  # bytes
    compile_timeout: float | None = None  # seconds, for units without their own
    executor: str = "local"  # "local" or "ray"
    ray_address: str | None = None  # None with executor ray: a local Ray instance


@dataclass(frozen=True)
class CacheConfig:
    local_dir: Path | None  # None: no local tier
    remote_url: str | None
    read_only: bool

    @property
    def enabled(self) -> bool:
        return self.local_dir is not None or self.remote_url is not None


NO_CACHE = CacheConfig(None, None, read_only=True)


@dataclass(frozen=True)
class BuildSettings:
    toolchain: str
    compiler: Path | None  # None: search PATH, the virtualenv and the Neuron SDK
    cache: CacheConfig
    max_compile_memory: int | None
    compile_timeout: float | None
    executor: str = "local"
    ray_address: str | None = None


def resolve_settings(
    options: BuildOptions, manifest: Manifest, environ: Mapping[str, str] = os.environ
) -> BuildSettings:
    settings = _resolve(options, manifest, environ)
    if settings.executor == "ray" and (not settings.cache.enabled or settings.cache.read_only):
        raise UsageError("--executor ray needs a writable NEFF cache: results travel through it")
    return settings


def _resolve(
    options: BuildOptions, manifest: Manifest, environ: Mapping[str, str]
) -> BuildSettings:
    return BuildSettings(
        toolchain=options.toolchain or environ.get(ENV_TOOLCHAIN) or "auto",
        compiler=_compiler(options, manifest, environ),
        cache=_cache(options, manifest, environ) if options.use_cache else NO_CACHE,
        max_compile_memory=_first(
            options.max_compile_memory, environ, ENV_MAX_COMPILE_MEMORY, parse_size
        ),
        compile_timeout=_first(
            options.compile_timeout, environ, ENV_COMPILE_TIMEOUT, parse_duration
        ),
        executor=options.executor,
        ray_address=options.ray_address,
    )


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    override = environ.get(ENV_CACHE_DIR)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("nkibuild"))


def _compiler(options: BuildOptions, manifest: Manifest, environ: Mapping[str, str]) -> Path | None:
    if options.compiler is not None:
        return options.compiler
    if environ.get(ENV_COMPILER):
        return Path(environ[ENV_COMPILER])
    return manifest.compiler_path


def _cache(options: BuildOptions, manifest: Manifest, environ: Mapping[str, str]) -> CacheConfig:
    read_only = (
        options.cache_read_only
        or environ.get(ENV_CACHE_READ_ONLY, "").strip().lower() in TRUE_WORDS
        or manifest.cache.read_only
    )
    remote = options.remote_cache or environ.get(ENV_REMOTE_CACHE) or manifest.cache.remote
    return CacheConfig(options.cache_dir or default_cache_dir(environ), remote, read_only)


def _first(
    given: T | None, environ: Mapping[str, str], variable: str, parse: Callable[[str], T]
) -> T | None:
    if given is not None:
        return given
    text = environ.get(variable)
    if not text:
        return None
    try:
        return parse(text)
    except ValueError as error:
        raise UsageError(f"{variable}: {error}") from None
