"""Graph stage: a build context -> doit task dicts (extract, compile, bundle, wheel)."""

from nkibuild.graph.tasks import doit_tasks, task_dicts

__all__ = ["doit_tasks", "task_dicts"]
