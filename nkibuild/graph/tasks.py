"""Build units -> doit task dicts, following doit's own task-dict conventions.

Every path is absolute and normalised once here, because doit links a
`file_dep` to the task whose `targets` produce it by exact string.
Each setting that changes a task's output enters that task's `uptodate`
through `config_changed`, so an edit reruns exactly the tasks it affects.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import nkibuild
from nkibuild import __version__, bundle
from nkibuild.bundle import wheel
from nkibuild.bundle.provenance import material_files
from nkibuild.compiler.record import COMPILE_OUTPUTS, NEFF_FILE, RESULT_FILE
from nkibuild.context import BuildContext
from nkibuild.errors import NkibuildError, storage_error
from nkibuild.frontends import ARTIFACT_FILES, SIDECAR_DIR
from nkibuild.graph.intact import (
    ConfigChanged,
    OutputsIntact,
    inputs_checked,
    outputs_checked,
    outputs_record,
)
from nkibuild.plan import BuildUnit, ExtractSpec, extract_specs
from nkibuild.settings import BuildOptions
from nkibuild.toolchain.worker_pool import user_variables

BUNDLE_TASK = "bundle"
EXTRACT_TASK = "extract"  # the basename of every extraction's task
COMPILE_TASK = "compile"
VERIFY_TASK = "verify"
WHEEL_TASK = "wheel"


def task_dicts(context: BuildContext) -> list[dict[str, Any]]:
    """All tasks of a build as doit task dicts (each with `basename` and, for subtasks, `name`)."""
    return [make() for make in task_makers(context).values()]


def task_makers(context: BuildContext) -> dict[str, Callable[[], dict[str, Any]]]:
    """What makes each task of the build, by the name doit gives it, in the graph's
    order: a task that runs after an edit makes its own dict, not the graph's 1,500."""
    makers: dict[str, Callable[[], dict[str, Any]]] = {
        f"{EXTRACT_TASK}:{spec.name}": functools.partial(_extract_task, context, spec)
        for spec in extract_specs(context.units)
    }
    for unit in context.units:
        makers[f"{COMPILE_TASK}:{unit.name}"] = functools.partial(_compile_task, context, unit)
    makers[BUNDLE_TASK] = functools.partial(_bundle_task, context)
    if context.manifest.verify:  # opt-in; a failed verify withholds the wheel
        makers[VERIFY_TASK] = functools.partial(_verify_task, context)
    makers[WHEEL_TASK] = functools.partial(_wheel_task, context)
    return makers


def _verify_task(context: BuildContext) -> dict[str, Any]:
    from nkibuild.verify.task import source_files, verify_task  # not for other builds

    return _inputs_as_read(verify_task(context), source_files(context.manifest))


def _inputs_as_read(task: dict[str, Any], inputs: Sequence[str]) -> dict[str, Any]:
    """`task` (one action) checking the project files it reads as extraction and the
    bundle do: a file saved while it runs means run again, never passed as it was."""
    [(action, args)] = task["actions"]
    run, as_read = inputs_checked(action, args, inputs, task["basename"])
    return {**task, "actions": [run], "uptodate": [*task["uptodate"], as_read]}


def doit_tasks(
    manifest: str | os.PathLike = "nkibuild.yaml",
    *,
    toolchain: str | None = None,
    build_dir: str | os.PathLike = "build",
    dist_dir: str | os.PathLike = "dist",
) -> Iterator[dict[str, Any]]:
    """For a user's dodo.py: `def task_nkibuild(): yield from doit_tasks("nkibuild.yaml")`.

    Yields the same tasks the `nkibuild` CLI runs (extract:*, compile:*, bundle, wheel).
    """
    from nkibuild.context import load_context

    options = BuildOptions(toolchain=toolchain)
    context = load_context(Path(manifest), Path(build_dir), Path(dist_dir), options)
    yield from task_dicts(context)


def _guarded(action: Callable[..., Any]) -> Callable[..., Any]:
    """Report nkibuild's own errors, and files the machine refused (disk full, read-only),
    as clean task failures; let real bugs keep their traceback."""

    @functools.wraps(action)
    def run(*args: Any, **kwargs: Any) -> Any:
        from doit.exceptions import TaskFailed

        try:
            return action(*args, **kwargs)
        except NkibuildError as error:
            return TaskFailed(error.render())
        except OSError as error:
            refused = storage_error(error)
            if refused is None:
                raise
            return TaskFailed(refused.render())

    return run


