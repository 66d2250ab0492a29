"""doit state backend: one file, an append-only log of task entries, compacted atomically.

doit's own backends fall short here: `json` rewrites its file in place on every
run (a kill mid-write leaves a truncated file that fails every later run),
`dbm` is `dbm.dumb` on many hosts (slow, three files), and `sqlite3` pays a
query per key, which dominates a no-op build of thousands of tasks.

The file holds one line per task entry (its id and the entry, both JSON) after a
header line; a later line for a task replaces an earlier one, and an entry of `null`
removes the task. Entries are decoded when doit first asks about their task. A run
that changed a few tasks of thousands (after an edit the up-to-date proof, uptodate.py,
hands doit only those) appends their lines instead of writing every entry again;
once the file holds more superseded lines than live ones it is rewritten whole, to a
temp file renamed over it. A file of the earlier layouts (one JSON object; version 2,
which has no patches) is still read.

A task whose entry is big and changed a little (the bundle's lists every compile
record and every file of its tree: megabytes at 10,000 units, of which an edit changes
a few) gets a patch line instead: a JSON list of operations on its entry as the lines
before it leave it (`[[key, ...], value]` sets a value, `[[key, ...]]` removes one,
the keys a path into nested objects; `[[key, ...], index, text, ...]` replaces fields
of a long string of NUL-separated fields changed in a few, as the columns of an
outputs record, graph/intact.py, hold 15,000 stamps or sha256s: `_changed_fields`).
The entry is written whole again once its patches would outweigh half of it.

Beside the file, an index (`<file>.index`, a plain-data pickle) says where each task's
lines are, for the file as it was written (its size, times and inode): the next run
that hands doit a few tasks reads their lines alone instead of the whole file (20 MB at
10,000 units). An index that does not describe the file as it is (not written: a
build killed between the two writes; the file changed by anything else) is not used,
and the file is read whole as without one; a line read through it that does not sit
where the index says is taken as damaged.

A line cut short (a build killed while appending) is not fatal: an entry that does
not decode only means "that task is not known to be up to date", and an unterminated
last line is ignored, so the task's earlier entry (a true record of an earlier
successful run, which doit compares with the files as they are now) stands. Either
makes the next write a whole rewrite. The compile stage's own completion records keep
any resulting rerun cheap.
"""

from __future__ import annotations

import contextlib
import json
import marshal
import os
import weakref
from array import array
from collections.abc import Sequence
from itertools import chain, compress, count
from operator import itemgetter, le, ne
from pathlib import Path
from typing import IO, Any

from nkibuild import plaindata
from nkibuild.fsutil import atomic_write_bytes, atomic_write_text, stamp_of

BACKEND_NAME = "nkibuild-json"
DEP_FILE = "doit-state.json"  # in the build's state dir


# Every nkibuild that writes version 4 reads it the same way: later lines win, a `null`
# entry is not an entry, a line whose entry is a JSON list patches the entry before it.
# Version 3 is version 4 without splices, version 2 is version 3 without patches.
HEADER = '{"format": "nkibuild-doit-state", "version": 4}'
READABLE_HEADERS = (
    HEADER,
    '{"format": "nkibuild-doit-state", "version": 3}',
    '{"format": "nkibuild-doit-state", "version": 2}',
)
REMOVED = "null"
# doit saves a task's values and the result of its last action, which for nkibuild's
# tasks is the values but for what doit adds to them (the outputs record: the bundle's
# lists 15,000 files at 10,000 units); it is written once, this key naming the values
# that make the result. doit's own keys end in ":" and the others are absolute paths,
# so the name cannot be a task's.
VALUES, RESULT, RESULT_IS_VALUES = "_values_:", "result:", "result:is:_values_:"
FILE_DEPS = "deps:"
# Appending stops paying once superseded lines outweigh the live ones this much.
COMPACT_RATIO = 2
MAX_PATCHES = 50  # a task's patches applied on decode before it is written whole again
PATCH_DEPTH = 3  # keys deep: the bundle's `_values_:` -> `outputs` -> a file or column
FIELD_SEPARATOR = "\0"  # of a string patched field by field (`_changed_fields`)
SPLICE_MIN = 4096  # characters: a shorter string is set whole
_MISSING: Any = object()  # a key an entry does not have

Span = tuple[int, int]  # where a line's entry is in the file's text
Lines = tuple[Span, ...]  # a task's whole entry, then the patches after it
INDEX_SUFFIX = ".index"
INDEX_FORMAT = 2


