"""Build options resolved once per invocation: command line > environment > manifest >
what the build dir's last build used (`recorded`, for commands that read its state) > defaults.

Like cibuildwheel's and scikit-build-core's options, every source is read here and
nowhere else, and each option is declared once (`OPTIONS`): its `BuildOptions` field,
its PEP 517 config setting, its environment variable, how its text is parsed and
where the manifest sets it. The CLI, `nkibuild release` and the PEP 517 backend all
fill a `BuildOptions` (the backend through `options_from_config`) and get final
values from `resolve_settings`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nkibuild.errors import UsageError
from nkibuild.manifest.model import Manifest
from nkibuild.quantities import parse_duration, parse_retries, parse_size

ENV_TOOLCHAIN = "NKIBUILD_TOOLCHAIN"
ENV_COMPILER = "NKIBUILD_NEURONX_CC"
ENV_CACHE_DIR = "NKIBUILD_CACHE_DIR"
ENV_REMOTE_CACHE = "NKIBUILD_REMOTE_CACHE"
ENV_CACHE_READ_ONLY = "NKIBUILD_CACHE_READ_ONLY"
ENV_MAX_COMPILE_MEMORY = "NKIBUILD_MAX_COMPILE_MEMORY"
ENV_COMPILE_TIMEOUT = "NKIBUILD_COMPILE_TIMEOUT"
ENV_COMPILE_RETRIES = "NKIBUILD_COMPILE_RETRIES"
ENV_RETRY_FAILED = "NKIBUILD_RETRY_FAILED"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


@dataclass(frozen=True)
class BuildOptions:
    """What the caller asked for; None (False for a flag) means "not given here, look
    further"."""

    toolchain: str | None = None
    compiler: Path | None = None
    use_cache: bool = True
    cache_dir: Path | None = None
    remote_cache: str | None = None
    cache_read_only: bool = False  # a flag only switches on: False is "not given"
    max_compile_memory: int | None = None  # bytes
    compile_timeout: float | None = None  # seconds, for units without their own
    compile_retries: int | None = None  # of an OOM-killed or internal-error compile
    retry_failed: bool = False  # compile keys a cache records as failed (a flag: on only)
    executor: str = "local"  # "local" or "ray"
    ray_address: str | None = None  # None with executor ray: a local Ray instance
    # What the build dir's last build used, by field: below the manifest. Given by the
    # commands that read a build's state (explain, list, verify), never by a build.
    recorded: Mapping[str, Any] = field(default_factory=dict, hash=False)


def parse_flag(text: str) -> bool:
    """`1/true/yes/on` or `0/false/no/off` (any case; empty is false)."""
    word = text.strip().lower()
    if word not in TRUE_WORDS | FALSE_WORDS:
        raise ValueError("expected true or false")
    return word in TRUE_WORDS


@dataclass(frozen=True)
class Option:
    """One option and every place it can come from, in precedence order after the
    command line (which fills `BuildOptions` itself)."""

    field: str  # of BuildOptions
    setting: str  # PEP 517 config setting: `pip wheel . -C <setting>=<value>`
    env: str  # environment variable
    parse: Callable[[str], Any]  # the text of a config setting or variable -> value
    manifest: Callable[[Manifest], Any] | None = None  # the manifest's value, None: unset
    default: Any = None


OPTIONS: tuple[Option, ...] = (
    Option("toolchain", "toolchain", ENV_TOOLCHAIN, str, lambda m: m.toolchain, default="auto"),
    Option("compiler", "compiler", ENV_COMPILER, Path, lambda m: m.compiler_path),
    Option("cache_dir", "cache-dir", ENV_CACHE_DIR, Path),
    Option("remote_cache", "remote-cache", ENV_REMOTE_CACHE, str, lambda m: m.cache.remote),
    Option(
        "cache_read_only",
        "cache-read-only",
        ENV_CACHE_READ_ONLY,
        parse_flag,
        lambda m: m.cache.read_only,
        default=False,
    ),
    Option("max_compile_memory", "max-compile-memory", ENV_MAX_COMPILE_MEMORY, parse_size),
    Option("compile_timeout", "compile-timeout", ENV_COMPILE_TIMEOUT, parse_duration),
    Option("compile_retries", "compile-retries", ENV_COMPILE_RETRIES, parse_retries, default=1),
    Option("retry_failed", "retry-failed", ENV_RETRY_FAILED, parse_flag, default=False),
)
_BY_FIELD = {option.field: option for option in OPTIONS}


