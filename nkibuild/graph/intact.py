"""Outputs must still be what their task wrote, or the task runs again.

doit compares a task's `file_dep` with what it saw last time but never looks at
its `targets` again: an HLO module truncated in the build dir would be handed to
the compiler, and a damaged NEFF would be copied into the wheel. So every task
ends with an action that records the size, times and sha256 of each file it
wrote (directories are walked), and an `uptodate` check compares them on the
next run. Unchanged stats are trusted, as doit trusts them for `file_dep`;
changed stats cost one hash, and only a changed hash reruns the task.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from nkibuild.cache.key import file_sha256

VALUES_KEY = "outputs"
Fingerprint = list[Any]  # [size, mtime_ns, ctime_ns, inode, sha256]


def outputs_checked(
    files: Sequence[str], directories: Sequence[str] = ()
) -> tuple[tuple[Callable[..., Any], tuple[Any, ...]], OutputsIntact]:
    """For a task: the last action, which records its outputs, and the `uptodate`
    check that compares them (both over the same files and directories)."""
    return (record_outputs, (files, directories)), OutputsIntact(files, directories)


def record_outputs(
    files: Sequence[str], directories: Sequence[str] = ()
) -> dict[str, dict[str, Fingerprint]]:
    """doit action: fingerprints of the output files and of every file in `directories`."""
    return {VALUES_KEY: {path: _fingerprint(path) for path in output_files(files, directories)}}


def outputs_record(
    hashed: Mapping[str, str], others: Sequence[str] = ()
) -> dict[str, dict[str, Fingerprint]]:
    """What `record_outputs` returns, from an action that already knows the sha256 of
    some of its outputs (`hashed`: path -> sha256, e.g. a NEFF the compile stage verified):
    those are only stat'ed, not read again; `others` are hashed here."""
    recorded = {path: [*_stat(path), sha256] for path, sha256 in hashed.items()}
    recorded.update((path, _fingerprint(path)) for path in others)
    return {VALUES_KEY: recorded}


# doit inspects every `uptodate` check's signature for each task; computing it for an
# instance costs more than the check itself in a 1,000-unit no-op build. A check class
# declares it (`__signature__`): what its `__call__` takes.
CHECK_SIGNATURE = inspect.Signature(
    [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in ("task", "values")
    ]
)


class OutputsIntact:
    """doit `uptodate` check: False if a recorded output was changed or removed."""

    __signature__ = CHECK_SIGNATURE

    def __init__(self, files: Sequence[str], directories: Sequence[str] = ()) -> None:
        self.files = tuple(files)
        self.directories = tuple(directories)
        self.config = ["outputs-intact", *self.files, *self.directories]  # for fingerprints

    def __call__(self, task: Any, values: dict[str, Any]) -> bool | None:
        recorded = values.get(VALUES_KEY)
        if not isinstance(recorded, dict):
            return None  # nothing recorded (never ran): doit's other checks decide
        # A file added to an output directory is ignored: nothing reads what its task
        # did not write (the wheel packs only the files bundle.json lists). One loop, no
        # call per file: the bundle's are 15,000 at 10,000 units.
        stat = os.stat
        for path, fingerprint in recorded.items():
            try:
                info = stat(path)
            except OSError:
                return False
            if (
                info.st_mtime_ns != fingerprint[1]
                or info.st_ctime_ns != fingerprint[2]
                or info.st_ino != fingerprint[3]
                or info.st_size != fingerprint[0]
            ) and not _same_content(path, info.st_size, fingerprint):
                return False
        return True


def output_files(files: Sequence[str], directories: Sequence[str] = ()) -> list[str]:
    """The existing `files`, and the files in `directories` (hidden names, which are
    temp files, skipped)."""
    found = [path for path in files if os.path.exists(path)]
    for directory in directories:
        found.extend(_walk(directory))
    return found


def _walk(directory: str) -> Iterator[str]:
    """Files under `directory`, as os.walk finds them (symlinked dirs not followed), but
    with one scandir per directory: the up-to-date proof lists thousands of these."""
    try:
        entries = os.scandir(directory)
    except OSError:
        return
    with entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if not entry.is_dir():
                yield entry.path
            elif not entry.is_symlink():
                yield from _walk(entry.path)


def _stat(path: str) -> list[int]:
    info = os.stat(path)
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def _fingerprint(path: str) -> Fingerprint:
    return [*_stat(path), file_sha256(path)]


def _same_content(path: str, size: int, recorded: Fingerprint) -> bool:
    """A file whose stat changed: still what was recorded if its size and sha256 are."""
    return size == recorded[0] and file_sha256(path) == recorded[4]
