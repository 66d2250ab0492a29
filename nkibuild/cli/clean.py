"""`nkibuild clean`: remove what nkibuild wrote, and nothing else.

A build dir is removed only if it is nkibuild's: not a symbolic link (nothing is
removed through one), marked by nkibuild's state dir (every command that uses a build
dir writes its lock or plan cache there), and holding neither the manifest nor a file
the manifest builds from (a `--build-dir` pointing at the sources). From a dist dir,
`--all` removes only the wheels the project's build writes there (its distributions at
the manifest's version); a shared wheelhouse keeps every other file, and the dir goes
only if that leaves it empty.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nkibuild.bundle import distributions
from nkibuild.bundle.provenance import material_files
from nkibuild.bundle.wheel import wheel_file_name
from nkibuild.errors import ManifestError, UsageError
from nkibuild.manifest import load_manifest
from nkibuild.manifest.model import Manifest
from nkibuild.plan import PLAN_CACHE_FILE
from nkibuild.session import LOCK_FILE, acquire_build_lock

MARKS = (LOCK_FILE, PLAN_CACHE_FILE)  # in <build dir>/state: nkibuild has used the dir


def clean(build_dir: Path, dist_dir: Path | None, manifest_path: Path) -> list[str]:
    """Remove the build dir (and with `dist_dir`, the project's wheels in it); what was
    removed, as lines to print. UsageError, before anything is removed, for a build or
    dist dir nkibuild may not remove from."""
    manifest = _manifest(manifest_path, needed=dist_dir is not None)
    build = _ours(build_dir, manifest_path, manifest)
    wheels = _own_wheels(dist_dir, manifest) if dist_dir is not None and manifest else []
    removed = []
    lock = acquire_build_lock(build_dir) if build else None  # none may run meanwhile
    try:
        if build:
            shutil.rmtree(build_dir)
            removed.append(f"removed {build_dir}")
        for wheel in wheels:
            wheel.unlink()
        if wheels and dist_dir is not None and not any(dist_dir.iterdir()):
            dist_dir.rmdir()
            return [*removed, f"removed {dist_dir}"]
    finally:
        if lock is not None:
            lock.release()
    return removed + [f"removed {wheel}" for wheel in wheels]


def _manifest(path: Path, *, needed: bool) -> Manifest | None:
    """The manifest, to know its sources and wheels; without `needed`, None if it does
    not load (the build dir can be cleaned of a broken project too)."""
    try:
        return load_manifest(path)
    except ManifestError:
        if needed:
            raise
        return None


def _ours(build_dir: Path, manifest_path: Path, manifest: Manifest | None) -> bool:
    """Whether the build dir exists and nkibuild may remove it (UsageError if it may not)."""
    _not_a_link(build_dir, "--build-dir")
    if not build_dir.exists():
        return False
    state = build_dir / "state"
    if state.is_symlink() or not any((state / mark).is_file() for mark in MARKS):
        raise UsageError(
            f"{build_dir} is not an nkibuild build dir (no {state}/{MARKS[0]} or "
            f"{MARKS[1]}): nkibuild removes only what it wrote; remove it yourself"
        )
    sources = [manifest_path, *(material_files(manifest) if manifest else [])]
    inside = [p for p in sources if Path(p).resolve().is_relative_to(build_dir.resolve())]
    if inside:
        raise UsageError(
            f"{build_dir} holds the project's sources ({inside[0]}): refusing to remove "
            "it; pass --build-dir a directory of build outputs only"
        )
    return True


def _own_wheels(dist_dir: Path, manifest: Manifest) -> list[Path]:
    """The wheels the project's build writes into `dist_dir` that are there."""
    _not_a_link(dist_dir, "--dist-dir")
    wheels = [dist_dir / wheel_file_name(p) for p in distributions(manifest)]
    return [w for w in wheels if w.is_file() and not w.is_symlink()]


def _not_a_link(directory: Path, option: str) -> None:
    if directory.is_symlink():
        raise UsageError(
            f"{directory} is a symbolic link (to {os.readlink(directory)}): nkibuild "
            f"removes nothing through one; pass the directory itself as {option}"
        )
