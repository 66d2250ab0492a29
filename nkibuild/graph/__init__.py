"""Graph stage: resolved build units -> doit tasks (extract, compile, bundle, wheel)."""

from nkibuild.graph.tasks import BuildContext, Layout, doit_tasks, task_dicts

__all__ = ["BuildContext", "Layout", "doit_tasks", "task_dicts"]
