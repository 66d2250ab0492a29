"""Find the nkibuild projects of a monorepo: every nkibuild.yaml under a root.

Skipped: hidden directories, build and dist directories, virtualenvs (a pyvenv.cfg),
and whatever git ignores (asked from git itself, so nested .gitignore files, global
excludes and negations mean what they mean to git).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

MANIFEST = "nkibuild.yaml"
SKIPPED_NAMES = frozenset({"build", "dist", "node_modules", "__pycache__", "site-packages"})


def discover(root: Path) -> list[Path]:
    """Manifests under `root`, sorted by path."""
    found = []
    for directory, subdirs, files in os.walk(root):
        here = Path(directory)
        subdirs[:] = sorted(d for d in subdirs if _descend(here / d))
        if MANIFEST in files:
            found.append(here / MANIFEST)
    ignored = _git_ignored(root, found) if found else set()
    return [path for path in found if path not in ignored]


def _descend(directory: Path) -> bool:
    name = directory.name
    if name.startswith(".") or name in SKIPPED_NAMES:
        return False
    return not (directory / "pyvenv.cfg").exists()


def _git_ignored(root: Path, paths: list[Path]) -> set[Path]:
    try:
        proc = subprocess.run(
            # -z: NUL-separated both ways; otherwise git quotes and escapes non-ASCII
            # and control characters in its answer, which then matches no path.
            ["git", "-C", str(root), "check-ignore", "-z", "--stdin"],
            input=b"\0".join(os.fsencode(p) for p in paths),
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return set()  # no git: nothing is ignored
    # Exit 1: nothing ignored; 128: not a repository. Only 0 lists ignored paths.
    if proc.returncode != 0:
        return set()
    return {Path(os.fsdecode(name)) for name in proc.stdout.split(b"\0") if name}
