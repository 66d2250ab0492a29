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
temp file renamed over it. A file of the earlier layout (one JSON object) is still read.

A line cut short (a build killed while appending) is not fatal: an entry that does
not decode only means "that task is not known to be up to date", and an unterminated
last line is ignored, so the task's earlier entry (a true record of an earlier
successful run, which doit compares with the files as they are now) stands. Either
makes the next write a whole rewrite. The compile stage's own completion records keep
any resulting rerun cheap.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nkibuild.fsutil import atomic_write_text

BACKEND_NAME = "nkibuild-json"
DEP_FILE = "doit-state.json"  # in the build's state dir


# Version 2 files are read the same way by every nkibuild that writes them: later lines
# win, and a `null` entry is not an entry.
HEADER = '{"format": "nkibuild-doit-state", "version": 2}'
REMOVED = "null"
# doit saves a task's values and the result of its last action, which for nkibuild's
# tasks are the same dict (the outputs record: the bundle's lists 15,000 files at 10,000
# units); it is written once, with this key saying so. doit's own keys end in ":" and
# the others are absolute paths, so the name cannot be a task's.
VALUES, RESULT, RESULT_IS_VALUES = "_values_:", "result:", "result:is:_values_:"
# Appending stops paying once superseded lines outweigh the live ones this much.
COMPACT_RATIO = 2


class AtomicJsonDB:
    """Implements the backend interface doit's `Dependency` expects."""

    desc = "an append-only log of per-task entries, decoded on use, compacted atomically"

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None) -> None:
        self.name = name
        self.codec = codec
        # Entries as saved and unchanged: task id -> where its entry is in the file's text
        # (kept whole; slicing 15,000 entries out of tens of MB costs more than reading it).
        self._text_read = ""
        self._encoded: dict[str, tuple[int, int]] = {}
        self._db: dict[str, dict[str, Any]] = {}  # decoded entries
        self._changed: set[str] = set()  # task ids set or removed since the file was read
        self._file_chars = 0  # the file as read, superseded lines included
        # (inode, size) of the file as read or last written: appending to another (a
        # `clean` meanwhile) would make a file without its header.
        self._identity: tuple[int, int] | None = None
        self._rewrite = False  # the file must be written whole (damaged, earlier layout)
        self._load()

    def _load(self) -> None:
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
        if text.startswith(HEADER + "\n"):
            self._text_read = text
            self._encoded, intact = _entries(text)
            self._rewrite = not intact
            return
        try:  # the earlier layout: one JSON object
            data = self.codec.decode(text)
        except (ValueError, RecursionError):
            data = None
        entries = data.items() if isinstance(data, dict) else ()
        self._db = {task_id: entry for task_id, entry in entries if isinstance(entry, dict)}
        self._rewrite = True

    def _entry(self, task_id: str) -> dict[str, Any] | None:
        entry = self._db.get(task_id)
        if entry is None and task_id in self._encoded:
            try:
                entry = self.codec.decode(self._saved(task_id))
            except (ValueError, RecursionError):
                entry = None
            if not isinstance(entry, dict):  # damaged: forget this task only
                del self._encoded[task_id]
                self._rewrite = True
                return None
            if entry.pop(RESULT_IS_VALUES, None) is not None and VALUES in entry:
                entry[RESULT] = entry[VALUES]
            self._db[task_id] = entry
        return entry

    def _encode(self, entry: dict[str, Any]) -> str:
        if RESULT in entry and entry[RESULT] == entry.get(VALUES):
            entry = {**entry, RESULT_IS_VALUES: True}
            del entry[RESULT]
        return self.codec.encode(entry)

    def dump(self) -> None:
        if not (self._changed or self._rewrite):
            return
        changes = {task_id: self._encoded_change(task_id) for task_id in sorted(self._changed)}
        appended = "".join(f"{json.dumps(task_id)}\t{line}\n" for task_id, line in changes.items())
        try:
            if self._rewrite or not self._file_chars or self._outweighs(appended):
                self._write_whole(changes)
            elif (identity := _append(self.name, appended, self._identity)) is not None:
                self._file_chars += len(appended)
                self._identity = identity
            else:  # not the file that was read
                self._write_whole(changes)
        except OSError as error:
            # doit would print a traceback; the session's build reports it after doit
            # returns (doit constructs this object, so the session is found, not passed).
            from nkibuild.session import current_session

            session = current_session()
            if session is None:
                raise
            session.state_failures.append(error)
            return
        self._changed.clear()
        self._rewrite = False

    def _write_whole(self, changes: dict[str, str]) -> None:
        text = self._text(changes)
        atomic_write_text(Path(self.name), text)
        info = os.stat(self.name)
        self._file_chars, self._identity = len(text), (info.st_ino, info.st_size)

    def _encoded_change(self, task_id: str) -> str:
        """The line's entry for a task this run set, or the removal of one it removed."""
        entry = self._db.get(task_id)
        return REMOVED if entry is None else self._encode(entry)

    def _outweighs(self, appended: str) -> bool:
        live = sum(end - start for start, end in self._encoded.values()) + len(appended)
        return self._file_chars + len(appended) > COMPACT_RATIO * live + len(HEADER)

    def _text(self, changes: dict[str, str]) -> str:
        """The whole file: every task's latest entry, once."""
        lines = [HEADER]
        for task_id in self._encoded:
            lines.append(f"{json.dumps(task_id)}\t{self._saved(task_id)}")
        for task_id, entry in self._db.items():
            if task_id not in self._encoded:
                encoded = changes.get(task_id) or self._encode(entry)
                lines.append(f"{json.dumps(task_id)}\t{encoded}")
        return "\n".join(lines) + "\n"

    def _saved(self, task_id: str) -> str:
        start, end = self._encoded[task_id]
        return self._text_read[start:end]

    def set(self, task_id: str, dependency: str, value: Any) -> None:
        entry = self._entry(task_id)
        if entry is None:
            entry = self._db[task_id] = {}
        entry[dependency] = value
        self._encoded.pop(task_id, None)  # saved re-encoded
        self._changed.add(task_id)

    def get(self, task_id: str, dependency: str) -> Any:
        entry = self._entry(task_id)
        return entry.get(dependency) if entry is not None else None

    def in_(self, task_id: str) -> bool:
        return task_id in self._db or task_id in self._encoded

    def remove(self, task_id: str) -> None:
        found = self._db.pop(task_id, None) is not None
        if self._encoded.pop(task_id, None) is not None or found:
            self._changed.add(task_id)

    def remove_all(self) -> None:
        self._db, self._encoded = {}, {}
        self._rewrite = True