class AtomicJsonDB:
    """Implements the backend interface doit's `Dependency` expects."""

    desc = "an append-only log of per-task entries, decoded on use, compacted atomically"

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None) -> None:
        self.name = name
        self.codec = codec
        # Each task's entry as saved: where its whole entry and the patches after it are
        # in the file's text (kept whole; slicing 15,000 entries out of tens of MB costs
        # more than reading it).
        self._text_read = ""
        self._lines = _Places()
        # Or, read through the index: the file as opened then (its lines are read from
        # it as decoded; the open file stays the one indexed if the name is replaced).
        self._stream: IO[bytes] | None = None
        # Where each task's lines are in the file as it is on disk, in bytes (what the
        # index says); None where unknown (a file of other than ASCII text).
        self._placed: _Places | None = _Places()
        self._indexed = False  # the index describes the file as read
        self._db: dict[str, dict[str, Any]] = {}  # decoded entries
        # Changed since the file was read: tasks to write whole (new) or as removed, and
        # the keys changed in the others, with their values as the file has them.
        self._whole: set[str] = set()
        self._edits: dict[str, dict[str, Any]] = {}
        self._file_chars = 0  # the file as read, superseded lines included
        # (inode, size) of the file as read or last written: appending to another (a
        # `clean` meanwhile) would make a file without its header.
        self._identity: tuple[int, int] | None = None
        self._rewrite = False  # the file must be written whole (damaged, earlier layout)
        self._load()

    @property
    def _index_name(self) -> str:
        return self.name + INDEX_SUFFIX

    def _load(self) -> None:
        if self._load_indexed():
            return
        try:
            with open(self.name, encoding="utf-8") as handle:
                text = handle.read()
                info = os.fstat(handle.fileno())
        except FileNotFoundError:
            return
        except (OSError, ValueError):  # ValueError: not UTF-8 (nkibuild writes ASCII)
            self._rewrite = True  # replace the unreadable file at the end of this run
            return
        self._file_chars, self._identity = len(text), (info.st_ino, info.st_size)
        header, newline, _ = text.partition("\n")
        if newline and header in READABLE_HEADERS:
            self._text_read = text
            entries, intact = _entries(text, len(header) + 1)
            self._lines = _Places.of(entries)
            self._rewrite = not intact or header != HEADER
            # Characters are bytes in an ASCII file (nkibuild writes no other).
            self._placed = self._lines.copy() if len(text) == info.st_size else None
            return
        try:  # the earlier layout: one JSON object
            data = self.codec.decode(text)
        except (ValueError, RecursionError):
            data = None
        entries = data.items() if isinstance(data, dict) else ()
        self._db = {task_id: entry for task_id, entry in entries if isinstance(entry, dict)}
        self._rewrite = True

    def _load_indexed(self) -> bool:
        """Take where each task's lines are from the index, if it describes the file as
        it is; False (nothing taken) otherwise."""
        try:
            with open(self._index_name, "rb") as handle:
                index = plaindata.load(handle)
            stream = open(self.name, "rb")  # noqa: SIM115  # kept open: see self._stream
        except (OSError, ValueError):
            return False
        info = os.fstat(stream.fileno())
        lines = _indexed_lines(index, stamp_of(info), info.st_size)
        if lines is None:
            stream.close()
            return False
        weakref.finalize(self, stream.close)
        self._stream, self._lines, self._placed, self._indexed = stream, lines, lines.copy(), True
        self._file_chars, self._identity = info.st_size, (info.st_ino, info.st_size)
        return True

    def _entry(self, task_id: str) -> dict[str, Any] | None:
        entry = self._db.get(task_id)
        lines = self._lines.get(task_id) if entry is None else None
        if lines is not None:
            entry = self._decoded(task_id, lines)
            if entry is None:  # damaged: forget this task only
                self._lines.pop(task_id)
                self._rewrite = True
                return None
            self._db[task_id] = entry
        return entry

    def _decoded(self, task_id: str, lines: Lines) -> dict[str, Any] | None:
        try:
            entry = self.codec.decode(self._saved(task_id, lines[0]))
            if not isinstance(entry, dict):
                return None
            fields = _Fields()
            for span in lines[1:]:
                _patch(entry, self.codec.decode(self._saved(task_id, span)), fields)
            fields.join()
        except (ValueError, RecursionError):  # ValueError: also a line not where indexed
            return None
        return _with_result(entry)

    def _encode(self, entry: dict[str, Any]) -> str:
        reference = _result_reference(entry)
        if reference is not None:
            entry = {**entry, RESULT_IS_VALUES: reference}
            del entry[RESULT]
        return self.codec.encode(entry)

    def dump(self) -> None:
        if not (self._whole or self._edits or self._rewrite):
            if not self._indexed and self._identity is not None and self._placed is not None:
                # Read whole and unchanged: indexed for the next run that hands doit a few.
                with contextlib.suppress(OSError):
                    info = os.stat(self.name)
                    if (info.st_ino, info.st_size) == self._identity:
                        self._write_index(info)
            return
        changes, patched = self._changes()
        appended = "".join(f"{json.dumps(task_id)}\t{line}\n" for task_id, line in changes.items())
        try:
            if self._rewrite or not self._file_chars or self._outweighs(changes, appended, patched):
                info = self._write_whole(changes, patched)
            elif (info := _append(self.name, appended, self._identity)) is not None:
                self._file_chars += len(appended)
                self._identity = info.st_ino, info.st_size
                self._placed = _placed_after(self._placed, changes, patched, appended, info)
            else:  # not the file that was read
                info = self._write_whole(changes, patched)
        except OSError as error:
            # doit would print a traceback; the session's build reports it after doit
            # returns (doit constructs this object, so the session is found, not passed).
            from nkibuild.session import current_session

            session = current_session()
            if session is None:
                raise
            session.state_failures.append(error)
            return
        # The saved lines no longer describe the tasks written: their decoded entries do.
        for task_id in changes:
            self._lines.pop(task_id)
        self._whole.clear()
        self._edits.clear()
        self._rewrite = False
        self._write_index(info)

    def _write_index(self, info: os.stat_result) -> None:
        """Say where each task's lines are in the file as it is now (`info`); best
        effort, as without it the next run reads the file whole."""
        placed = self._placed
        self._indexed = False
        try:
            if placed is None:
                os.unlink(self._index_name)  # describes no file any more: not read again
                return
            # Each task's line in two flat lists, read back in one pass; the few with
            # patches after their line (the bundle) also whole, apart.
            ids, bounds = placed.first_lines()
            index = {
                "format": INDEX_FORMAT,
                "state": stamp_of(info),
                "ids": ids,
                "bounds": bounds.tobytes(),
                "patched": [
                    [task_id, list(chain.from_iterable(lines))]
                    for task_id, lines in placed.patched.items()
                ],
            }
            atomic_write_bytes(Path(self._index_name), plaindata.dumps(index), durable=False)
        except (OSError, OverflowError):  # OverflowError: an offset past array("q")'s
            return
        self._indexed = True

    def _changes(self) -> tuple[dict[str, str], set[str]]:
        """Each changed task's line: its patch, its whole entry or its removal; and which
        of them are patches."""
        changes: dict[str, str] = {}
        patched: set[str] = set()
        for task_id in sorted(self._whole.union(self._edits)):
            entry = self._db.get(task_id)
            if task_id in self._edits and entry is not None:
                patch = self._patch_line(task_id, entry)
                if patch is not None:
                    changes[task_id] = patch
                    patched.add(task_id)
                    continue
            changes[task_id] = REMOVED if entry is None else self._encode(entry)
        return changes, patched

    def _patch_line(self, task_id: str, entry: dict[str, Any]) -> str | None:
        """The changes to the task's saved entry as a patch line; None where the entry
        is better written whole (small, or patched enough already)."""
        lines = self._lines.get(task_id)
        if lines is None or len(lines) > MAX_PATCHES:
            return None
        before = self._edits[task_id]
        operations = [
            operation
            for key, value in before.items()
            if key != RESULT
            for operation in _diff([key], value, entry.get(key, _MISSING))
        ]
        if RESULT in before or VALUES in before:
            operations += _result_operations(entry)
        line = self.codec.encode(operations)
        start, end = lines[0]
        patches = sum(end - start for start, end in lines[1:])
        return line if 2 * (patches + len(line)) <= end - start else None

    def _write_whole(self, changes: dict[str, str], patched: set[str]) -> os.stat_result:
        text, placed = self._text(changes, patched)
        atomic_write_text(Path(self.name), text)
        info = os.stat(self.name)
        self._file_chars, self._identity = len(text), (info.st_ino, info.st_size)
        self._placed = placed if text.isascii() else None
        return info

    def _outweighs(self, changes: dict[str, str], appended: str, patched: set[str]) -> bool:
        # A task written whole supersedes its saved lines; a patch adds to them. Every
        # saved line's length summed in C (15,000 tasks), the few superseded taken off.
        superseded = (self._lines.get(task_id) or () for task_id in changes.keys() - patched)
        live = (
            len(appended)
            + self._lines.characters()
            - sum(end - start for lines in superseded for start, end in lines)
        )
        return self._file_chars + len(appended) > COMPACT_RATIO * live + len(HEADER)

    def _text(self, changes: dict[str, str], patched: set[str]) -> tuple[str, _Places]:
        """The whole file: every task's latest entry, once, patches applied; and where
        each task's line is in it."""
        self._read_whole()
        lines = [HEADER]
        placed: dict[str, Lines] = {}
        end = len(HEADER)

        def add(task_id: str, encoded: str) -> None:
            nonlocal end
            key = json.dumps(task_id)
            start = end + 1 + len(key) + 1  # after the newline before and the tab
            end = start + len(encoded)
            placed[task_id] = ((start, end),)
            lines.append(f"{key}\t{encoded}")

        for task_id, saved in self._lines.items():
            if task_id in changes and task_id not in patched:
                add(task_id, changes[task_id])
                continue
            if task_id in self._edits or len(saved) > 1:
                entry = self._entry(task_id)
                encoded = self._encode(entry) if entry is not None else None
            else:
                try:
                    encoded = self._saved(task_id, saved[0])
                except ValueError:
                    encoded = None
            if encoded is not None:  # else damaged: forgotten
                add(task_id, encoded)
        for task_id, entry in self._db.items():
            if task_id not in self._lines:
                add(task_id, changes.get(task_id) or self._encode(entry))
        return "\n".join(lines) + "\n", _Places.of(placed)

    def _read_whole(self) -> None:
        """Read the whole file from the indexed stream, to write every entry again."""
        stream, self._stream = self._stream, None
        if stream is None:
            return
        with stream:
            data = stream.read() if stream.seek(0) == 0 else b""
        self._text_read = data.decode("utf-8", errors="replace")  # a damaged line: see _saved

    def _saved(self, task_id: str, span: Span) -> str:
        """The entry at `span`, on a line of `task_id`; ValueError if there is none there
        (an index that does not describe the file)."""
        start, end = span
        line = f"\n{json.dumps(task_id)}\t"
        first = start - len(line)
        if first < 0:
            raise ValueError("not a line of the task where the index says")
        if self._stream is None:
            text = self._text_read
            if not (text.startswith(line, first) and text[end : end + 1] == "\n"):
                raise ValueError("not a line of the task where the index says")
            return text[start:end]
        try:
            data = os.pread(self._stream.fileno(), end + 1 - first, first)
        except OSError as error:
            raise ValueError(f"not read: {error}") from error
        if not (data.startswith(line.encode()) and data.endswith(b"\n")):
            raise ValueError("not a line of the task where the index says")
        # Decoded from the buffer as read: one copy of the bundle's 5 MB, not three.
        return str(memoryview(data)[len(line) : -1], "utf-8")

    def set(self, task_id: str, dependency: str, value: Any) -> None:
        entry = self._entry(task_id)
        if entry is None:
            entry = self._db[task_id] = {}
            self._whole.add(task_id)
        elif task_id not in self._whole:
            saved = entry.get(dependency, _MISSING)
            if _equal(saved, value) or (dependency == FILE_DEPS and _same_set(saved, value)):
                return  # doit sets every key of a task it ran: most are as saved
            self._edits.setdefault(task_id, {}).setdefault(dependency, saved)
        entry[dependency] = value

    def get(self, task_id: str, dependency: str) -> Any:
        # doit asks once per file_dep of a task it saves: 10,000 for the bundle.
        entry = self._db.get(task_id)
        if entry is None:
            entry = self._entry(task_id)
            if entry is None:
                return None
        return entry.get(dependency)

    def in_(self, task_id: str) -> bool:
        return task_id in self._db or task_id in self._lines

    def remove(self, task_id: str) -> None:
        saved = self._lines.pop(task_id)
        found = self._db.pop(task_id, None) is not None
        self._edits.pop(task_id, None)
        if saved or found:
            self._whole.add(task_id)

    def remove_all(self) -> None:
        self._db, self._lines, self._edits, self._whole = {}, _Places(), {}, set()
        self._rewrite = True


