"""A proof that a whole build is up to date, so a repeated no-op build can skip doit.

After a complete, successful build nkibuild records a fingerprint of the task
graph (every task's file_dep, targets and config values) and the stat of every
file involved, including doit's own state file. If the next build sees the same
fingerprint and identical stats, doit would find every task up to date again:
its decision depends on nothing else. Any difference, however small, falls back
to doit, which then checks content hashes as usual.

Stats compare size, mtime, ctime and inode: ctime cannot be set back by tools
that restore mtimes, so a rewrite within the same mtime tick is still seen.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from nkibuild import __version__
from nkibuild.fsutil import atomic_write_text
from nkibuild.graph.intact import OutputsIntact, output_files

STAMP_FILE = "up-to-date.json"
Stat = tuple[int, int, int, int]


def fingerprint(dicts: list[dict[str, Any]]) -> str:
    digest = hashlib.sha256(__version__.encode())
    for task in dicts:
        configs = [getattr(check, "config", repr(check)) for check in task.get("uptodate", ())]
        entry = [task["basename"], task.get("name"), task["file_dep"], task["targets"], configs]
        digest.update(json.dumps(entry, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def files_of(dicts: list[dict[str, Any]], *extra: str) -> list[str]:
    """Every file the proof covers: dependencies, targets, the files in output
    directories (a bundle's tree) and `extra` (doit's state file)."""
    files = {path for task in dicts for path in (*task["file_dep"], *task["targets"])}
    files.update(extra)
    for task in dicts:
        for check in task.get("uptodate", ()):
            if isinstance(check, OutputsIntact):
                files.update(output_files((), check.directories))
    return sorted(files)


def sources_of(dicts: list[dict[str, Any]]) -> list[str]:
    """Files the build reads but no task writes: the user's inputs."""
    produced = {path for task in dicts for path in task["targets"]}
    return sorted({path for task in dicts for path in task["file_dep"]} - produced)


def stats(paths: Iterable[str]) -> dict[str, Stat] | None:
    """Stat every path; None if any is missing."""
    result: dict[str, Stat] = {}
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            return None
        result[path] = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    return result


def is_proven(state_dir: Path, key: str, paths: Callable[[], list[str]]) -> bool:
    """Whether the recorded proof holds for `key` and the files `paths()` lists
    (called only if there is a proof: listing walks the output directories)."""
    try:
        stamp = json.loads((state_dir / STAMP_FILE).read_text())
    except (OSError, ValueError):
        return False
    if stamp.get("fingerprint") != key:
        return False
    current = stats(paths())
    return current is not None and {p: list(s) for p, s in current.items()} == stamp.get("files")


def record(state_dir: Path, key: str, paths: list[str]) -> None:
    """Save the proof; best effort, since without it the next build only asks doit."""
    current = stats(paths)
    if current is not None:
        stamp = {"fingerprint": key, "files": {p: list(s) for p, s in current.items()}}
        with contextlib.suppress(OSError):
            atomic_write_text(state_dir / STAMP_FILE, json.dumps(stamp))


def forget(state_dir: Path) -> None:
    (state_dir / STAMP_FILE).unlink(missing_ok=True)
