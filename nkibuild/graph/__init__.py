"""Graph stage: a build context -> doit task dicts (extract, compile, bundle, wheel)."""

from __future__ import annotations

from nkibuild.exports import lazy_exports

# Imported on first use: doit loads nkibuild's state backend (graph.state) as a plugin
# in every doit process, also for dodo.py files that never use nkibuild.
_HOMES = {"doit_tasks": "tasks", "task_dicts": "tasks"}
__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