def _entries(text: str) -> tuple[dict[str, tuple[int, int]], bool]:
    """Where each task's saved entry is in `text` (the last line of each task winning),
    still encoded; and whether every line was whole (else the file is to be rewritten)."""
    keys: list[str] = []
    spans: list[tuple[int, int]] = []
    intact = True
    find = text.find
    start = len(HEADER) + 1
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
    encoded: dict[str, tuple[int, int]] = {}
    for task_id, span in zip(ids, spans, strict=True):
        if not isinstance(task_id, str):
            intact = False
            continue
        encoded.pop(task_id, None)  # the file's order of the latest lines
        start, end = span
        if not (end - start == len(REMOVED) and text.startswith(REMOVED, start)):
            encoded[task_id] = span
    return encoded, intact


def _task_id(key: str) -> str | None:
    try:
        task_id = json.loads(key)
    except (ValueError, RecursionError):
        return None
    return task_id if isinstance(task_id, str) else None


def _append(name: str, lines: str, identity: tuple[int, int] | None) -> tuple[int, int] | None:
    """Add whole lines at the end of the file, durably (as the rewrite is), if it is still
    the one of `identity` (inode, size); its identity after, or None (nothing written)."""
    with open(name, "ab") as handle:
        info = os.fstat(handle.fileno())
        if (info.st_ino, info.st_size) != identity:
            return None
        handle.write(lines.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())
        return info.st_ino, handle.tell()
