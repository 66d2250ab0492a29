"""nkibuild as a PEP 517 build backend, so `pip wheel .` and `python -m build` build bundles.

A kernel project's pyproject.toml:

    [build-system]
    requires = ["nkibuild"]          # "nkibuild[jax]" for JAX kernels
    build-backend = "nkibuild.build"

`build_wheel` runs the same task graph as `nkibuild build` (incremental, cached) in
the project's `build/` and `dist/` and hands the bundle wheel to the frontend.
Config settings (`pip wheel . -C toolchain=fake`, `python -m build -C...`): `manifest`,
`build-dir` and `jobs`, and the build options of `nkibuild.settings.OPTIONS` (`toolchain`,
`compiler`, `cache-dir`, `remote-cache`, `cache-read-only`, `max-compile-memory`,
`compile-timeout`), which go through the same resolver as the command line's.

The project root is the current directory, as PEP 517 defines it (where pyproject.toml
is); every path, the manifest's included, is relative to it, as on the command line.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import sys
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild.errors import NkibuildError, UsageError
from nkibuild.text import printable

if TYPE_CHECKING:
    from nkibuild.bundle import BundleProject
    from nkibuild.context import BuildContext
    from nkibuild.manifest.model import Manifest
    from nkibuild.settings import BuildOptions

ConfigSettings = Mapping[str, str | list[str]] | None
# Where and how the backend builds; every other config setting is a build option
# (nkibuild.settings.OPTIONS).
PROJECT_SETTINGS = ("manifest", "build-dir", "jobs")
PYPROJECT = "pyproject.toml"
# Never in an sdist, even when a `deps` glob matches them: outputs and bytecode.
SKIPPED_PARTS = frozenset({"__pycache__"})


class BackendError(SystemExit):
    """nkibuild's rendered error, raised by a hook.

    A SystemExit whose code is the message: a frontend that runs the hook in a
    subprocess (pip, build, uv) shows the message without a traceback of nkibuild's
    internals and sees exit status 1; an in-process caller gets it as `str(error)`.
    """


@dataclass(frozen=True)
class Project:
    """The config settings, checked: where a hook reads and writes (all absolute) and how
    it builds. Every hook checks all of them, so a bad value fails `python -m build`
    at its first step, the sdist, not after it."""

    root: Path  # the frontend's current directory: pyproject.toml's
    manifest: Path
    build_dir: Path
    dist_dir: Path
    options: BuildOptions  # as the command line's: resolved with environment and manifest
    jobs: int = 1


def get_requires_for_build_wheel(config_settings: ConfigSettings = None) -> list[str]:
    # Frontends (jax, nki, ...) are the project's to list in build-system.requires.
    return []


def get_requires_for_build_sdist(config_settings: ConfigSettings = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: ConfigSettings = None) -> list[str]:
    return []


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: ConfigSettings = None
) -> str:
    """The wheel's `.dist-info` (its requirements depend on the compiled NEFFs' dtypes,
    so this builds; `build_wheel` then finds everything up to date)."""
    return _write_metadata(Path(metadata_directory), config_settings, editable=False)


def prepare_metadata_for_build_editable(
    metadata_directory: str, config_settings: ConfigSettings = None
) -> str:
    """The editable wheel's `.dist-info`, as `build_editable` writes it."""
    return _write_metadata(Path(metadata_directory), config_settings, editable=True)


