"""doit state backend: doit's JSON layout, written atomically.

doit's own `json` backend rewrites its file in place (a build killed mid-write leaves
a truncated file that fails every later run until it is deleted). This one keeps the
same layout, one JSON object of task id -> entry, and doit's backend interface (see
`doit.dependency.JsonDB`), with two differences:

- `dump` writes a temp file and renames it over the state file, and only when
  something changed (a no-op build writes nothing);
- a file that does not decode (damaged, or written by an older nkibuild) is read as
  no state: every task is asked again, and the compile stage's own records
  (`result.json`) keep that rerun cheap. doit would refuse to run until it is deleted.

A state file that cannot be saved (disk full) is reported by the build after doit
returns, not as doit's traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nkibuild.fsutil import atomic_write_text

BACKEND_NAME = "nkibuild-json"
BACKEND_LOCATION = "nkibuild.graph.state:AtomicJsonDB"  # as doit names plugins
DEP_FILE = "doit-state.json"  # in the build's state dir


class AtomicJsonDB:
    """doit backend: doit's JSON state, saved by an atomic rename when it changed."""

    desc = "doit's JSON layout, saved atomically (nkibuild)"

    def __init__(self, name: str, codec: Any, *, module_name: str | None = None) -> None:
        self.name = name
        self.codec = codec
        self.entries = self._read()
        self.changed = False

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.name, encoding="utf-8") as handle:
                data = self.codec.decode(handle.read())
        except (OSError, ValueError, RecursionError):  # missing, unreadable or damaged
            return {}
        if not isinstance(data, dict):
            return {}
        return {task: entry for task, entry in data.items() if isinstance(entry, dict)}

    def get(self, task_id: str, dependency: str) -> Any:
        return self.entries.get(task_id, {}).get(dependency)

    def set(self, task_id: str, dependency: str, value: Any) -> None:
        if isinstance(value, tuple):  # doit's file_dep list: compared as JSON reads it back
            value = list(value)
        entry = self.entries.setdefault(task_id, {})
        if dependency not in entry or entry[dependency] != value:
            entry[dependency] = value
            self.changed = True

    def in_(self, task_id: str) -> bool:
        return task_id in self.entries

    def remove(self, task_id: str) -> None:
        if self.entries.pop(task_id, None) is not None:
            self.changed = True

    def remove_all(self) -> None:
        self.entries = {}
        self.changed = True

    def dump(self) -> None:
        if not self.changed:
            return
        try:
            atomic_write_text(Path(self.name), self.codec.encode(self.entries))
        except OSError as error:
            # doit constructs this object, so the build's session is found, not passed.
            from nkibuild.session import current_session

            session = current_session()
            if session is None:
                raise
            session.state_failures.append(error)
            return
        self.changed = False
