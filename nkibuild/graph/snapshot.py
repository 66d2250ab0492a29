"""The task graph of a build as data (`build/state/graph.json`), and doit's tasks made from it.

A build resolves its project (manifest, plan, settings, toolchain) into doit task dicts.
This module writes those dicts as data, every field doit reads but the actions (each
`uptodate` check as its parameters), together with what they were made from. The next
build compares that: the command line, the environment, nkibuild's own code, the
manifest's bytes, the stats of the files it names, what its `deps` patterns match and
the toolchain resolved again (the compiler's `--version` is asked as in every build).
When all of it matches, doit gets the same tasks without the manifest, the plan or any
stage being loaded: a build with nothing to do costs little more than doit's own check.
A task that runs loads the project as any build does and runs its stage's own actions.

Every build runs doit on tasks made from a snapshot, the one it just wrote or the one
it found, so there is one way tasks reach doit.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doit.exceptions import BaseFail, TaskFailed

import nkibuild
from nkibuild.errors import NkibuildError, storage_error
from nkibuild.fsutil import atomic_write_text, stamp_ctime_ns, stamp_of, stat_stamp

if TYPE_CHECKING:
    from nkibuild.context import BuildContext
    from nkibuild.toolchain import Toolchain, VersionMemo

SNAPSHOT_FILE = "graph.json"  # in the build's state dir
FORMAT = 3
MAX_SNAPSHOT_BYTES = 1 << 28
# Read by the settings, the toolchain, the workers' environment or the wheel's timestamps.
ENV_PREFIXES = ("NKIBUILD_", "NEURON_", "XDG_")
ENV_NAMES = ("SOURCE_DATE_EPOCH", "PATH", "VIRTUAL_ENV", "PYTHONPATH", "HOME")
PASS_ENV = "NKIBUILD_PASS_ENV"
RECENT_NS = 20_000_000  # file times lag the clock by up to a tick


@dataclass(frozen=True)
class GraphRequest:
    """What a build was asked for: `options`, the command line's build options as text
    (part of the snapshot's key); `load` resolves the project the slow way."""

    manifest: Path
    state_dir: Path
    options: Mapping[str, str]
    load: Callable[[], BuildContext]
    # The session's `--version` answers: the project's load, if a task runs, asks no more.
    versions: VersionMemo


@dataclass(frozen=True)
class Graph:
    """doit's tasks for one build and what running them needs from the settings."""

    tasks: list[dict[str, Any]]
    toolchain: Toolchain
    toolchain_setting: str
    max_compile_memory: int | None


class Stages:
    """The real actions of a build's tasks, from the project loaded when the first task
    runs (or given, when the build loaded it already)."""

    def __init__(
        self, load: Callable[[], BuildContext], snapshot: dict[str, Any], path: Path | None = None
    ) -> None:
        self._load = load
        self._path = path  # the snapshot's file, forgotten if it proves stale
        self._snapshot = {task_name(task): task for task in snapshot["tasks"]}
        self._makers: dict[str, Callable[[], dict[str, Any]]] | None = None
        self._guard = threading.Lock()

    def run(self, name: str) -> Any:
        """doit action of task `name`: its real actions in order; their values merged."""
        try:
            task = self._real(name)
        except NkibuildError as error:
            return TaskFailed(error.render())
        except OSError as error:  # the project could not be read (as `tasks._guarded`)
            refused = storage_error(error)
            if refused is None:
                raise
            return TaskFailed(refused.render())
        values: dict[str, Any] = {}
        for action in task["actions"]:
            function, args = action if isinstance(action, tuple) else (action, ())
            result = function(*args)
            if isinstance(result, BaseFail):
                return result
            values.update(result or {})
        return values

    def _real(self, name: str) -> dict[str, Any]:
        from nkibuild.graph.tasks import task_makers

        with self._guard:  # doit's threads (-j N) ask at once
            if self._makers is None:
                self._makers = task_makers(self._load())
        make = self._makers.get(name)
        task = None if make is None else make()
        # As read back from JSON (a tuple is a list there).
        if task is None or json.loads(json.dumps(_encoded(task))) != self._snapshot[name]:
            if self._path is not None:  # the next build loads the project
                self._path.unlink(missing_ok=True)
            raise NkibuildError(f"the project changed while {name} was checked; build again")
        return task


def task_name(task: Mapping[str, Any]) -> str:
    """The name doit gives a task dict."""
    return f"{task['basename']}:{task['name']}" if "name" in task else task["basename"]


def prepared(request: GraphRequest) -> Graph:
    """The build's graph from its snapshot when everything it was made from still
    holds, else from the project, loaded (and the snapshot written anew)."""
    inputs = _inputs(request)
    path = request.state_dir / SNAPSHOT_FILE
    snapshot = _read(path)
    if snapshot is not None and snapshot.get("inputs") == inputs:
        try:
            graph = _still_valid(snapshot, request, path)
        except (KeyError, TypeError, ValueError, AttributeError):  # damaged, or not ours
            graph = None
        if graph is not None:
            return graph
    started = time.time_ns()
    return of_context(request.load(), inputs, started)


def _still_valid(snapshot: dict[str, Any], request: GraphRequest, path: Path) -> Graph | None:
    """The snapshot's graph if the files, toolchain and frontends it was made from hold."""
    from nkibuild.toolchain import resolve_toolchain

    if not _files_hold(snapshot):
        return None
    settings = snapshot["settings"]
    try:
        compiler = _path(settings["compiler"])
        toolchain = resolve_toolchain(settings["toolchain"], compiler, request.versions)
    except NkibuildError:
        return None  # the slow way reports it
    if _toolchain_json(toolchain) != snapshot["toolchain"]:
        return None
    if _frontend_versions(snapshot) != snapshot["frontend_versions"]:
        return None
    stages = Stages(request.load, snapshot, path)
    return _graph(snapshot, toolchain, stages)


def of_context(
    context: BuildContext, inputs: dict[str, Any] | None = None, started: int | None = None
) -> Graph:
    """The graph of a loaded project; its snapshot written when `inputs` (what the
    request was before the project loaded, at `started`) says what it was made from."""
    from nkibuild.graph.tasks import task_dicts

    globs = _glob_results(context.manifest.root, _patterns(context))  # before the tasks glob
    dicts = task_dicts(context)
    snapshot = _snapshot(context, dicts, inputs or {}, globs)
    if inputs is not None and started is not None and _settled(snapshot, started):
        _write(context.layout.state_dir / SNAPSHOT_FILE, snapshot)
    return _graph(snapshot, context.toolchain, Stages(lambda: context, snapshot))


def _graph(snapshot: dict[str, Any], toolchain: Toolchain, stages: Stages) -> Graph:
    from nkibuild.graph.intact import decoded_check

    tasks = [
        {
            **{key: value for key, value in task.items() if key != "uptodate"},
            # doit keeps a task's last action's dict as its `result:` too: a last action
            # returning nothing keeps the values (the outputs records) once in its state.
            "actions": [(stages.run, (task_name(task),)), _values_kept_once],
            "uptodate": [decoded_check(check) for check in task["uptodate"]],
            "clean": True,
        }
        for task in snapshot["tasks"]
    ]
    settings = snapshot["settings"]
    return Graph(tasks, toolchain, settings["toolchain"], settings["max_compile_memory"])


def _values_kept_once() -> None:
    """doit action: nothing (see `_graph`)."""


def _encoded(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task dict as data: every field doit reads but the actions."""
    from nkibuild.graph.intact import encoded_check

    kept = {key: task[key] for key in ("basename", "name", "doc") if key in task}
    return {
        **kept,
        "file_dep": list(task.get("file_dep", ())),
        "targets": list(task.get("targets", ())),
        "uptodate": [encoded_check(check) for check in task.get("uptodate", ())],
    }


def _snapshot(
    context: BuildContext,
    dicts: Sequence[Mapping[str, Any]],
    inputs: dict[str, Any],
    globs: dict[str, list[str]],
) -> dict[str, Any]:
    manifest, settings = context.manifest, context.settings
    # As the next build reads it back (a tuple is a list in JSON).
    return json.loads(
        json.dumps(
            {
                "format": FORMAT,
                "inputs": inputs,
                "root": str(manifest.root),
                "named": _named_stamps(
                    manifest.root, _named_files(context), _parsed_files(context)
                ),
                "globs": globs,
                "toolchain": _toolchain_json(context.toolchain),
                # Of the frontends that have packages (hlo has none).
                "frontend_versions": {
                    f: v for f, v in sorted(context.frontend_versions.items()) if v
                },
                "settings": {
                    "toolchain": settings.toolchain,
                    "compiler": None if settings.compiler is None else str(settings.compiler),
                    "max_compile_memory": settings.max_compile_memory,
                },
                "tasks": [_encoded(task) for task in dicts],
            }
        )
    )


def _settled(snapshot: dict[str, Any], started: int) -> bool:
    """Whether the snapshot may be kept: made without `verify` (whose inputs it does not
    follow) from named files none of which changed since the project began loading (a
    file saved within a clock tick of its stat would go unseen next time)."""
    stamps = snapshot["named"]
    if stamps is None or any(task["basename"] == "verify" for task in snapshot["tasks"]):
        return False
    return all(
        stamp_ctime_ns(stamp) < started - RECENT_NS for stamp, parsed in stamps.values() if parsed
    )


def _inputs(request: GraphRequest) -> dict[str, Any]:
    """What a build's graph is made from besides the project's named files: nkibuild's
    code, the interpreter, the environment, the command line and the manifest's bytes."""
    from nkibuild.confine import MAX_PROJECT_FILE_BYTES, read_regular

    names = {n.strip() for n in os.environ.get(PASS_ENV, "").split(",") if n.strip()}
    environment = {
        name: value
        for name, value in os.environ.items()
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES or name in names
    }
    manifest = request.manifest.absolute()
    try:
        import hashlib

        manifest_sha = hashlib.sha256(read_regular(manifest, MAX_PROJECT_FILE_BYTES)).hexdigest()
    except OSError:
        manifest_sha = None
    return {
        "nkibuild": [nkibuild.__version__, nkibuild.code_digest()],
        "python": sys.executable,  # what is installed for it: the toolchain, resolved again
        "environment": dict(sorted(environment.items())),
        "options": dict(request.options),
        "manifest": [str(manifest), manifest_sha],
        "cwd": os.getcwd(),
    }


def _parsed_files(context: BuildContext) -> set[str]:
    from nkibuild.manifest.semantic import python_functions

    return set(python_functions(context.manifest))


def _named_files(context: BuildContext) -> list[str]:
    refs = (ref for kernel in context.manifest.kernels for ref in (kernel.source, kernel.reference))
    return sorted({ref.path for ref in refs if ref})


def _named_stamps(
    root: Path, files: Sequence[str], parsed: Set[str]
) -> dict[str, tuple[str, bool]] | None:
    """Each named file's stamp and whether validation parses it (a Python file, for the
    functions the manifest names), or None if one is no longer a regular file in the
    project: the plan cache's rule, whose refusal the slow way reports."""
    from nkibuild.confine import confined_stats

    stats = confined_stats([root / name for name in files], (root,))
    if stats is None:
        return None
    return {name: (stamp_of(info), name in parsed) for name, info in zip(files, stats, strict=True)}


def _patterns(context: BuildContext) -> list[str]:
    return sorted({pattern for kernel in context.manifest.kernels for pattern in kernel.deps})


def _glob_results(root: Path, patterns: Sequence[str]) -> dict[str, list[str]]:
    from nkibuild.confine import glob_files

    return {pattern: sorted(map(str, glob_files(root, pattern))) for pattern in patterns}


def _files_hold(snapshot: dict[str, Any]) -> bool:
    """Whether the named files and `deps` matches are as the graph was made from. A file
    whose stamp is unchanged is the one checked then (one replaced, or reached through a
    directory swapped for a symlink, has another inode or ctime); a changed one must
    still be a regular file in the project, and a parsed one reloads the project (its
    content is validation's; another's is its tasks' `file_dep`)."""
    from nkibuild.confine import file_problem

    root = Path(snapshot["root"])
    for name, (stamp, parsed) in snapshot["named"].items():
        path = root / name
        if stat_stamp(path) != stamp and (parsed or file_problem(path, (root,)) is not None):
            return False
    return _glob_results(root, list(snapshot["globs"])) == snapshot["globs"]


def _toolchain_json(toolchain: Toolchain) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(toolchain)))


def _frontend_versions(snapshot: dict[str, Any]) -> dict[str, Any]:
    if not snapshot["frontend_versions"]:
        return {}
    from nkibuild.frontends import frontend_versions

    return {frontend: frontend_versions(frontend) for frontend in snapshot["frontend_versions"]}


def _path(text: str | None) -> Path | None:
    return None if text is None else Path(text)


def _read(path: Path) -> dict[str, Any] | None:
    """The snapshot at `path`; None if there is none or it is not one of this format."""
    from nkibuild.confine import read_regular

    try:
        snapshot = json.loads(read_regular(path, MAX_SNAPSHOT_BYTES, follow=False))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(snapshot, dict) or snapshot.get("format") != FORMAT:
        return None
    return snapshot


def _write(path: Path, snapshot: dict[str, Any]) -> None:
    """A hint, not a result: one that cannot be written (or is lost) means a slower build."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(snapshot), durable=False)
    except OSError:
        pass