def _equal(saved: Any, value: Any) -> bool:
    """Whether `value` would be saved as `saved` is: equal, and of the same JSON types
    throughout (Python takes 1, 1.0 and True for equal, and 0.0 for -0.0; JSON has no
    tuples: doit's are lists once read back)."""
    if saved is value:  # the values doit passes back, or a result's part of them
        return saved is not _MISSING
    if saved is _MISSING:
        return False
    if type(value) is tuple:
        value = list(value)
    return saved == value and _same_types(saved, value)


_SCALARS = {str, int, bool, type(None)}  # equal values of one of these types save alike


def _same_types(saved: Any, value: Any) -> bool:
    """For values found equal: whether each part has the same JSON type (a list of plain
    scalars, as an output's fingerprint, is compared in one call)."""
    kind = type(saved)
    if kind is list:
        if type(value) is not list and type(value) is not tuple:
            return False
        types = list(map(type, saved))
        if types == list(map(type, value)) and _SCALARS.issuperset(types):
            return True
        return all(map(_same_types, saved, value))
    if kind is dict:
        return type(value) is dict and all(
            _same_types(item, value[key]) for key, item in saved.items()
        )
    if kind is float:  # 0.0 == -0.0, which JSON writes apart
        return type(value) is float and repr(saved) == repr(value)
    return kind is type(value)


