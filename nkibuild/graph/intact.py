"""Outputs must still be what their task wrote, or the task runs again.

doit compares a task's `file_dep` with what it saw last time but never looks at
its `targets` again: an HLO module truncated in the build dir would be handed to
the compiler, and a damaged NEFF would be copied into the wheel. So every task
ends with an action that records the stamp (size, times, inode: `fsutil.stamp_of`)
and sha256 of each file it wrote (directories are walked), and an `uptodate` check
compares them on the next run. Unchanged stamps are trusted, as doit trusts stats
for `file_dep`; a changed stamp costs one hash, and only a changed hash reruns the
task.

doit saves the record with the task's values, as JSON, in columns: the files' names
after a common root, their stamps and their sha256s, each one NUL-joined string
(`Recorded`). The bundle's 15,000 files are then three strings to read and write,
not 15,000 lists. The object of per-file lists an older nkibuild saved is still read.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from nkibuild.cache.key import file_sha256
from nkibuild.fsutil import STAMP_FIELDS, stamp_of, stamps_of_numbers, stat_stamp

# In no path; the state patches these columns field by field (graph/state.py).
from nkibuild.graph.state import FIELD_SEPARATOR as SEPARATOR

VALUES_KEY = "outputs"
COLUMNS = ("root", "names", "stamps", "sha256")  # of a record as doit saves it


class Recorded(NamedTuple):
    """A task's outputs as its last action recorded them: each file's path, stamp and
    sha256, in order."""

    paths: list[str]
    stamps: list[str]
    sha256: list[str]


def columns(root: str, names: Sequence[str], stamps: Sequence[str], shas: Sequence[str]) -> dict:
    """An outputs record as doit saves it: the files `root` + each of `names`."""
    joined = (SEPARATOR.join(column) for column in (names, stamps, shas))
    return dict(zip(COLUMNS, (root, *joined), strict=True))


def recorded_outputs(value: object) -> Recorded | None:
    """The record doit saved (either form); None if `value` is not one (damaged)."""
    if isinstance(value, dict) and value.keys() == set(COLUMNS):
        root, *joined = (value[name] for name in COLUMNS)
        if not all(type(text) is str for text in (root, *joined)):
            return None
        names, stamps, shas = (text.split(SEPARATOR) if text else [] for text in joined)
        if not len(names) == len(stamps) == len(shas):
            return None
        return Recorded(list(map(root.__add__, names)) if root else names, stamps, shas)
    return _fingerprints(value)


def _fingerprints(value: object) -> Recorded | None:
    """The record an older nkibuild saved: path -> [size, mtime_ns, ctime_ns, inode, sha256]."""
    if not isinstance(value, dict):
        return None
    rows = list(value.values())
    if not all(
        type(row) is list
        and len(row) == STAMP_FIELDS + 1
        and all(type(number) is int for number in row[:STAMP_FIELDS])
        and type(row[STAMP_FIELDS]) is str
        for row in rows
    ):
        return None
    stamps = stamps_of_numbers([number for row in rows for number in row[:STAMP_FIELDS]])
    return Recorded(list(value), stamps, [row[STAMP_FIELDS] for row in rows])


def outputs_checked(
    files: Sequence[str], directories: Sequence[str] = ()
) -> tuple[tuple[Callable[..., Any], tuple[Any, ...]], OutputsIntact]:
    """For a task: the last action, which records its outputs, and the `uptodate`
    check that compares them (both over the same files and directories)."""
    return (record_outputs, (files, directories)), OutputsIntact(files, directories)


def record_outputs(files: Sequence[str], directories: Sequence[str] = ()) -> dict[str, dict]:
    """doit action: the record of the output files and of every file in `directories`."""
    return outputs_record({}, output_files(files, directories))


def outputs_record(hashed: Mapping[str, str], others: Sequence[str] = ()) -> dict[str, dict]:
    """What `record_outputs` returns, from an action that already knows the sha256 of
    some of its outputs (`hashed`: path -> sha256, e.g. a NEFF the compile stage verified):
    those are only stat'ed, not read again; `others` are hashed here."""
    paths = [*hashed, *others]
    stamps = [stamp_of(os.stat(path)) for path in paths]
    shas = [*hashed.values(), *map(file_sha256, others)]
    return {VALUES_KEY: columns("", paths, stamps, shas)}


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
        if VALUES_KEY not in values:
            return None  # nothing recorded (never ran): doit's other checks decide
        recorded = recorded_outputs(values[VALUES_KEY])
        if recorded is None:
            return False  # not understood: not trusted
        # A file added to an output directory is ignored: nothing reads what its task
        # did not write (the wheel packs only the files bundle.json lists). One loop:
        # the bundle's are 15,000 at 10,000 units.
        for path, stamp, sha256 in zip(*recorded, strict=True):
            now = stat_stamp(path)
            if now is None or (now != stamp and not _same_content(path, now, stamp, sha256)):
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


def _same_content(path: str, stamp: str, recorded: str, sha256: str) -> bool:
    """A file whose stamp changed: still what was recorded if its size and sha256 are
    (one that cannot be read, made unreadable or replaced by a directory, is not)."""
    if stamp.partition(" ")[0] != recorded.partition(" ")[0]:
        return False
    try:
        return file_sha256(path) == sha256
    except OSError:
        return False
