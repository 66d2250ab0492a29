"""doit TaskLoader2 for nkibuild projects: the same tasks for the CLI and for `doit` itself.

As a doit plugin (pyproject.toml):
    [tool.doit.plugins.loader]
    nkibuild = "nkibuild.graph.loader:NkibuildLoader"
    [tool.doit]
    loader = "nkibuild"
then `doit list`, `doit`, `doit compile:*` work in the project directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from doit.cmd_base import TaskLoader2
from doit.doit_cmd import DoitMain
from doit.exceptions import InvalidCommand, InvalidDodoFile
from doit.loader import generate_tasks
from doit.task import Task

from nkibuild.errors import NkibuildError
from nkibuild.graph.state import BACKEND_LOCATION, BACKEND_NAME, DEP_FILE

if TYPE_CHECKING:
    from nkibuild.context import BuildContext

__all__ = ["DEP_FILE", "NkibuildLoader", "doit_config", "doit_main", "to_tasks"]


def doit_config(state_dir: Path) -> dict[str, Any]:
    """doit's configuration for a build whose state is kept in `state_dir`."""
    return {
        "dep_file": str(state_dir / DEP_FILE),
        "backend": BACKEND_NAME,
        "default_tasks": ["wheel"],
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
    """Loads nkibuild.yaml from the current dir (or --manifest), or takes ready task dicts."""

    cmd_options = (
        {"name": "nkibuild_manifest", "long": "manifest", "type": str, "default": "nkibuild.yaml",
         "help": "nkibuild manifest [default: %(default)s]"},
        {"name": "nkibuild_toolchain", "long": "toolchain", "type": str, "default": None,
         "help": "auto | neuron | fake [default: env NKIBUILD_TOOLCHAIN, else the "
                 "manifest's compiler.toolchain, else auto]"},
    )  # fmt: skip

    def __init__(
        self, extra_config: dict[str, Any] | None = None, tasks: list[dict[str, Any]] | None = None
    ) -> None:
        super().__init__()
        self.context: BuildContext | None = None
        self.extra_config = extra_config or {}
        self.tasks = tasks

    def setup(self, opt_values: dict[str, Any]) -> None:
        if self.tasks is not None:
            return
        from nkibuild.context import load_context
        from nkibuild.settings import BuildOptions

        try:
            self.context = load_context(
                Path(opt_values.get("nkibuild_manifest", "nkibuild.yaml")),
                Path("build"),
                Path("dist"),
                BuildOptions(toolchain=opt_values.get("nkibuild_toolchain")),
            )
        except NkibuildError as error:
            # doit prints a loader's InvalidDodoFile as a plain error, not a traceback.
            raise InvalidDodoFile(error.render()) from None

    def load_doit_config(self) -> dict[str, Any]:
        base = doit_config(self.context.layout.state_dir) if self.context is not None else {}
        return {**base, **self.extra_config}

    def load_tasks(self, cmd: Any, pos_args: list[str]) -> list[Task]:
        if self.tasks is None:
            from nkibuild.graph.tasks import task_dicts

            assert self.context is not None
            self.tasks = task_dicts(self.context)
        return to_tasks(self.tasks, self.cmd_names)


def doit_main(loader: NkibuildLoader) -> DoitMain:
    """doit's command line for nkibuild's runs of `loader`'s tasks: nkibuild's state
    backend named as a doit plugin, and no configuration file read (the loader's config
    is the whole of it)."""
    plugins = {"BACKEND": {BACKEND_NAME: BACKEND_LOCATION}}
    return DoitMain(loader, config_filenames=(), extra_config=plugins)
