"""doit TaskLoader2 for nkibuild projects: the same tasks for the CLI and for `doit` itself.

As a doit plugin (pyproject.toml):
    [tool.doit.plugins.loader]
    nkibuild = "nkibuild.graph.loader:NkibuildLoader"
    [tool.doit]
    loader = "nkibuild"
then `doit list`, `doit`, `doit compile:*` work in the project directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from doit.cmd_base import DoitCmdBase, TaskLoader2
from doit.cmd_list import List
from doit.cmd_run import Run
from doit.doit_cmd import DoitMain
from doit.exceptions import InvalidCommand, InvalidDodoFile
from doit.globals import Globals
from doit.loader import generate_tasks
from doit.plugin import PluginDict
from doit.task import Task

from nkibuild.context import BuildContext
from nkibuild.errors import NkibuildError
from nkibuild.graph.state import BACKEND_NAME, DEP_FILE, AtomicJsonDB
from nkibuild.graph.tasks import task_dicts

__all__ = ["DEP_FILE", "NkibuildLoader", "doit_config", "doit_main", "to_tasks"]
DEFAULT_TASKS = ["wheel"]


def doit_config(context: BuildContext) -> dict[str, Any]:
    return {
        "dep_file": str(context.layout.state_dir / DEP_FILE),
        "backend": BACKEND_NAME,
        "default_tasks": DEFAULT_TASKS,
    }


# nkibuild's actions print nothing (user code and compilers write to logs), so doit need
# not capture their output. Capturing would swap the process's sys.stdout/sys.stderr
# around every action, which under -j N interleaves between threads and between two
# builds running in one process, and can leave a capture object installed.
UNCAPTURED: dict[str, Any] = {"io": {"capture": False}, "verbosity": 0}


def to_tasks(dicts: list[dict[str, Any]], command_names: list[str]) -> list[Task]:
    tasks = generate_tasks("nkibuild", ({**UNCAPTURED, **d} for d in dicts))
    clash = {task.name for task in tasks} & set(command_names)
    if clash:
        raise InvalidCommand(f"task names clash with doit commands: {', '.join(sorted(clash))}")
    return list(tasks)


class NkibuildLoader(TaskLoader2):
    """Loads nkibuild.yaml from the current dir (or --manifest), or takes a ready context."""

    cmd_options = (
        {"name": "nkibuild_manifest", "long": "manifest", "type": str, "default": "nkibuild.yaml",
         "help": "nkibuild manifest [default: %(default)s]"},
        {"name": "nkibuild_toolchain", "long": "toolchain", "type": str,
         "default": os.environ.get("NKIBUILD_TOOLCHAIN", "auto"),
         "help": "auto | neuron | fake [default: %(default)s, env NKIBUILD_TOOLCHAIN]"},
    )  # fmt: skip

    def __init__(
        self,
        context: BuildContext | None = None,
        extra_config: dict[str, Any] | None = None,
        tasks: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__()
        self.context = context
        self.extra_config = extra_config or {}
        self.tasks = tasks  # task dicts the caller already built from `context`

    def setup(self, opt_values: dict[str, Any]) -> None:
        if self.context is not None or self.tasks is not None:
            return
        from nkibuild.context import load_context
        from nkibuild.settings import BuildOptions

        try:
            self.context = load_context(
                Path(opt_values.get("nkibuild_manifest", "nkibuild.yaml")),
                Path("build"),
                Path("dist"),
                BuildOptions(toolchain=opt_values.get("nkibuild_toolchain", "auto")),
            )
        except NkibuildError as error:
            # doit prints a loader's InvalidDodoFile as a plain error, not a traceback.
            raise InvalidDodoFile(error.render()) from None

    def load_doit_config(self) -> dict[str, Any]:
        base = doit_config(self.context) if self.context is not None else {}
        return {**base, **self.extra_config}

    def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Task]:
        if self.tasks is not None:
            return to_tasks(self.tasks, self.cmd_names)
        assert self.context is not None
        return to_tasks(task_dicts(self.context), self.cmd_names)


# doit finds its plugins (commands, state backends, reporters) among the entry points of
# every installed package: three scans of their metadata per run, ~0.012 s, paid by
# every build that hands doit a task. nkibuild's own runs need none of them: its backend
# is named in doit_config (and is nkibuild's), its reporter is handed over as an object,
# and it runs doit's `run` and `list`. These commands take those as known. A user's
# dodo.py run by plain doit still finds the backend through nkibuild's entry point
# (pyproject.toml, `doit.BACKEND`).
class _KnownBackend(DoitCmdBase):
    def execute(self, params: Any, args: Any) -> Any:
        try:
            return super().execute(params, args)
        finally:
            # doit keeps its last dependency manager in a class attribute, for the
            # tasks of its run: after the run, it would keep the saved state it decoded
            # (the bundle's 10,000 file_dep states) alive until the process ends.
            if Globals.dep_manager is self.dep_manager:
                Globals.dep_manager = None

    def get_backends(self) -> dict[str, Any]:
        backends = {BACKEND_NAME: AtomicJsonDB}
        if "backend" in self.cmdparser:  # as doit: the choices `help` lists
            self.cmdparser["backend"].choices = {BACKEND_NAME: AtomicJsonDB.desc}
        return backends


class _Run(_KnownBackend, Run):
    name = Run.get_name()

    def get_reporters(self) -> dict[str, Any]:
        return {}  # run_task_graph hands doit its reporter as an object, never by name


class _List(_KnownBackend, List):
    name = List.get_name()


class _Main(DoitMain):
    def get_cmds(self) -> PluginDict:
        commands = PluginDict()
        for command in (_Run, _List):
            commands[command.get_name()] = command
        return commands


def doit_main(loader: NkibuildLoader) -> DoitMain:
    """doit's command line for nkibuild's runs of `loader`'s tasks (`run` and `list`,
    with nkibuild's state backend and a reporter object): no plugin is looked up, and no
    configuration file read (the loader's config is the whole of it)."""
    return _Main(loader, config_filenames=())
