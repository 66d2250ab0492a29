"""Resolve a manifest into build units: kernel × variant × target, every setting final;
and the plan cache, which spares an unchanged manifest its parsing and validation.

Light on purpose (`validate` of an unchanged manifest imports little more than this).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import TypeVar

from nkibuild import __version__, code_digest, errors, plaindata
from nkibuild.confine import MAX_PROJECT_FILE_BYTES, confined_stats, read_regular
from nkibuild.fsutil import atomic_write_bytes, stamp_ctime_ns, stamp_of
from nkibuild.manifest import model
from nkibuild.manifest.model import (
    CompileSettings,
    Constant,
    Kernel,
    Manifest,
    SourceRef,
    TensorSpec,
    Variant,
)

T = TypeVar("T")

# lnc "auto": trn1 has one physical core per logical core; trn2/trn3 default to 2.
AUTO_LNC = {"trn1": 1, "trn2": 2, "trn3": 2}


@dataclass(frozen=True)
class FrontendDefaults:
    """How a frontend's own compile path runs neuronx-cc; the manifest's lnc and
    compiler-args win over these."""

    lnc: int | None = None  # for lnc: auto; None: AUTO_LNC by target
    compiler_args: tuple[str, ...] = ()


# nkipy compiles its kernels with `--lnc 1 --internal-tensorizer-opt-level=2`
# (nkipy.runtime.compile's nkipy_compiler_args): its kernels are tuned for that.
FRONTEND_DEFAULTS = {
    "nkipy": FrontendDefaults(lnc=1, compiler_args=("--internal-tensorizer-opt-level=2",)),
}


@dataclass(frozen=True)
class ExtractSpec:
    """What one extraction needs: the kernel, one shape variant and (if it matters) a target."""

    kernel: str
    variant: str
    frontend: str
    source: SourceRef
    inputs: tuple[TensorSpec, ...]
    constants: tuple[tuple[str, Constant], ...]
    deps: tuple[str, ...]
    target: str | None  # None: the frontend's output does not depend on the target
    lnc: int | None = None  # the launch grid, for frontends whose trace depends on it (nki)

    @functools.cached_property  # asked for thousands of times per build (paths, tasks)
    def name(self) -> str:
        parts = [self.kernel, self.variant] + ([self.target] if self.target else [])
        return "/".join(parts)


@dataclass(frozen=True)
class BuildUnit:
    """One NEFF to build: fully resolved compile settings for kernel/variant/target."""

    extract: ExtractSpec
    target: str
    lnc: int
    optlevel: int
    auto_cast: str
    auto_cast_type: str
    fast_loading: bool
    compiler_args: tuple[str, ...]
    # How the compile runs, not what it produces: neither enters the cache key.
    compile_memory: int | None = None  # bytes, the manifest's hint
    compile_timeout: float | None = None  # seconds

    @property
    def kernel(self) -> str:
        return self.extract.kernel

    @property
    def variant(self) -> str:
        return self.extract.variant

    @functools.cached_property
    def name(self) -> str:
        return f"{self.kernel}/{self.variant}/{self.target}"

    def compile_args(self) -> list[str]:
        """neuronx-cc flags for this unit (input, output and log paths are added by the adapter)."""
        args = [
            "--target", self.target,
            "--lnc", str(self.lnc),
            "--optlevel", str(self.optlevel),
            "--auto-cast", self.auto_cast,
        ]  # fmt: skip
        if self.auto_cast != "none":
            args += ["--auto-cast-type", self.auto_cast_type]
        if self.fast_loading:
            args.append("--enable-fast-loading-neuron-binaries")
        return args + list(self.compiler_args)

    def to_json(self) -> dict[str, object]:
        spec = self.extract
        return {
            "name": self.name,
            "kernel": self.kernel,
            "variant": self.variant,
            "target": self.target,
            "frontend": spec.frontend,
            "source": str(spec.source),
            "inputs": [t.to_json() for t in spec.inputs],
            "constants": dict(spec.constants),
            "extract": spec.name,
            "lnc": self.lnc,
            "optlevel": self.optlevel,
            "auto_cast": self.auto_cast,
            "auto_cast_type": self.auto_cast_type,
            "fast_loading": self.fast_loading,
            "compiler_args": list(self.compiler_args),
            "compile_args": self.compile_args(),
            "compile_memory": self.compile_memory,
            "compile_timeout": self.compile_timeout,
        }


# Frontends whose HLO changes with the target (NKI lowers through a target override).
TARGET_DEPENDENT_FRONTENDS = frozenset({"nki"})


def resolve(manifest: Manifest) -> tuple[BuildUnit, ...]:
    """All build units of a manifest, in manifest order (kernel, variant, target)."""
    return tuple(unit for kernel in manifest.kernels for unit in _kernel_units(manifest, kernel))


def extract_specs(units: Iterable[BuildUnit]) -> tuple[ExtractSpec, ...]:
    """The distinct extractions the units need, first-seen order."""
    return tuple(dict.fromkeys(unit.extract for unit in units))


def _kernel_units(manifest: Manifest, kernel: Kernel) -> Iterable[BuildUnit]:
    targets = kernel.targets or manifest.default_targets
    # Later layers win wherever they set a value.
    layered = kernel.settings.over(manifest.defaults)
    overrides = dict(kernel.overrides)
    settings = {t: overrides.get(t, CompileSettings()).over(layered) for t in targets}
    # Units that share an extraction share its object: the plan cache pickles it once.
    extracts: dict[ExtractSpec, ExtractSpec] = {}
    for variant in kernel.variants:
        for target in targets:
            yield _unit(kernel, variant, target, settings[target], extracts)


def _unit(
    kernel: Kernel,
    variant: Variant,
    target: str,
    settings: CompileSettings,
    extracts: dict[ExtractSpec, ExtractSpec],
) -> BuildUnit:
    frontend = FRONTEND_DEFAULTS.get(kernel.frontend, FrontendDefaults())
    lnc = settings.lnc if settings.lnc is not None else frontend.lnc or AUTO_LNC[target]
    per_target = kernel.frontend in TARGET_DEPENDENT_FRONTENDS
    extract = ExtractSpec(
        kernel=kernel.name,
        variant=variant.name,
        frontend=kernel.frontend,
        source=kernel.source,
        inputs=variant.inputs,
        constants=kernel.constants,
        deps=kernel.deps,
        target=target if per_target else None,
        lnc=lnc if per_target else None,
    )
    return BuildUnit(
        extract=extracts.setdefault(extract, extract),
        target=target,
        lnc=lnc,
        optlevel=_required(settings.optlevel),
        auto_cast=_required(settings.auto_cast),
        auto_cast_type=_required(settings.auto_cast_type),
        fast_loading=bool(settings.fast_loading),
        compiler_args=_compiler_args(frontend.compiler_args, settings.compiler_args or ()),
        compile_memory=settings.compile_memory,
        compile_timeout=settings.compile_timeout,
    )


def _compiler_args(defaults: tuple[str, ...], given: tuple[str, ...]) -> tuple[str, ...]:
    """The frontend's default flags the manifest does not set itself, then the manifest's."""
    options = {arg.split("=", 1)[0] for arg in given if arg.startswith("-")}
    return (*(a for a in defaults if a.split("=", 1)[0] not in options), *given)


def _required(value: T | None) -> T:
    # The manifest loader fills every default; a None here is a loader bug, not user error.
    assert value is not None, "manifest defaults must be complete"
    return value


PLAN_CACHE_FILE = "plan.pickle"


def load_plan(manifest_path: Path, state_dir: Path) -> tuple[Manifest, tuple[BuildUnit, ...]]:
    """The validated manifest and its build units, from the plan cache when still valid.

    The cache is keyed by the manifest's bytes and location and by the code that
    resolves it, and used only while the files the manifest names pass the checks
    validation made: each is still a regular file in the project, and a Python file
    whose stat changed still defines the functions the manifest names from it
    (validation parses those files; an hlo source's content is the build's business,
    not validation's). It is a pickle, read allowing only the plan's own dataclasses
    and paths (a build dir restored from elsewhere names no code to run). A build dir
    that cannot be written is no error: the plan is then not cached.
    """
    from nkibuild.manifest import load_manifest

    path = manifest_path.resolve()
    key = _plan_key(path)
    cache_file = state_dir / PLAN_CACHE_FILE
    if key is not None:
        cached = _read_plan(cache_file, key)
        if cached is not None:
            return cached
    validating = time.time_ns()
    # Errors show the path as the user typed it.
    manifest = load_manifest(manifest_path)
    units = resolve(manifest)
    files = _named_files(manifest)
    stamps = _python_stamps(manifest, files, validating)
    if key is not None and stamps is not None:
        _write_plan(cache_file, (key, files, stamps, manifest, units))
    return manifest, units


def _plan_key(path: Path) -> str | None:
    try:
        digest = hashlib.sha256(read_regular(path, MAX_PROJECT_FILE_BYTES))  # no FIFO hang
    except OSError:
        return None  # let the manifest loader report it
    # A `~` in a setting (the compiler's path) is expanded against the home directory.
    digest.update(f"{path}\0{__version__}\0{code_digest()}\0{os.path.expanduser('~')}".encode())
    return digest.hexdigest()


# (path, its fsutil.stamp_of, functions it must define) per Python file validated.
Stamps = tuple[tuple[str, str, tuple[str, ...]], ...]


def _named_files(manifest: Manifest) -> tuple[str, ...]:
    """Every file validation checked (sources and references), relative, sorted."""
    refs = (ref for kernel in manifest.kernels for ref in (kernel.source, kernel.reference))
    return tuple(sorted({ref.path for ref in refs if ref}))


def _python_stamps(manifest: Manifest, files: tuple[str, ...], validating: int) -> Stamps | None:
    """The stamps of the Python files validation parsed, or None if a named file no
    longer passes the checks validation made (deleted, a directory, a symlink out).

    A file changed since `validating` began (time_ns, less a margin: file times come
    from a clock that lags by up to a tick) may have been saved after it was parsed: it
    gets no stat, so the next build parses it again rather than trust a plan validated
    on its earlier text."""
    from nkibuild.manifest.semantic import python_functions

    stats = _confined_stats(manifest.root, files)
    if stats is None:
        return None
    wanted = python_functions(manifest)
    recent = validating - 20_000_000
    return tuple(
        (
            name,
            stats[name] if stamp_ctime_ns(stats[name]) < recent else "",
            tuple(sorted(wanted[name])),
        )
        for name in files
        if name in wanted
    )


def _confined_stats(root: Path, files: tuple[str, ...]) -> dict[str, str] | None:
    stats = confined_stats([root / name for name in files], (root,))
    if stats is None:
        return None
    return {name: stamp_of(info) for name, info in zip(files, stats, strict=True)}


@functools.cache
def _cached_classes() -> frozenset[type]:
    """What a cached plan is made of: the manifest model's, the plan's and the errors'
    dataclasses (positions), and this platform's paths."""
    modules = (model, errors, sys.modules[__name__])
    found = {
        value
        for module in modules
        for value in vars(module).values()
        if isinstance(value, type) and is_dataclass(value) and value.__module__ == module.__name__
    }
    return frozenset({*found, type(Path())})


def _cached_shapes(files: object, stamps: object, manifest: object, units: object) -> bool:
    """The types `_read_plan` relies on (what `_write_plan` writes): a damaged or crafted
    cache is then a cache miss, not a traceback."""
    return (
        isinstance(manifest, Manifest)
        and isinstance(units, tuple)
        and all(isinstance(unit, BuildUnit) for unit in units)
        and isinstance(files, tuple)
        and all(isinstance(name, str) for name in files)
        and isinstance(stamps, tuple)
        and all(
            isinstance(stamp, tuple)
            and len(stamp) == 3
            and stamp[0] in files
            and isinstance(stamp[1], str)
            and isinstance(stamp[2], tuple)
            for stamp in stamps
        )
    )


def _read_plan(cache_file: Path, key: str) -> tuple[Manifest, tuple[BuildUnit, ...]] | None:
    try:
        data = cache_file.read_bytes()
        cached_key, files, stamps, manifest, units = plaindata.loads(data, _cached_classes())
    except (OSError, ValueError, TypeError):  # TypeError: not five values
        return None
    if cached_key != key or not _cached_shapes(files, stamps, manifest, units):
        return None
    current = _confined_stats(manifest.root, files)
    if current is None:
        return None
    changed = [(name, functions) for name, stat, functions in stamps if current[name] != stat]
    if changed:
        from nkibuild.manifest.pysource import defines_all

        # Touched, or edited elsewhere than the functions named: validates as it did.
        if not all(defines_all(manifest.root / name, wanted) for name, wanted in changed):
            return None
        stamps = tuple((name, current[name], functions) for name, _, functions in stamps)
        _write_plan(cache_file, (key, files, stamps, manifest, units))
    return manifest, units


def _write_plan(cache_file: Path, entry: tuple[object, ...]) -> None:
    with contextlib.suppress(OSError):
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        # A hint, not a result: a cache lost to a power cut is validated again.
        atomic_write_bytes(cache_file, plaindata.dumps(entry), durable=False)
