"""The build context: a project resolved once per invocation (manifest -> plan ->
settings -> toolchain), where its stages write, and the session that runs it.

Every stage takes a `BuildContext` (or plain data taken from it); `graph/` turns one
into doit task dicts. The plan of an unchanged manifest is cached in the build's
state dir, so a no-op build neither parses YAML nor runs the JSON Schema validator.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a build with nothing to do needs only the Layout (graph/snapshot.py)
    from nkibuild.manifest.model import Manifest
    from nkibuild.plan import BuildUnit, ExtractSpec
    from nkibuild.session import BuildSession
    from nkibuild.settings import BuildOptions, BuildSettings
    from nkibuild.toolchain import Toolchain


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

    # String forms for task dicts, whose paths doit compares as strings (made as strings:
    # a graph of 1,000 units asks for thousands).
    def extract_path(self, spec: ExtractSpec) -> str:
        return os.path.join(self.build_dir, "extract", spec.name)

    def compile_path(self, unit: BuildUnit) -> str:
        return os.path.join(self.build_dir, "compile", unit.name)

    def extract_dir(self, spec: ExtractSpec) -> Path:
        return Path(self.extract_path(spec))

    def compile_dir(self, unit: BuildUnit) -> Path:
        return Path(self.compile_path(unit))

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
    session: BuildSession = field(compare=False, repr=False)
    frontend_versions: dict[str, dict[str, str]] = field(default_factory=dict, compare=False)


def load_context(
    manifest_path: Path,
    build_dir: Path,
    dist_dir: Path,
    options: BuildOptions,
    session: BuildSession | None = None,
) -> BuildContext:
    """The project's context, in `session` (a new one unless a release shares its own)."""
    from nkibuild.plan import load_plan
    from nkibuild.session import BuildSession
    from nkibuild.settings import resolve_settings, value_before_manifest
    from nkibuild.toolchain import cancel_unanswered, resolve_toolchain, start_version_query
    from nkibuild.toolchain.nki import check_manifest

    session = session if session is not None else BuildSession()
    layout = Layout(build_dir.resolve(), dist_dir.resolve())
    versions = session.compiler_versions
    try:
        # The compiler answers `--version` while the manifest loads (on another core).
        # Only a guess (see `start_version_query`): the command line's, the environment's
        # or the last build's toolchain and compiler, else the defaults; the manifest can
        # set both.
        guess = [value_before_manifest(options, key) for key in ("toolchain", "compiler")]
        start_version_query(*guess, versions)
        manifest, units = load_plan(manifest_path, layout.state_dir)
        settings = resolve_settings(options, manifest)
        toolchain = resolve_toolchain(settings.toolchain, settings.compiler, versions)
        check_manifest(manifest, toolchain.nki)  # what the NKI in use refuses
    finally:  # a guess the manifest overrode, a manifest in error, or Ctrl-C
        cancel_unanswered(versions)
    return BuildContext(
        manifest=manifest,
        units=units,
        toolchain=toolchain,
        layout=layout,
        settings=settings,
        session=session,
    )
