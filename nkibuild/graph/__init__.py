"""Graph stage: a build context -> doit task dicts (extract, compile, bundle, wheel)."""

from __future__ import annotations

from typing import Any

__all__ = ["doit_tasks", "task_dicts"]


def __getattr__(name: str) -> Any:
    # Imported on first use: doit loads nkibuild's state backend (graph.state) as a
    # plugin in every doit process, also for dodo.py files that never use nkibuild.
    if name in __all__:
        from nkibuild.graph import tasks

        return getattr(tasks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
