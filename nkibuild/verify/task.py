"""The opt-in `verify` build step: manifest `verify: true` adds it after `bundle`.

It runs what verify can check at build time, on any machine: each kernel's own
source on the CPU against its reference (`sources.py`), and the bundle's reference
against the NEFFs' output signatures. A disagreement fails the task, so the build
fails (exit 1). The checks are written to `build/verify/checks.json`.

The wheel is meant to depend on that report (`verify_outputs` in its `file_dep`): a
failed verify then withholds the wheel, with or without `--keep-going` (which still
builds every NEFF and the bundle), and at any `-j`. A wheel whose kernels disagree
with their references is never the intended output of a build that asked to verify.

No baselines here: those belong to `nkibuild verify`, which a user runs on purpose.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doit.exceptions import TaskFailed
from doit.tools import config_changed

from nkibuild import __version__
from nkibuild.bundle import STAMP_FILE
from nkibuild.bundle.provenance import material_files
from nkibuild.errors import NkibuildError
from nkibuild.fsutil import atomic_write_text
from nkibuild.verify import RUNNER, Check, bundle_checks, bundle_of_project
from nkibuild.verify.sources import project_sources, source_checks

if TYPE_CHECKING:
    from nkibuild.context import BuildContext
    from nkibuild.manifest.model import Manifest

REPORT = Path("verify") / "checks.json"  # under the build dir
TIMINGS = ("seconds", "reference_seconds")  # figures that differ from run to run


def verify_task(context: BuildContext) -> dict[str, Any] | None:
    """The doit task dict of the verify step, or None when the manifest does not ask for it."""
    manifest = context.manifest
    if not manifest.verify:
        return None
    stamp = os.path.join(context.layout.bundle_dir(manifest), STAMP_FILE)
    return {
        "basename": "verify",
        "doc": "run each kernel's source on the CPU against its reference, and the "
        "bundle's reference against its NEFFs",
        "actions": [(run_verify, (context,))],
        # The bundle's stamp orders this task after `bundle` (doit links it to its target).
        "file_dep": [stamp, *source_files(manifest)],
        "targets": verify_outputs(context),
        "uptodate": [config_changed(_config(context))],
        "clean": True,
    }


def verify_outputs(context: BuildContext) -> list[str]:
    """The wheel task's extra `file_dep` (see above; under --keep-going doit reports the
    wheel blocked): the report, when the manifest sets `verify: true`."""
    if not context.manifest.verify:
        return []
    return [str(context.layout.build_dir / REPORT)]


def _config(context: BuildContext) -> dict[str, Any]:
    """Everything besides files that decides the checks' outcome."""
    return {
        "kernels": [kernel.config() for kernel in context.manifest.kernels],
        "python": context.toolchain.python,  # its jax decides the JAX kernels' results
        "runner": hashlib.sha256(RUNNER.read_bytes()).hexdigest(),
        "nkibuild": __version__,
    }


def source_files(manifest: Manifest) -> list[str]:
    """Kernel and reference files and the kernels' `deps` globs, absolute and sorted."""
    return sorted(os.path.abspath(path) for path in material_files(manifest))


def run_verify(context: BuildContext) -> Any:
    """doit action: the checks; a TaskFailed naming every disagreement, else a summary."""
    try:
        checks = build_checks(context)
    except NkibuildError as error:  # e.g. user code ended the checking process
        return TaskFailed(error.render())
    _write_report(context.layout.build_dir / REPORT, checks)
    failed = [check for check in checks if not check.ok]
    if failed:
        return TaskFailed(_failures(failed, len(checks)))
    skipped = sum(check.status == "skipped" for check in checks)  # the others passed
    origin = f"{len(checks) - skipped} checks passed" + (f", {skipped} skipped" if skipped else "")
    return {"origin": origin, "notices": _skip_notices(checks)}


def build_checks(context: BuildContext) -> list[Check]:
    manifest, layout = context.manifest, context.layout
    checks = source_checks(project_sources(manifest, context.toolchain.python))
    bundle = bundle_of_project(layout.bundle_dir(manifest), layout.state_dir)
    return checks + bundle_checks(bundle, "reference")


def _write_report(path: Path, checks: list[Check]) -> None:
    """The checks without timings: the same results write the same bytes, so a task
    that depends on this file (the wheel) is not redone when nothing changed."""
    report = [
        {key: value for key, value in check.to_json().items() if key not in TIMINGS}
        for check in checks
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(report, indent=2, sort_keys=True) + "\n")


def _failures(failed: list[Check], total: int) -> str:
    lines = [f"verify: {len(failed)} of {total} checks failed"]
    for check in failed:
        where = f"{check.kernel}/{check.variant} [{check.mode}]"
        lines.extend(f"  {where}: {problem}" for problem in check.problems)
    return "\n".join(lines)


def _skip_notices(checks: list[Check]) -> list[str]:
    """One line per kernel and reason (not per variant): what was not checked, and why."""
    seen: dict[tuple[str, str], list[str]] = {}
    for check in checks:
        if check.skipped:
            seen.setdefault((check.kernel, check.skipped), []).append(check.variant)
    return [
        f"{kernel} ({', '.join(variants)}) skipped: {reason}"
        for (kernel, reason), variants in seen.items()
    ]
