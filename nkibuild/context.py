"""The build context: a project resolved once per invocation (manifest -> plan ->
settings -> toolchain), where its stages write, and the session that runs it.

Every stage takes a `BuildContext` (or plain data taken from it); `graph/` turns one
into doit task dicts. The plan of an unchanged manifest is cached in the build's
state dir, so a no-op build neither parses YAML nor runs the JSON Schema validator.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

from nkibuild import __version__
from nkibuild.fsutil import atomic_write_bytes
from nkibuild.manifest.model import Manifest
from nkibuild.plan import BuildUnit, ExtractSpec, resolve
from nkibuild.session import BuildSession
from nkibuild.settings import BuildOptions, BuildSettings, resolve_settings
from nkibuild.toolchain import Toolchain

PLAN_CACHE_FILE = "plan.pickle"


@dataclass(frozen=True)
class Layout:
    """Where every stage writes, under the build and dist directories (absolute paths)."""

    build_dir: Path
    dist_dir: Path

    def __post_init__(self) -> None:
        # doit matches file_dep to targets by exact string: one spelling per file.
        if not (self.build_dir.is_absolute() and self.dist_dir.is_absolute()):
            raise ValueError("Layout needs absolute directories")

    @property
    def state_dir(self) -> Path:
        return self.build_dir / "state"

    def extract_dir(self, spec: ExtractSpec) -> Path:
        return Path(self.extract_path(spec))

    def compile_dir(self, unit: BuildUnit) -> Path:
        return Path(self.compile_path(unit))

    # String forms for task dicts: a no-op build creates thousands of these, and
    # os.path string joins cost a fraction of pathlib's.
    def extract_path(self, spec: ExtractSpec) -> str:
        return os.path.join(self.build_dir, "extract", spec.name)

    def compile_path(self, unit: BuildUnit) -> str:
        return os.path.join(self.build_dir, "compile", unit.name)

    def bundle_dir(self, manifest: Manifest) -> Path:
        return self.build_dir / "bundle" / manifest.package.name


@dataclass(frozen=True)
class BuildContext:
    """Everything a build's stages need, resolved once per invocation."""

    manifest: Manifest
    units: tuple[BuildUnit, ...]
    toolchain: Toolchain
    layout: Layout
    settings: BuildSettings
    # Owns the workers, budget, locks and processes; shared only by the projects of
    # one release (one budget for one machine, equal cache keys compiled once).
    session: BuildSession = field(default_factory=BuildSession, compare=False, repr=False)
    frontend_versions: dict[str, dict[str, str]] = field(default_factory=dict, compare=False)


# The code a cached plan depends on: the resolver, the manifest package (the model,
# the schema generated from it, the converter, the checks) and the modules the model
# takes its dtype names and size/duration syntax from.
_PLAN_CODE = (
    Path(__file__).parent / "plan.py",
    *sorted((Path(__file__).parent / "manifest").glob("*.py")),
    Path(__file__).parent / "dtypes.py",
    Path(__file__).parent / "quantities.py",
)


def load_plan(manifest_path: Path, state_dir: Path) -> tuple[Manifest, tuple[BuildUnit, ...]]:
    """The validated manifest and its build units, from the plan cache when still valid.

    The cache is keyed by the manifest's bytes and location and by the code that
    resolves it, and used only while the files the manifest names pass the checks
    validation made and are unchanged (validation looks into them: the function a
    source names must be defined there). It is a pickle: the build dir is written only
    by nkibuild and is trusted like the source tree beside it. A build dir that cannot
    be written is no error: the plan is then not cached.
    """
    from nkibuild.manifest import load_manifest

    path = manifest_path.resolve()
    key = _plan_key(path)
    cache_file = state_dir / PLAN_CACHE_FILE
    if key is not None:
        cached = _read_plan(cache_file, key)
        if cached is not None:
            return cached
    manifest = load_manifest(manifest_path)  # errors show the path as the user typed it
    units = resolve(manifest)
    stamps = _source_stamps(manifest)
    if key is not None and stamps is not None:
        with contextlib.suppress(OSError):
            state_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(cache_file, pickle.dumps((key, stamps, manifest, units)))
    return manifest, units


def load_context(
    manifest_path: Path,
    build_dir: Path,
    dist_dir: Path,
    options: BuildOptions,
    session: BuildSession | None = None,
) -> BuildContext:
    """The project's context, in `session` (a new one unless a release shares its own)."""
    from nkibuild.toolchain import resolve_toolchain

    session = session if session is not None else BuildSession()
    layout = Layout(build_dir.resolve(), dist_dir.resolve())
    manifest, units = load_plan(manifest_path, layout.state_dir)
    settings = resolve_settings(options, manifest)
    toolchain = resolve_toolchain(
        settings.toolchain, layout.state_dir, settings.compiler, session.compiler_versions
    )
    return BuildContext(
        manifest=manifest,
        units=units,
        toolchain=toolchain,
        layout=layout,
        settings=settings,
        session=session,
    )


def _plan_key(path: Path) -> str | None:
    try:
        digest = hashlib.sha256(path.read_bytes())
    except OSError:
        return None  # let the manifest loader report it
    digest.update(f"{path}\0{__version__}".encode())
    for code in _PLAN_CODE:
        info = code.stat()
        digest.update(f"{code}\0{info.st_mtime_ns}\0{info.st_size}".encode())
    return digest.hexdigest()


Stamps = tuple[tuple[str, int, int], ...]


def _source_stamps(manifest: Manifest) -> Stamps | None:
    """(path, mtime, size) of every file validation read (sources and references), or
    None if one no longer passes the checks validation made: a file can be deleted,
    edited, become a directory or a symlink out of the project while the manifest does
    not change. The manifest is then validated again and says where."""
    from nkibuild.confine import file_problem

    root = manifest.root
    refs = {
        ref.path for kernel in manifest.kernels for ref in (kernel.source, kernel.reference) if ref
    }
    stamps = []
    for relative in sorted(refs):
        if file_problem(root / relative, (root,)) is not None:
            return None
        try:
            info = (root / relative).stat()
        except OSError:
            return None
        stamps.append((relative, info.st_mtime_ns, info.st_size))
    return tuple(stamps)


def _read_plan(cache_file: Path, key: str) -> tuple[Manifest, tuple[BuildUnit, ...]] | None:
    try:
        cached_key, stamps, manifest, units = pickle.loads(cache_file.read_bytes())
    except Exception:
        return None
    if cached_key != key or _source_stamps(manifest) != stamps:
        return None
    return manifest, units