def extract_config(context: BuildContext, spec: ExtractSpec) -> dict[str, Any]:
    """Everything besides files that decides an extraction's output (its doit `uptodate`)."""
    from nkibuild.frontends import frontend_versions

    # Kept in the context: the graph snapshot records the versions the build used.
    versions = context.frontend_versions
    if spec.frontend not in versions:
        versions[spec.frontend] = frontend_versions(spec.frontend)
    # Source positions are left out on purpose: moving a kernel within the
    # manifest must not re-extract it.
    return {
        "frontend": spec.frontend,
        "source": str(spec.source),
        "inputs": [t.to_json() for t in spec.inputs],
        "constants": [[name, value] for name, value in spec.constants],
        "target": spec.target,
        "lnc": spec.lnc,
        "versions": versions[spec.frontend],
        "toolchain": context.toolchain.name,  # the double's frontends trace differently
        "passed_env": user_variables(),
        "nkibuild": __version__,
    }


def extract_files(context: BuildContext, spec: ExtractSpec) -> list[str]:
    """The files an extraction reads (its doit `file_dep`), as absolute paths."""
    root = context.manifest.root
    return [os.path.abspath(root / spec.source.path), *expand_deps(root, spec.deps)]


def expand_deps(root: Path, patterns: Sequence[str]) -> list[str]:
    """Files matching a kernel's `deps` globs (recursive `**`), absolute and sorted.

    Matched in the project only (nkibuild.confine.glob_files): a match that leads
    outside it through a symlink is refused, a symlink loop is not followed."""
    from nkibuild.confine import glob_files

    found = {os.path.abspath(match) for pattern in patterns for match in glob_files(root, pattern)}
    return sorted(found)


@_guarded
def run_extract(
    context: BuildContext, spec: ExtractSpec, config: dict[str, Any], files: list[str]
) -> dict[str, str]:
    from nkibuild import frontends
    from nkibuild.graph.records import write_extract_record

    artifact = frontends.run(context, spec)
    write_extract_record(context.layout.state_dir, spec.name, config, context.manifest.root, files)
    return {"content_hash": artifact.content_hash}


def _extract_task(context: BuildContext, spec: ExtractSpec) -> dict[str, Any]:
    out_dir = context.layout.extract_path(spec)
    config, files = extract_config(context, spec), extract_files(context, spec)
    targets = [f"{out_dir}/{name}" for name in ARTIFACT_FILES]
    record, intact = outputs_checked(targets, [f"{out_dir}/{SIDECAR_DIR}"])
    name = f"{EXTRACT_TASK}:{spec.name}"
    extract, as_read = inputs_checked(run_extract, (context, spec, config, files), files, name)
    return {
        "basename": EXTRACT_TASK,
        "name": spec.name,
        "doc": f"extract HLO from {spec.source} ({spec.frontend})",
        "actions": [extract, record],
        "file_dep": files,
        "targets": targets,
        "uptodate": [ConfigChanged(config), intact, as_read],
        "clean": True,
    }


@_guarded
def run_compile(context: BuildContext, unit: BuildUnit) -> dict[str, Any]:
    from nkibuild import compiler

    result = compiler.run(context, unit)
    # The outputs check's record, with the sha256 the stage verified the NEFF by (a NEFF
    # may be hundreds of MB: it is not read again).
    out_dir = context.layout.compile_path(unit)
    neff, record = f"{out_dir}/{NEFF_FILE}", f"{out_dir}/{RESULT_FILE}"
    return {
        "origin": result.origin,
        "notices": list(result.notices),
        "compile_seconds": result.compile_seconds,
        "peak_memory": result.peak_memory,
        **outputs_record({neff: result.sha256}, [record]),
    }