def config_settings() -> tuple[str, ...]:
    """The PEP 517 config settings that set build options."""
    return tuple(option.setting for option in OPTIONS)


def options_from_config(settings: Mapping[str, str]) -> BuildOptions:
    """The build options a PEP 517 frontend's config settings give (names already
    checked; values are text, as on a command line)."""
    values: dict[str, Any] = {}
    for option in OPTIONS:
        text = settings.get(option.setting)
        if text is None:
            continue
        try:
            values[option.field] = option.parse(text)
        except ValueError as error:
            raise UsageError(f"config setting {option.setting}={text!r}: {error}") from None
    # A config setting given as the empty string or `false` is "not given", as an
    # absent command-line option is: the environment and the manifest still count.
    return BuildOptions(**{k: v for k, v in values.items() if _given(v)})


def _given(value: object) -> bool:
    """Whether a value the caller passed counts: None, "" and a flag left off do not."""
    return value is not None and value is not False and value != ""


@dataclass(frozen=True)
class CacheConfig:
    local_dir: Path | None  # None: no local tier
    remote_url: str | None
    read_only: bool


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
    compile_retries: int = 1  # of a compile that was OOM-killed or hit an internal error
    retry_failed: bool = False  # compile again a key whose failure a cache records


def resolve_settings(
    options: BuildOptions, manifest: Manifest, environ: Mapping[str, str] = os.environ
) -> BuildSettings:
    """Every option's final value: the first source that gives it wins."""
    value = functools.partial(_value, options, manifest, environ)
    cache = (
        CacheConfig(
            value("cache_dir") or default_cache_dir(environ),
            value("remote_cache"),
            value("cache_read_only"),
        )
        if options.use_cache
        else NO_CACHE
    )
    settings = BuildSettings(
        toolchain=value("toolchain"),
        compiler=value("compiler"),
        cache=cache,
        max_compile_memory=value("max_compile_memory"),
        compile_timeout=value("compile_timeout"),
        compile_retries=value("compile_retries"),
        retry_failed=value("retry_failed"),
        executor=options.executor,
        ray_address=options.ray_address,
    )
    if settings.executor == "ray" and settings.cache.read_only:  # so is NO_CACHE
        raise UsageError("--executor ray needs a writable NEFF cache: results travel through it")
    return settings


def value_before_manifest(
    options: BuildOptions, name: str, environ: Mapping[str, str] = os.environ
) -> Any:
    """An option's value as `resolve_settings` gives it unless the manifest sets it:
    what can be known before the manifest is read (to start work early on a guess)."""
    return _value(options, None, environ, name)


def _value(
    options: BuildOptions, manifest: Manifest | None, environ: Mapping[str, str], name: str
) -> Any:
    """One option's value; `manifest` None: not read yet (see value_before_manifest)."""
    option = _BY_FIELD[name]
    given = getattr(options, name)
    if _given(given):
        return given
    text = environ.get(option.env)
    if text:  # an empty variable is unset, as in most tools
        try:
            return option.parse(text)
        except ValueError as error:
            raise UsageError(f"{option.env}: {error}") from None
    from_manifest = option.manifest(manifest) if option.manifest and manifest else None
    if from_manifest is not None:
        return from_manifest
    return options.recorded.get(name, option.default)


def default_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    override = environ.get(ENV_CACHE_DIR)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("nkibuild"))