def _same_set(saved: Any, value: Any) -> bool:
    """doit reads its list of a task's file_dep as a set, and writes it in the order of
    one (which differs between processes); a saved list that is not of names is not it."""
    try:
        return (
            type(saved) is list
            and all(type(path) is str for path in saved)
            and set(saved) == set(value)
        )
    except TypeError:  # not hashable: not doit's
        return False


def _diff(keys: list[str], before: Any, after: Any) -> list[list[Any]]:
    """Patch operations turning `before` (at `keys`) into `after`: nested objects are
    compared member by member, down to PATCH_DEPTH keys."""
    if after is _MISSING:
        return [[keys]]
    if type(before) is not dict or type(after) is not dict or len(keys) >= PATCH_DEPTH:
        return [[keys, after]]
    if not plaindata.all_strings(after):  # JSON would make a key a string: set the object whole
        return [[keys, after]]
    operations: list[list[Any]] = []
    if len(keys) + 1 == PATCH_DEPTH:  # members set whole (or spliced): the bundle's outputs
        same = _saved_alike(before, after)
        operations += [
            _set([*keys, key], before.get(key, _MISSING), value)
            for key, value in after.items()
            if key not in same
        ]
    else:
        for key, value in after.items():
            saved = before.get(key, _MISSING)
            if not _equal(saved, value):
                operations += _diff([*keys, key], saved, value)
    operations += [[[*keys, key]] for key in before.keys() - after.keys()]
    return operations


