"""doit state backend: one file, written atomically and only when something changed.

doit's own backends fall short here: `json` rewrites its file in place on every
run (a kill mid-write leaves a truncated file that fails every later run),
`dbm` is `dbm.dumb` on many hosts (slow, three files), and `sqlite3` pays a
query per key, which dominates a no-op build of thousands of tasks.

The file holds one line per task (its id and its entry, both JSON) after a header
line. Entries are decoded when doit first asks about their task and re-encoded only
when changed: after an edit the up-to-date proof (uptodate.py) hands doit a few tasks
of thousands, whose state is all this backend then decodes. A file of the earlier
layout (one JSON object) is still read.

An unreadable state file, or entry, is not fatal: it only means "nothing (or that
task) is known to be up to date", and the compile stage's own completion records
keep the resulting rerun cheap.
"""

from __future__ import annotations

import json
from typing import Any

from nkibuild.fsutil import atomic_write_text

BACKEND_NAME = "nkibuild-json"
DEP_FILE = "doit-state.json"  # in the build's state dir


HEADER = '{"format": "nkibuild-doit-state", "version": 2}'


class AtomicJsonDB:
    """Implements the backend interface doit's `Dependency` expects."""

    desc = "one line per task, decoded on use, atomic writes, rewritten only when changed"

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None) -> None:
        self.name = name
        self.codec = codec
        self._dirty = False
        self._encoded: dict[str, str] = {}  # task id -> its entry as saved (unchanged)
        self._db: dict[str, dict[str, Any]] = {}  # decoded entries
        self._load()

    def _load(self) -> None:
        try:
            with open(self.name, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            return
        except OSError:
            self._dirty = True  # replace the unreadable file at the end of this run
            return
        try:
            if text.startswith(HEADER + "\n"):
                self._encoded = _split(text)
            else:  # the earlier layout: one JSON object
                data = self.codec.decode(text)
                self._db = data if isinstance(data, dict) else {}
        except ValueError:
            self._dirty = True

    def _entry(self, task_id: str) -> dict[str, Any] | None:
        entry = self._db.get(task_id)
        if entry is None and task_id in self._encoded:
            try:
                entry = self.codec.decode(self._encoded[task_id])
            except ValueError:
                entry = None
            if not isinstance(entry, dict):  # damaged: forget this task only
                del self._encoded[task_id]
                self._dirty = True
                return None
            self._db[task_id] = entry
        return entry

    def dump(self) -> None:
        if self._dirty:
            from pathlib import Path

            try:
                atomic_write_text(Path(self.name), self._text())
            except OSError as error:
                # doit would print a traceback; the session's build reports it after doit
                # returns (doit constructs this object, so the session is found, not passed).
                from nkibuild.session import current_session

                session = current_session()
                if session is None:
                    raise
                session.state_failures.append(error)
                return
            self._dirty = False

    def _text(self) -> str:
        lines = [HEADER]
        for task_id, encoded in self._encoded.items():
            lines.append(f"{json.dumps(task_id)}\t{encoded}")
        for task_id, entry in self._db.items():
            if task_id not in self._encoded:
                lines.append(f"{json.dumps(task_id)}\t{self.codec.encode(entry)}")
        return "\n".join(lines) + "\n"

    def set(self, task_id: str, dependency: str, value: Any) -> None:
        entry = self._entry(task_id)
        if entry is None:
            entry = self._db[task_id] = {}
        entry[dependency] = value
        self._encoded.pop(task_id, None)  # saved re-encoded
        self._dirty = True

    def get(self, task_id: str, dependency: str) -> Any:
        entry = self._entry(task_id)
        return entry.get(dependency) if entry is not None else None

    def in_(self, task_id: str) -> bool:
        return task_id in self._db or task_id in self._encoded

    def remove(self, task_id: str) -> None:
        found = self._db.pop(task_id, None) is not None
        if self._encoded.pop(task_id, None) is not None or found:
            self._dirty = True

    def remove_all(self) -> None:
        self._db, self._encoded = {}, {}
        self._dirty = True


def _split(text: str) -> dict[str, str]:
    """The saved entries by task id, still encoded (ValueError: not this layout)."""
    encoded: dict[str, str] = {}
    for line in text.split("\n")[1:]:
        if line:
            key, tab, entry = line.partition("\t")  # JSON escapes tabs in strings
            if not tab:
                raise ValueError("a state line without a task id")
            task_id = json.loads(key)
            if not isinstance(task_id, str):
                raise ValueError("a task id that is not a string")
            encoded[task_id] = entry
    return encoded