def build_editable(
    wheel_directory: str,
    config_settings: ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    """PEP 660: build the bundle in the project's build dir and return an editable wheel
    that installs a `.pth` file pointing at it (build/bundle/<dist>/, a path every
    build keeps), so a later `nkibuild build` changes the installed package's NEFFs and
    loaders without a reinstall."""
    from nkibuild.bundle.wheel import build_editable_wheel

    with _reported():
        return build_editable_wheel(_built_bundle(config_settings), Path(wheel_directory)).name


def _built_bundle(config_settings: ConfigSettings) -> BundleProject:
    """Build the project in its build dir; its bundle (bundle.json read, not _build.json)."""
    from nkibuild.bundle import load_bundle

    context = _build(config_settings)
    return load_bundle(context.layout.bundle_dir(context.manifest), build_info=False)


def _write_metadata(
    metadata_directory: Path, config_settings: ConfigSettings, *, editable: bool
) -> str:
    """Build, then write the wheel's `.dist-info` files (RECORD aside, as PEP 517 allows)
    from the bundle, not by unpacking a copy of a wheel of many NEFFs; return the
    directory's name."""
    from nkibuild.bundle.wheel import dist_info_files

    with _reported():
        name, files = dist_info_files(_built_bundle(config_settings), editable=editable)
        for path, data in files.items():
            target = metadata_directory / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return name


def build_wheel(
    wheel_directory: str,
    config_settings: ConfigSettings = None,
    metadata_directory: str | None = None,
) -> str:
    """Build the project's bundle; return the wheel's file name (in `wheel_directory`).

    With `split-targets`, the per-target NEFF wheels are left in the project's dist
    directory: a PEP 517 build produces exactly one wheel, the main one.
    """
    from nkibuild.bundle.wheel import wheel_file_name
    from nkibuild.fsutil import atomic_copy

    with _reported():
        context = _build(config_settings)
        built = context.layout.dist_dir / wheel_file_name(context.manifest.package)
        atomic_copy(built, Path(wheel_directory) / built.name)
        return built.name


def build_sdist(sdist_directory: str, config_settings: ConfigSettings = None) -> str:
    """A reproducible source archive: the manifest, pyproject.toml, PKG-INFO and every
    file the manifest refers to (kernel sources, deps, references, prebuilt HLO)."""
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    from nkibuild.bundle.wheel import core_metadata, source_epoch
    from nkibuild.confine import read_confined
    from nkibuild.fsutil import atomic_output
    from nkibuild.manifest import load_manifest

    with _reported():
        project = project_of(config_settings)
        # Not load_plan: an sdist must not leave a build directory behind.
        manifest = load_manifest(_shown(project.manifest, project.root))
        check_pyproject(project, manifest)
        package = manifest.package
        # `<normalized_name>-<version>`, as PEP 625 spells sdist file names.
        base = f"{canonicalize_name(package.name).replace('-', '_')}-{Version(package.version)}"
        members = {
            f"{base}/{path}": read_confined(project.root / path, (project.root,))
            for path in sdist_files(project, manifest)
        }
        members[f"{base}/PKG-INFO"] = ("\n".join(core_metadata(package)) + "\n").encode()
        destination = Path(sdist_directory) / f"{base}.tar.gz"
        with atomic_output(destination) as tmp:
            tmp.write_bytes(_tar_gz(members, source_epoch()))
        return destination.name


@contextlib.contextmanager
def _reported() -> Iterator[None]:
    """nkibuild's own errors end the hook with their message, not a Python traceback;
    anything else is a bug and keeps its traceback."""
    try:
        yield
    except NkibuildError as error:
        raise BackendError(error.render()) from None


def project_of(config_settings: ConfigSettings) -> Project:
    from nkibuild.settings import config_settings as option_settings
    from nkibuild.settings import options_from_config

    known = PROJECT_SETTINGS + option_settings()
    unknown = sorted(set(config_settings or {}) - set(known))
    if unknown:
        # Like scikit-build-core's strict config: `-C toolchian=fake` must not quietly
        # build with the default toolchain.
        raise UsageError(
            f"unknown config setting(s) {', '.join(map(repr, unknown))}; "
            f"nkibuild.build knows {', '.join(known)}{_suggestions(unknown, known)}"
        )
    # A setting given twice arrives as a list; the last one wins, as on a command line.
    last = {
        name: (value[-1] if isinstance(value, list) else value) or ""
        for name, value in (config_settings or {}).items()
    }
    root = Path.cwd()
    return Project(
        root=root,
        manifest=root / (last.get("manifest") or "nkibuild.yaml"),
        build_dir=root / (last.get("build-dir") or "build"),
        dist_dir=root / "dist",  # as `nkibuild build`: the wheel is found there later too
        options=options_from_config(last),
        jobs=_jobs(last.get("jobs") or "1"),
    )


def _suggestions(unknown: list[str], known: tuple[str, ...]) -> str:
    """The message's "did you mean" ending: a known name for each unknown one close to it."""
    import difflib

    close = [
        f"{match[0]!r} for {name!r}"
        for name in unknown
        for match in [difflib.get_close_matches(name, known, n=1)]
        if match
    ]
    return f"; did you mean {', '.join(close)}?" if close else ""


def _jobs(text: str) -> int:
    try:
        return max(1, int(text))  # as -j: values below 1 mean 1
    except ValueError:
        raise UsageError(f"config setting jobs={text!r} is not a number") from None


def _shown(path: Path, root: Path) -> str:
    """`path` as error messages show it: relative to the project when inside it."""
    return os.path.relpath(path, root) if path.is_relative_to(root) else str(path)


def _build(config_settings: ConfigSettings) -> BuildContext:
    """Build the project as `nkibuild build` does; its context."""
    from nkibuild.cli.display import PlainDisplay
    from nkibuild.context import Layout, load_context
    from nkibuild.errors import BuildError
    from nkibuild.graph.run import RunOptions, run_build
    from nkibuild.plan import load_plan

    project = project_of(config_settings)
    # The [project] check comes before the toolchain is resolved: it is the likelier
    # mistake. load_plan caches the plan, so load_context below does not parse again.
    state_dir = Layout(project.build_dir, project.dist_dir).state_dir
    manifest, _ = load_plan(Path(_shown(project.manifest, project.root)), state_dir)
    check_pyproject(project, manifest)
    context = load_context(manifest.path, project.build_dir, project.dist_dir, project.options)
    # Plain lines on stderr: stdout belongs to the frontend, and no live display.
    summary = run_build(context, RunOptions(jobs=project.jobs), PlainDisplay(sys.stderr))
    if not summary.ok:
        details = [f"{f.name} failed:\n{f.detail}" for f in summary.failures]
        raise BuildError(
            "the bundle could not be built:\n" + "\n".join(details + summary.runtime_errors)
        )
    return context


def check_pyproject(project: Project, manifest: Manifest) -> None:
    """A [project] table, if present, must be one PEP 621 allows (a table; a valid,
    static `name`; `version` given or listed in `dynamic`, not both) and name the
    distribution and version the manifest builds."""
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    pyproject = project.root / PYPROJECT
    table = _read_toml(pyproject).get("project")
    if table is None:
        return
    name, version, dynamic = _project_fields(table, f"{pyproject}: [project]")
    package = manifest.package
    if canonicalize_name(name) != canonicalize_name(package.name):
        raise UsageError(
            f"{pyproject} names the project {name!r} but {manifest.path} builds "
            f"{package.name!r}; make them agree (or drop [project] from {PYPROJECT})"
        )
    if "version" not in dynamic and Version(version) != Version(package.version):
        raise UsageError(
            f"{pyproject} says version {version!r} but {manifest.path} says "
            f"{package.version!r}; make them agree"
        )


def _project_fields(table: Any, where: str) -> tuple[str, Any, list[str]]:
    """The [project] table's name, version and dynamic list, checked as PEP 621 says."""
    import re

    from packaging.version import InvalidVersion, Version

    from nkibuild.manifest.model import DISTRIBUTION_NAME_PATTERN

    if not isinstance(table, dict):
        raise UsageError(f"{where} is a {type(table).__name__}, not a table")
    name, version, dynamic = table.get("name"), table.get("version"), table.get("dynamic", [])
    problem = None
    if not isinstance(dynamic, list) or not all(isinstance(d, str) for d in dynamic):
        problem = "dynamic must be a list of field names"
    elif not isinstance(name, str) or not re.fullmatch(DISTRIBUTION_NAME_PATTERN, name):
        problem = f"name must be a valid distribution name (a string), not {name!r}"
    elif "name" in dynamic:
        problem = "name cannot be dynamic (PEP 621)"
    elif (version is None) == ("version" not in dynamic):
        problem = "give a version or list it in dynamic, one of the two (PEP 621)"
    elif version is not None:
        try:
            Version(version)
        except (TypeError, InvalidVersion):
            problem = f"version must be a PEP 440 version (a string), not {version!r}"
    if problem is not None:
        raise UsageError(f"{where}: {problem}")
    return name, version, dynamic


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: nkibuild depends on tomli there
        import tomli as tomllib  # type: ignore[no-redef]
    from nkibuild.confine import OutsideProject, read_confined

    if not os.path.lexists(path):
        return {}
    try:  # the project's own file: a symlink out of the project is not read
        return tomllib.loads(read_confined(path, (path.parent,)).decode("utf-8"))
    except OutsideProject as refused:
        raise UsageError(refused.render()) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise UsageError(f"{path}: {error}") from None


def sdist_files(project: Project, manifest: Manifest) -> list[str]:
    """Project-relative POSIX paths the sdist must carry to rebuild the bundle."""
    from nkibuild.bundle import shipped_files
    from nkibuild.graph.tasks import expand_deps

    referred = [kernel.source.path for kernel in manifest.kernels]
    referred += shipped_files(manifest)
    files = {_inside(project, manifest.root / path) for path in referred}
    files.add(_inside(project, manifest.path))
    if (project.root / PYPROJECT).exists():
        files.add(PYPROJECT)
    # The same glob expansion as the extract tasks' file_dep, minus outputs and bytecode.
    outputs = (project.build_dir, project.dist_dir)
    for kernel in manifest.kernels:
        for match in expand_deps(manifest.root, kernel.deps):
            path = Path(match)
            if not any(path.is_relative_to(out) for out in outputs):
                files.add(_inside(project, path))
    return sorted(path for path in files if SKIPPED_PARTS.isdisjoint(path.split("/")))


def _inside(project: Project, path: Path) -> str:
    """`path` relative to the project root; a file outside it (also through a
    symlink), or not a regular file, cannot be in the sdist."""
    from nkibuild.confine import file_problem

    normal = Path(os.path.normpath(path))
    problem = file_problem(normal, (project.root,))
    if problem is not None or not normal.is_relative_to(project.root):
        raise UsageError(
            f"{printable(str(normal))} {problem or 'is outside the project'}, so a source "
            "distribution cannot carry it; move it into the project or build wheels only"
        )
    return normal.relative_to(project.root).as_posix()


def _tar_gz(members: dict[str, bytes], epoch: int) -> bytes:
    """Fixed names, owners, modes and times, sorted: equal inputs give equal bytes."""
    buffer = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=epoch, filename="") as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for name in sorted(members):
            info = tarfile.TarInfo(name)  # uid, gid 0; no user or group names
            info.size, info.mtime, info.mode = len(members[name]), epoch, 0o644
            archive.addfile(info, io.BytesIO(members[name]))
    return buffer.getvalue()