def _set(keys: list[str], before: Any, after: Any) -> list[Any]:
    """The operation making `after` the value at `keys`, where `before` was: the fields
    of a long string changed in a few of them, else `after` whole."""
    if type(before) is str and type(after) is str and len(after) >= SPLICE_MIN:
        changed = _changed_fields(before, after)
        if changed is not None:
            return [keys, *changed]
    return [keys, after]


def _changed_fields(before: str, after: str) -> list[Any] | None:
    """`index, text, ...`: each NUL-separated field of `after` that differs from the same
    field of `before`; None if they have not the same number of fields, or the changed
    ones are not much smaller than `after` (an edit changes a few of 15,000 stamps)."""
    old, new = before.split(FIELD_SEPARATOR), after.split(FIELD_SEPARATOR)
    if len(old) != len(new):
        return None
    changed = list(compress(count(), map(ne, old, new)))  # compared in C
    if not changed or sum(len(new[index]) + 16 for index in changed) * 4 > len(after):
        return None
    return [item for index in changed for item in (index, new[index])]


class _Fields:
    """The strings a task's patches change field by field, split once while its patches
    are applied and joined after them (50 patches would otherwise copy each string 50
    times). The strings are held by (the object holding one, its key)."""

    def __init__(self) -> None:
        self._split: dict[tuple[int, str], tuple[dict[str, Any], str, list[str]]] = {}

    def replace(self, target: dict[str, Any], key: str, changes: list[Any]) -> None:
        """Replace fields of the string at `target[key]` (`_changed_fields`); ValueError
        if it is not a string of those fields."""
        held = self._split.get((id(target), key))
        if held is None:
            text = target.get(key)
            if type(text) is not str:
                raise ValueError("fields of what is not a string")
            held = self._split[id(target), key] = (target, key, text.split(FIELD_SEPARATOR))
        fields = held[2]
        for index, text in zip(changes[::2], changes[1::2], strict=True):
            if not (type(index) is int and 0 <= index < len(fields) and type(text) is str):
                raise ValueError("not a field of the string")
            fields[index] = text

    def forget(self, target: dict[str, Any], key: str) -> None:
        """`target[key]` is set or removed whole: the fields replaced before are not it."""
        self._split.pop((id(target), key), None)

    def join(self) -> None:
        for target, key, fields in self._split.values():
            target[key] = FIELD_SEPARATOR.join(fields)
        self._split.clear()


