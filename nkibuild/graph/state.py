"""doit state backend: one JSON file, written atomically and only when something changed.

doit's own backends fall short here: `json` rewrites its file in place on every
run (a kill mid-write leaves a truncated file that fails every later run),
`dbm` is `dbm.dumb` on many hosts (slow, three files), and `sqlite3` pays a
query per key, which dominates a no-op build of thousands of tasks.

An unreadable state file is not fatal: it only means "nothing is known to be
up to date", and the compile stage's own completion records keep the
resulting rerun cheap.
"""

from __future__ import annotations

from typing import Any

from nkibuild.fsutil import atomic_write_text

BACKEND_NAME = "nkibuild-json"


class AtomicJsonDB:
    """Implements the backend interface doit's `Dependency` expects."""

    desc = "JSON file, atomic writes, rewritten only when changed"

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None) -> None:
        self.name = name
        self.codec = codec
        self._dirty = False
        self._db: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.name, encoding="utf-8") as handle:
                data = self.codec.decode(handle.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            self._dirty = True  # replace the unreadable file at the end of this run
            return {}
        return data if isinstance(data, dict) else {}

    def dump(self) -> None:
        if self._dirty:
            from pathlib import Path

            try:
                atomic_write_text(Path(self.name), self.codec.encode(self._db))
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

    def set(self, task_id: str, dependency: str, value: Any) -> None:
        self._db.setdefault(task_id, {})[dependency] = value
        self._dirty = True

    def get(self, task_id: str, dependency: str) -> Any:
        entry = self._db.get(task_id)
        return entry.get(dependency) if entry is not None else None

    def in_(self, task_id: str) -> bool:
        return task_id in self._db

    def remove(self, task_id: str) -> None:
        if self._db.pop(task_id, None) is not None:
            self._dirty = True

    def remove_all(self) -> None:
        self._db = {}
        self._dirty = True
