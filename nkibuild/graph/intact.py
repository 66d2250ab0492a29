"""Outputs must still be what their task wrote, or the task runs again.

doit compares a task's `file_dep` with what it saw last time but never looks at
its `targets` again: an HLO module truncated in the build dir would be handed to
the compiler, and a damaged NEFF would be copied into the wheel. So every task
ends by recording, in its doit values, the stamp (size, times, inode:
`fsutil.stamp_of`) and sha256 of each file it wrote (directories are walked), and
an `uptodate` check (`OutputsIntact`) compares them on the next run. Unchanged
stamps are trusted, as doit trusts stats for `file_dep`; a changed stamp costs one
hash, and only a changed hash reruns the task.

doit records a task's `file_dep` as they are after its actions ran, so a source saved
while the task read it would be recorded anew against the old output: the record of what
the task read (`inputs_checked`), taken before it ran, is checked like an output's.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from doit.tools import config_changed

from nkibuild.cache.key import file_sha256
from nkibuild.fsutil import stamp_of, stat_stamp

VALUES_KEY = "outputs"  # in a task's doit values: path -> [stamp, sha256]
INPUTS_KEY = "inputs"  # the same, of the files a task read, as it read them
READ_ATTEMPTS = 3  # runs of a task whose inputs keep changing before it fails

# The arguments doit passes an `uptodate` callable that asks for them. doit reads a
# callable's signature on every check (inspect.signature: ~0.06 ms of CPU each, half
# a no-op build's up-to-date checks); one given as `__signature__` is returned as is.
DOIT_CHECK_SIGNATURE = inspect.Signature(
    [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for name in ("task", "values")
    ]
)


def outputs_checked(
    files: Sequence[str], directories: Sequence[str] = ()
) -> tuple[tuple[Callable[..., Any], tuple[Any, ...]], OutputsIntact]:
    """For a task: the last action, which records its outputs, and the `uptodate`
    check that compares them (both over the same files and directories)."""
    return (record_outputs, (files, directories)), OutputsIntact(files, directories)


def record_outputs(files: Sequence[str], directories: Sequence[str] = ()) -> dict[str, Any]:
    """doit action: the record of the output files and of every file in `directories`."""
    return outputs_record({}, output_files(files, directories))


def outputs_record(hashed: Mapping[str, str], others: Sequence[str] = ()) -> dict[str, Any]:
    """What `record_outputs` returns, from an action that already knows the sha256 of
    some of its outputs (`hashed`: path -> sha256, e.g. a NEFF the compile stage
    verified): those are only stat'ed, not read again; `others` are hashed here."""
    shas = {**hashed, **{path: file_sha256(path) for path in others}}
    return {VALUES_KEY: {path: [stamp_of(os.stat(path)), sha] for path, sha in shas.items()}}


def inputs_checked(
    action: Callable[..., Any], args: tuple[Any, ...], inputs: Sequence[str], task: str
) -> tuple[tuple[Callable[..., Any], tuple[Any, ...]], OutputsIntact]:
    """For a task reading `inputs`: its action, run again while an input changes under
    it, and the `uptodate` check that compares the inputs with what it read."""
    return (read_unchanged, (action, args, inputs, task)), OutputsIntact(inputs, key=INPUTS_KEY)


def read_unchanged(
    action: Callable[..., Any], args: tuple[Any, ...], inputs: Sequence[str], task: str
) -> Any:
    """doit action: `action(*args)` and the record of `inputs` as they were before it
    ran; run again if one changed meanwhile (its stamp moved: it may have been read in
    either state), a failure after READ_ATTEMPTS runs."""
    from doit.exceptions import TaskFailed

    for _ in range(READ_ATTEMPTS):
        try:  # each stamp taken before its hash: an edit during the hash is seen too
            before = {path: [stat_stamp(path), file_sha256(path)] for path in inputs}
        except OSError as error:  # removed since doit checked it
            return TaskFailed(f"{error.filename}: {error.strerror}")
        result = action(*args)
        if isinstance(result, TaskFailed):
            return result
        changed = [path for path, (stamp, _) in before.items() if stat_stamp(path) != stamp]
        if not changed:
            return {**(result or {}), INPUTS_KEY: before}
    return TaskFailed(
        f"{changed[0]} changed while {task} read it, {READ_ATTEMPTS} times in a row; "
        "nothing was recorded: build again once it is saved"
    )


class OutputsIntact:
    """doit `uptodate` check: False if a recorded output (or, with `key=INPUTS_KEY`, a
    file the task read) was changed or removed."""

    def __init__(
        self, files: Sequence[str], directories: Sequence[str] = (), key: str = VALUES_KEY
    ) -> None:
        self.files = tuple(files)
        self.directories = tuple(directories)
        self.key = key
        self.__signature__ = DOIT_CHECK_SIGNATURE

    def __call__(self, task: Any, values: dict[str, Any]) -> bool | None:
        recorded = values.get(self.key)
        if recorded is None:
            return None  # nothing recorded (never ran): doit's other checks decide
        # A file added to an output directory is ignored: nothing reads what its task
        # did not write (the wheel packs only the files bundle.json lists).
        try:
            return all(_intact(path, *row) for path, row in recorded.items())
        except (AttributeError, TypeError):
            return False  # not a record of path -> [stamp, sha256]: not trusted

    def __repr__(self) -> str:  # doit names a check by it in `doit info`
        return f"OutputsIntact({[*self.files, *self.directories]})"


def _intact(path: str, stamp: str, sha256: str) -> bool:
    now = stat_stamp(path)
    return now is not None and (now == stamp or _same_content(path, now, stamp, sha256))


def output_files(files: Sequence[str], directories: Sequence[str] = ()) -> list[str]:
    """The existing `files`, and the files in `directories` (hidden names, which are
    temp files, skipped; symlinked directories not followed)."""
    found = [path for path in files if os.path.exists(path)]
    for directory in directories:
        found.extend(_walk(directory))
    return found


def _walk(directory: str) -> Iterator[str]:
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield from (os.path.join(root, name) for name in sorted(names) if not name.startswith("."))


def _same_content(path: str, stamp: str, recorded: str, sha256: str) -> bool:
    """A file whose stamp changed: still what was recorded if its size and sha256 are
    (one that cannot be read, made unreadable or replaced by a directory, is not)."""
    if stamp.partition(" ")[0] != recorded.partition(" ")[0]:
        return False
    try:
        return file_sha256(path) == sha256
    except OSError:
        return False


class ConfigChanged(config_changed):
    """doit's `config_changed`, its signature declared (DOIT_CHECK_SIGNATURE)."""

    def __init__(self, config: dict[str, Any] | str) -> None:
        super().__init__(config)
        self.__signature__ = DOIT_CHECK_SIGNATURE


def encoded_check(check: Any) -> dict[str, Any]:
    """An `uptodate` check of nkibuild's tasks as data (`decoded_check` makes it again)."""
    if isinstance(check, config_changed):
        return {"config": check.config}
    if isinstance(check, OutputsIntact):
        return {
            "files": list(check.files),
            "directories": list(check.directories),
            "key": check.key,
        }
    raise TypeError(f"no data form for the uptodate check {check!r}")


def decoded_check(data: dict[str, Any]) -> ConfigChanged | OutputsIntact:
    if "config" in data:
        return ConfigChanged(data["config"])
    return OutputsIntact(data["files"], data["directories"], data["key"])