def _compile_task(context: BuildContext, unit: BuildUnit) -> dict[str, Any]:
    extract_dir = context.layout.extract_path(unit.extract)
    out_dir = context.layout.compile_path(unit)
    toolchain = context.toolchain
    config = {
        "compile_args": unit.compile_args(),
        "compiler_version": toolchain.compiler_version,
        "neuron_cc_flags": toolchain.neuron_cc_flags,
    }
    targets = [f"{out_dir}/{name}" for name in COMPILE_OUTPUTS]
    return {
        "basename": COMPILE_TASK,
        "name": unit.name,
        "doc": f"compile {unit.name} with neuronx-cc",
        "actions": [(run_compile, (context, unit))],  # which records its outputs too
        "file_dep": [f"{extract_dir}/{name}" for name in ARTIFACT_FILES],
        "targets": targets,
        "uptodate": [ConfigChanged(config), OutputsIntact(targets)],
        "clean": True,
    }


@_guarded
def run_bundle(context: BuildContext) -> dict[str, Any]:
    # The stage knows each file's sha256 as it writes it (a NEFF's from its compile
    # record): the outputs record takes them instead of hashing the tree again.
    written = bundle.run(context)
    root = os.path.abspath(context.layout.bundle_dir(context.manifest))
    return outputs_record({os.path.join(root, name): sha for name, sha in written.items()})


def _bundle_task(context: BuildContext) -> dict[str, Any]:
    manifest = context.manifest
    # The compile records, not the NEFFs: the bundle takes a NEFF as its record's sha256
    # names it (and copies only what its tree lacks), so a NEFF changed behind its record
    # reruns its compile (the outputs check), which the bundle then follows. Half the
    # dependencies doit checks and records when the bundle runs.
    compiled = [f"{context.layout.compile_path(unit)}/{RESULT_FILE}" for unit in context.units]
    # What the bundle ships (references, nki/nkipy sources) is among its materials, whose
    # digests it records (its provenance summary).
    shipped = [os.path.abspath(path) for path in (manifest.path, *material_files(manifest))]
    bundle_dir = os.path.abspath(context.layout.bundle_dir(manifest))
    intact = OutputsIntact((), [bundle_dir])
    # The project's files, read while it runs; the compile records are nkibuild's own.
    run, as_read = inputs_checked(run_bundle, (context,), shipped, BUNDLE_TASK)
    config = {
        "package": vars(manifest.package),
        "kernels": [kernel.config() for kernel in manifest.kernels],
        "nkibuild": __version__,
        "generator": nkibuild.code_digest(),
    }
    return {
        "basename": BUNDLE_TASK,
        "doc": f"generate the {manifest.package.name} package with its loaders",
        "actions": [run],
        "file_dep": [*compiled, *shipped],
        "targets": [os.path.join(bundle_dir, bundle.STAMP_FILE)],
        "uptodate": [ConfigChanged(config), intact, as_read],
        "clean": True,
    }


@_guarded
def run_wheel(context: BuildContext) -> dict[str, Any]:
    return {"wheels": [str(path) for path in wheel.run(context)]}


def _wheel_task(context: BuildContext) -> dict[str, Any]:
    manifest = context.manifest
    bundle_dir = context.layout.bundle_dir(manifest)
    dist_dir = context.layout.dist_dir
    wheels = [
        os.path.abspath(dist_dir / wheel.wheel_file_name(p)) for p in bundle.distributions(manifest)
    ]
    record, intact = outputs_checked(wheels)
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    checked: list[str] = []
    if manifest.verify:  # a failed verify withholds the wheel, also under --keep-going
        from nkibuild.verify.task import verify_outputs

        checked = verify_outputs(context)
    return {
        "basename": WHEEL_TASK,
        "doc": f"pack {manifest.package.name} into a wheel in {dist_dir}",
        "actions": [(run_wheel, (context,)), record],
        "file_dep": [os.path.abspath(bundle_dir / bundle.STAMP_FILE), *checked],
        "targets": wheels,
        # The members' timestamp: a new SOURCE_DATE_EPOCH writes the wheel again (and a
        # bad one fails it, naming the variable, as when it runs for another reason);
        # so does another wheel writer, whose bytes may differ for the same bundle.
        "uptodate": [
            ConfigChanged({"source_date_epoch": epoch, "writer": nkibuild.code_digest()}),
            intact,
        ],
        "clean": True,
    }
