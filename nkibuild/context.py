"""Resolve a project once per invocation: manifest -> plan -> toolchain -> BuildContext.

The plan of an unchanged manifest is cached in the build's state dir, so a
no-op build neither parses YAML nor runs the JSON Schema validator.
"""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

from nkibuild import __version__
from nkibuild.fsutil import atomic_write_bytes
from nkibuild.graph.tasks import BuildContext, Layout
from nkibuild.manifest.model import Manifest
from nkibuild.plan import BuildUnit, resolve
from nkibuild.settings import BuildOptions, resolve_settings

PLAN_CACHE_FILE = "plan.pickle"
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
    resolves it. It is a pickle: the build dir is written only by nkibuild and is
    trusted like the source tree beside it.
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
    if key is not None:
        state_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(cache_file, pickle.dumps((key, manifest, units)))
    return manifest, units


def load_context(
    manifest_path: Path,
    build_dir: Path,
    dist_dir: Path,
    options: BuildOptions,
) -> BuildContext:
    from nkibuild.toolchain import resolve_toolchain

    layout = Layout(build_dir.resolve(), dist_dir.resolve())
    manifest, units = load_plan(manifest_path, layout.state_dir)
    settings = resolve_settings(options, manifest)
    toolchain = resolve_toolchain(settings.toolchain, layout.state_dir, settings.compiler)
    return BuildContext(
        manifest=manifest, units=units, toolchain=toolchain, layout=layout, settings=settings
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


def _read_plan(cache_file: Path, key: str) -> tuple[Manifest, tuple[BuildUnit, ...]] | None:
    try:
        cached_key, manifest, units = pickle.loads(cache_file.read_bytes())
    except Exception:
        return None
    return (manifest, units) if cached_key == key else None