def _saved_alike(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """The keys whose value in `after` would be saved as `before`'s is (`_equal`): those
    equal in Python, checked for types in one marshal of them all (which writes 1, 1.0
    and True, 0.0 and -0.0, lists and tuples apart, and refuses subclasses), one by one
    where that finds a difference; and those unequal only as a tuple and a list are."""
    equal = [key for key, value in after.items() if before.get(key, _MISSING) == value]
    saved, values = [before[key] for key in equal], [after[key] for key in equal]
    try:
        alike = set(equal) if marshal.dumps(saved, 0) == marshal.dumps(values, 0) else None
    except ValueError:  # not marshal's
        alike = None
    if alike is None:
        alike = {
            key for key, old, new in zip(equal, saved, values, strict=True) if _equal(old, new)
        }
    unequal = after.keys() - set(equal)  # a few after an edit
    alike.update(key for key in unequal if _equal(before.get(key, _MISSING), after[key]))
    return alike


def _result_operations(entry: dict[str, Any]) -> list[list[Any]]:
    """The result as the file saves it: by reference where the values hold it."""
    reference = _result_reference(entry)
    if reference is not None:
        return [[[RESULT_IS_VALUES], reference], [[RESULT]]]
    result = entry.get(RESULT, _MISSING)
    if result is _MISSING:
        return [[[RESULT]], [[RESULT_IS_VALUES]]]
    return [[[RESULT], result], [[RESULT_IS_VALUES]]]


def _result_reference(entry: dict[str, Any]) -> list[str] | None:
    """The keys of the values the result consists of (doit adds its own values, such as
    `config_changed`'s digest, to those the action returned), or None if it is not so."""
    result, values = entry.get(RESULT), entry.get(VALUES)
    if type(result) is not dict or type(values) is not dict:
        return None
    for key, value in result.items():
        if type(key) is not str or not _equal(values.get(key, _MISSING), value):
            return None
    return list(result)


def _with_result(entry: dict[str, Any]) -> dict[str, Any] | None:
    """`entry` with its result taken from its values where the file saved it so; None
    if the reference is to values the entry does not have (damaged)."""
    reference = entry.pop(RESULT_IS_VALUES, None)
    values = entry.get(VALUES)
    if reference is None:
        return entry
    if reference is True:  # written by earlier versions: the values whole
        if values is not None:
            entry[RESULT] = values
        return entry
    if not (type(values) is dict and type(reference) is list):
        return None
    if not all(type(key) is str and key in values for key in reference):
        return None
    entry[RESULT] = {key: values[key] for key in reference}
    return entry


def _patch(entry: dict[str, Any], operations: Any, fields: _Fields) -> None:
    """Apply a patch line's operations to `entry`, the strings changed field by field held
    in `fields` (joined into the entry once its last patch is applied); ValueError if it
    is not one."""
    if not isinstance(operations, list):
        raise ValueError("not a patch")
    for operation in operations:
        if not (isinstance(operation, list) and (len(operation) == 2 or len(operation) % 2)):
            raise ValueError("not a patch operation")
        keys = operation[0]
        if not (isinstance(keys, list) and keys and all(type(key) is str for key in keys)):
            raise ValueError("not a patch's keys")
        target = entry
        for key in keys[:-1]:
            target = target.get(key)
            if not isinstance(target, dict):
                raise ValueError("a patch of what the entry does not have")
        if len(operation) > 2:
            fields.replace(target, keys[-1], operation[1:])
            continue
        fields.forget(target, keys[-1])
        if len(operation) == 2:
            target[keys[-1]] = operation[1]
        else:
            target.pop(keys[-1], None)


def _entries(text: str, start: int) -> tuple[dict[str, Lines], bool]:
    """Where each task's saved entry is in `text` from `start` on (its last whole line,
    or removal, and the patch lines after it), still encoded; and whether every line was
    whole (else the file is to be rewritten)."""
    keys: list[str] = []
    spans: list[Span] = []
    intact = True
    find = text.find
    while start < len(text):
        end = find("\n", start)
        if end < 0:  # a last line without its newline was cut short
            intact = False
            break
        tab = find("\t", start, end)
        if tab < 0:
            intact = False
        else:
            keys.append(text[start:tab])
            spans.append((tab + 1, end))
        start = end + 1
    try:  # one decode for all ids: this runs on every build that hands doit a task
        ids = json.loads(f"[{','.join(keys)}]")
    except (ValueError, RecursionError):
        ids = None
    if not isinstance(ids, list) or len(ids) != len(keys):  # a damaged key
        ids = [_task_id(key) for key in keys]
        intact = False
    entries: dict[str, Lines] = {}
    for task_id, span in zip(ids, spans, strict=True):
        if not isinstance(task_id, str):
            intact = False
            continue
        start, end = span
        if text.startswith("[", start):  # a patch of the task's entry so far
            saved = entries.get(task_id)
            if saved is None:  # of no entry: not understood
                intact = False
            else:
                entries[task_id] = (*saved, span)
            continue
        entries.pop(task_id, None)  # the file's order of the latest lines
        if not (end - start == len(REMOVED) and text.startswith(REMOVED, start)):
            entries[task_id] = (span,)
    return entries, intact


def _indexed_lines(index: Any, state: str, size: int) -> _Places | None:
    """Where each task's lines are, from an index (`AtomicJsonDB._write_index`) written
    for the file of stat `state` and `size` bytes; None if it is not one, or of another
    file, or places a line outside the file (a damaged index)."""
    if not (isinstance(index, dict) and index.get("format") == INDEX_FORMAT):
        return None
    ids, bounds, patched = index.get("ids"), array("q"), index.get("patched")
    if index.get("state") != state or type(ids) is not list or type(patched) is not list:
        return None
    try:
        bounds.frombytes(index["bounds"])
    except (KeyError, TypeError, ValueError):
        return None
    if 2 * len(ids) != len(bounds) or not plaindata.all_strings(ids) or not _within(bounds, size):
        return None
    lines = _Places(ids, bounds)
    if len(lines.slots) != len(ids):  # an id twice: not an index of ours
        return None
    for entry in patched:  # each also among the ids, with its first line
        if not (type(entry) is list and len(entry) == 2 and type(entry[0]) is str):
            return None
        flat = entry[1]
        if not (entry[0] in lines and type(flat) is list and len(flat) % 2 == 0):
            return None
        if len(flat) < 4 or not all(type(number) is int for number in flat):  # 2+ lines
            return None
        if not _within(flat, size):
            return None
        lines.put(entry[0], tuple(zip(flat[::2], flat[1::2], strict=True)))
    return lines


def _within(bounds: Sequence[int], size: int) -> bool:
    """Every line's start and end is in a file of `size` bytes, each start before its end."""
    starts, ends = bounds[::2], bounds[1::2]
    if not bounds:
        return True
    return min(starts) >= 0 and max(ends) <= size and all(map(le, starts, ends))


def _placed_after(
    placed: _Places | None,
    changes: dict[str, str],
    patched: set[str],
    appended: str,
    info: os.stat_result,
) -> _Places | None:
    """Where each task's lines are once `appended` (the `changes`' lines, in order) is at
    the end of the file, now `info`: `placed` updated in place (a few tasks of 15,000);
    None if that is not known in bytes."""
    if placed is None or not appended.isascii():
        return None
    end = info.st_size - len(appended)
    for task_id, line in changes.items():
        start = end + len(json.dumps(task_id)) + 1
        end = start + len(line) + 1  # and the newline
        span = (start, end - 1)
        if task_id in patched:
            lines = placed.get(task_id)
            if lines is None:  # a patch of lines not known: no index
                return None
            placed.put(task_id, (*lines, span))
        elif line != REMOVED:
            placed.put(task_id, (span,))
        else:
            placed.pop(task_id)
    return placed


class _Places:
    """Where each task's lines are in a file (`Lines`): the whole line of each task in
    one array, by the task's slot in a list of ids, and the lines of the few with patches
    after it (the bundle) apart. An index is read into it and written from it as it is,
    with no Python object made per task (15,000 at 10,000 units)."""

    def __init__(self, ids: list[str] | None = None, bounds: array[int] | None = None) -> None:
        self.ids = [] if ids is None else ids  # by slot
        self.bounds = array("q") if bounds is None else bounds  # (start, end) per slot
        self.slots = dict(zip(self.ids, range(len(self.ids)), strict=True))
        self.patched: dict[str, Lines] = {}  # every line of the tasks with patches
        self.removed = 0  # slots of tasks no longer placed: their bounds are (-1, -1)

    @classmethod
    def of(cls, lines: dict[str, Lines]) -> _Places:
        first_lines = map(itemgetter(0), lines.values())
        places = cls(list(lines), array("q", chain.from_iterable(first_lines)))
        places.patched = {task_id: spans for task_id, spans in lines.items() if len(spans) > 1}
        return places

    def copy(self) -> _Places:
        places = _Places.__new__(_Places)
        places.ids, places.bounds = list(self.ids), array("q", self.bounds)
        places.slots, places.patched = dict(self.slots), dict(self.patched)
        places.removed = self.removed
        return places

    def get(self, task_id: str) -> Lines | None:
        lines = self.patched.get(task_id)
        slot = self.slots.get(task_id)
        if lines is not None or slot is None or self.bounds[2 * slot] < 0:
            return lines
        return ((self.bounds[2 * slot], self.bounds[2 * slot + 1]),)

    def __contains__(self, task_id: str) -> bool:
        return self.get(task_id) is not None

    def put(self, task_id: str, lines: Lines) -> None:
        slot = self.slots.get(task_id)
        if slot is None:
            slot = self.slots[task_id] = len(self.ids)
            self.ids.append(task_id)
            self.bounds.extend((-1, -1))
            self.removed += 1
        if self.bounds[2 * slot] < 0:
            self.removed -= 1
        self.bounds[2 * slot : 2 * slot + 2] = array("q", lines[0])
        if len(lines) > 1:
            self.patched[task_id] = lines
        else:
            self.patched.pop(task_id, None)

    def pop(self, task_id: str) -> bool:
        """Forget where the task's lines are; whether that was known."""
        slot = self.slots.get(task_id)
        self.patched.pop(task_id, None)
        if slot is None or self.bounds[2 * slot] < 0:
            return False
        self.bounds[2 * slot] = self.bounds[2 * slot + 1] = -1
        self.removed += 1
        return True

    def items(self) -> list[tuple[str, Lines]]:
        """Every task placed and its lines, in the order of the slots."""
        return [(task_id, lines) for task_id in self.ids if (lines := self.get(task_id))]

    def characters(self) -> int:
        """The lines' lengths summed (a removed slot's bounds count none)."""
        bounds = self.bounds
        patches = (end - start for lines in self.patched.values() for start, end in lines[1:])
        return sum(bounds[1::2]) - sum(bounds[::2]) + sum(patches)

    def first_lines(self) -> tuple[list[str], array[int]]:
        """The tasks placed and the bounds of their whole lines, in the order of the slots."""
        if not self.removed:
            return self.ids, self.bounds
        placed = list(map((0).__le__, self.bounds[::2]))
        pairs = compress(zip(self.bounds[::2], self.bounds[1::2], strict=True), placed)
        return list(compress(self.ids, placed)), array("q", chain.from_iterable(pairs))


def _task_id(key: str) -> str | None:
    try:
        task_id = json.loads(key)
    except (ValueError, RecursionError):
        return None
    return task_id if isinstance(task_id, str) else None


def _append(name: str, lines: str, identity: tuple[int, int] | None) -> os.stat_result | None:
    """Add whole lines at the end of the file, durably (as the rewrite is), if it is still
    the one of `identity` (inode, size); its stat after, or None (nothing written)."""
    with open(name, "ab") as handle:
        info = os.fstat(handle.fileno())
        if (info.st_ino, info.st_size) != identity:
            return None
        handle.write(lines.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())
        return os.fstat(handle.fileno())
