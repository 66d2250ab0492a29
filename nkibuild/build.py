"""nkibuild as a PEP 517 build backend, so `pip wheel .` and `python -m build` build bundles.

A kernel project's pyproject.toml:

    [build-system]
    requires = ["nkibuild"]          # "nkibuild[jax]" for JAX kernels
    build-backend = "nkibuild.build"

`build_wheel` runs the same task graph as `nkibuild build` (incremental, cached) in
the project's `build/` and `dist/` and hands the bundle wheel to the frontend.
Config settings (`pip wheel . -C toolchain=fake`, `python -m build -C...`): `toolchain`,
`manifest`, `build-dir`, `jobs`, `remote-cache`, `cache-read-only`.
"""

from __future__ import annotations

import gzip
import io
import sys
import tarfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from nkibuild.errors import NkibuildError

ConfigSettings = Mapping[str, str | list[str]] | None
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


def get_requires_for_build_wheel(config_settings: ConfigSettings = None) -> list[str]:
    # Frontends (jax, nki, ...) are the project's to list in build-system.requires.
    return []


def get_requires_for_build_sdist(config_settings: ConfigSettings = None) -> list[str]:
    return []


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
        context = _context(config_settings)
        _run(context, _setting(config_settings, "jobs", "1"))
        built = context.layout.dist_dir / wheel_file_name(context.manifest.package)
        atomic_copy(built, Path(wheel_directory) / built.name)
        return built.name


def build_sdist(sdist_directory: str, config_settings: ConfigSettings = None) -> str:
    """A reproducible source archive: the manifest, pyproject.toml, PKG-INFO and every
    file the manifest refers to (kernel sources, deps, references, prebuilt HLO)."""
    from nkibuild.fsutil import atomic_output

    with _reported():
        manifest = _manifest(config_settings)
        base = sdist_base_name(manifest.package)
        destination = Path(sdist_directory) / f"{base}.tar.gz"
        with atomic_output(destination) as tmp:
            tmp.write_bytes(_sdist_bytes(manifest, base))
        return destination.name


def sdist_base_name(package: Any) -> str:
    """`<normalized_name>-<version>`, as PEP 625 spells sdist file names."""
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    return f"{canonicalize_name(package.name).replace('-', '_')}-{Version(package.version)}"


def _reported() -> Any:
    """nkibuild's own errors end the hook with their message, not a Python traceback."""
    import contextlib

    @contextlib.contextmanager
    def report() -> Iterator[None]:
        try:
            yield
        except NkibuildError as error:
            print(error.render(), file=sys.stderr)
            raise SystemExit(error.exit_code or 1) from None

    return report()


def _setting(config_settings: ConfigSettings, name: str, default: str | None = None) -> str | None:
    value = (config_settings or {}).get(name, default)
    return value[-1] if isinstance(value, list) else value


def _manifest_path(config_settings: ConfigSettings) -> Path:
    return Path(_setting(config_settings, "manifest", "nkibuild.yaml") or "nkibuild.yaml")


def _manifest(config_settings: ConfigSettings) -> Any:
    from nkibuild.manifest import load_manifest

    manifest = load_manifest(_manifest_path(config_settings))
    _check_pyproject(manifest)
    return manifest


def _context(config_settings: ConfigSettings) -> Any:
    from nkibuild.project import load_context
    from nkibuild.settings import BuildOptions

    manifest = _manifest(config_settings)
    read_only = (_setting(config_settings, "cache-read-only") or "").lower() in TRUE_WORDS
    options = BuildOptions(
        toolchain=_setting(config_settings, "toolchain"),
        remote_cache=_setting(config_settings, "remote-cache"),
        cache_read_only=read_only,
    )
    build_dir = Path(_setting(config_settings, "build-dir", "build") or "build")
    return load_context(manifest.path, build_dir, manifest.root / "dist", options)


def _run(context: Any, jobs: str | None) -> None:
    from nkibuild.cli.display import PlainDisplay
    from nkibuild.errors import BuildError, UsageError
    from nkibuild.graph.run import RunOptions, run_build

    try:
        options = RunOptions(jobs=max(1, int(jobs or "1")))
    except ValueError:
        raise UsageError(f"config setting jobs={jobs!r} is not a number") from None
    summary = run_build(context, options, PlainDisplay(sys.stderr))  # stdout is the frontend's
    if not summary.ok:
        details = [f"{f.name} failed:\n{f.detail}" for f in summary.failures]
        raise BuildError(
            "the bundle could not be built:\n" + "\n".join(details + summary.runtime_errors)
        )


def _check_pyproject(manifest: Any) -> None:
    """A [project] table, if present, must name the distribution the manifest builds."""
    from packaging.utils import canonicalize_name
    from packaging.version import InvalidVersion, Version

    from nkibuild.errors import UsageError

    pyproject = manifest.root / "pyproject.toml"
    project = _read_toml(pyproject).get("project", {})
    package = manifest.package
    name, version = project.get("name"), project.get("version")
    if name is not None and canonicalize_name(name) != canonicalize_name(package.name):
        raise UsageError(
            f"{pyproject} names the project {name!r} but {manifest.path} builds "
            f"{package.name!r}; make them agree (or drop [project] from pyproject.toml)"
        )
    try:
        mismatch = version is not None and Version(version) != Version(package.version)
    except InvalidVersion:
        mismatch = True
    if mismatch:
        raise UsageError(
            f"{pyproject} says version {version!r} but {manifest.path} says "
            f"{package.version!r}; make them agree"
        )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        return {}


def _sdist_files(manifest: Any) -> list[str]:
    """Project-relative paths the sdist must carry to rebuild the bundle."""
    from nkibuild.bundle import shipped_files

    root = manifest.root
    files = {"nkibuild.yaml"} if manifest.path.name == "nkibuild.yaml" else {manifest.path.name}
    if (root / "pyproject.toml").exists():
        files.add("pyproject.toml")
    files.update(kernel.source.path for kernel in manifest.kernels)
    files.update(shipped_files(manifest))
    for kernel in manifest.kernels:
        for pattern in kernel.deps:
            files.update(
                path.relative_to(root).as_posix() for path in root.glob(pattern) if path.is_file()
            )
    return sorted(files)


def _sdist_bytes(manifest: Any, base: str) -> bytes:
    from nkibuild.bundle.wheel import core_metadata, source_epoch

    epoch = source_epoch()
    members = {
        f"{base}/{path}": (manifest.root / path).read_bytes() for path in _sdist_files(manifest)
    }
    members[f"{base}/PKG-INFO"] = ("\n".join(core_metadata(manifest.package)) + "\n").encode()
    buffer = io.BytesIO()
    # Fixed names, owners, modes and times, sorted: equal inputs give equal bytes.
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=epoch, filename="") as compressed,
        tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as archive,
    ):
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(members[name]), epoch, 0o644
            archive.addfile(info, io.BytesIO(members[name]))
    return buffer.getvalue()
