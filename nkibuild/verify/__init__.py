"""Verify stage: run a bundle's kernels as users get them and compare with the reference.

The bundle (a built project's `build/bundle/<dist>/` or a wheel, unpacked) runs in a
fresh interpreter through `runner.py`, on deterministic sample inputs, in the
requested mode; its reference runs on the same inputs. Checks: the reference's
outputs have the NEFFs' shapes and dtypes; the mode's results are within the
kernel's tolerance of the reference; for a project, each kernel's own source run on
the CPU agrees with its reference (`sources.py`); and nothing regressed against the
baseline (numeric error, spike benchmark time) that the first verify recorded.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild.bundle.buildinfo import FILE_NAME as BUILD_INFO
from nkibuild.confine import open_regular, read_regular
from nkibuild.errors import BuildError, UsageError
from nkibuild.formats.jsonlimits import load_json
from nkibuild.fsutil import atomic_write_text

if TYPE_CHECKING:
    from nkibuild.bundle.buildinfo import BuildInfo
    from nkibuild.toolchain import Toolchain
    from nkibuild.verify.sources import ProjectSources

RUNNER = Path(__file__).with_name("runner.py")
# A figure past `growth` times its baseline value, plus `slack`, is a regression.
REGRESSIONS = (  # (figure, growth, slack, problem)
    ("max_abs_error", 2.0, 1e-12, "the error grew from {then:.3g} to {now:.3g}"),
    ("benchmark_mean_ms", 1.10, 0.0, "spike benchmark {now:.3f} ms, baseline {then:.3f} ms"),
)
VERIFY_TIMEOUT_S = 1800
ENV_TIMEOUT = "NKIBUILD_VERIFY_TIMEOUT"
MAX_ANSWER_BYTES = 256 << 20  # runner.py's answer: a few hundred bytes per variant
LOG_TAIL_BYTES = 4000
MAX_WHEEL_BYTES = 8 << 30  # a wheel handed to verify (its NEFFs are at most 4 GiB each)
MAX_UNPACKED_BYTES = 16 << 30  # what its members may declare in total
MAX_BUILD_INFO_BYTES = 64 << 20
# What zipfile raises for a damaged wheel: besides BadZipFile, zlib.error (corrupt
# deflated data), NotImplementedError (an unknown compression method; a
# RuntimeError like an encrypted member's), EOFError (data cut short).
UNREADABLE_WHEEL = (OSError, EOFError, RuntimeError, zipfile.BadZipFile, zlib.error)


@dataclass(frozen=True)
class BundleUnderTest:
    package: str  # import name
    paths: tuple[Path, ...]  # the directories to import it (and its NEFF parts) from
    info: BuildInfo  # its _build.json
    baseline: Path
    sources: ProjectSources | None = None  # a project's kernel sources; None for a wheel


@dataclass
class Check:
    kernel: str
    variant: str
    mode: str  # "reference", "neuron", "simulate", or "neuron (double, trn2)"
    problems: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None  # why nothing was compared: neither a pass nor a failure

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def status(self) -> str:
        return "failed" if self.problems else "skipped" if self.skipped else "ok"

    def to_json(self) -> dict[str, Any]:
        skipped = {"skipped": self.skipped} if self.skipped else {}
        return {
            "kernel": self.kernel,
            "variant": self.variant,
            "mode": self.mode,
            "ok": self.ok,
            "status": self.status,
            "problems": self.problems,
            **skipped,
            **self.figures,
        }


def bundle_of_project(
    bundle_dir: Path, state_dir: Path, sources: ProjectSources | None = None
) -> BundleUnderTest:
    """A project's built bundle; with `sources`, its kernels are also run from source."""
    from nkibuild.bundle import load_bundle

    project = load_bundle(bundle_dir)
    if project.build_info is None:  # only a bundle's per-target NEFF parts have none
        raise UsageError(f"{bundle_dir}: not a bundle (no {BUILD_INFO})")
    paths = (bundle_dir, *(part.directory for part in project.parts))
    baseline = state_dir / "verify-baseline.json"
    package = project.package.import_name
    return BundleUnderTest(package, paths, project.build_info, baseline, sources)


def bundle_of_wheel(wheel: Path, scratch: Path) -> BundleUnderTest:
    """Unpack a wheel (bundles are pure Python) to import it without installing it."""
    from nkibuild.verify.provenance import wheel_build_info

    info = wheel_build_info(wheel)
    if info is None:
        raise UsageError(f"{wheel}: not an nkibuild bundle (no package with {BUILD_INFO})")
    with opened_wheel(wheel) as archive:
        archive.extractall(scratch)
    (package,) = (found.parent.name for found in scratch.glob(f"*/{BUILD_INFO}"))
    return BundleUnderTest(package, (scratch,), info, wheel.with_suffix(".verify.json"))


@contextlib.contextmanager
def opened_wheel(wheel: Path) -> Iterator[zipfile.ZipFile]:
    """A wheel someone handed over, as an archive: opened by the bounded reader (a FIFO
    or a device is refused, not waited on) and refused when its members declare more
    than MAX_UNPACKED_BYTES (zipfile never unpacks a member past its declared size).
    UsageError when it, or what the caller reads of it, is not readable."""
    try:
        with open_regular(wheel, MAX_WHEEL_BYTES) as handle, zipfile.ZipFile(handle) as archive:
            declared = sum(member.file_size for member in archive.infolist())
            if declared > MAX_UNPACKED_BYTES:
                raise zipfile.BadZipFile(
                    f"its members unpack to {declared} bytes, more than {MAX_UNPACKED_BYTES}"
                )
            yield archive
    except UNREADABLE_WHEEL as error:
        raise UsageError(f"{wheel}: not a readable wheel ({error})") from None


def verify(
    bundle: BundleUnderTest,
    mode: str,
    *,
    double: Toolchain | None = None,
    update_baseline: bool = False,
) -> list[Check]:
    """Run every check; record the baseline if there is none (or when asked) and all passed.

    With `double` (the toolchain double, resolved by the caller), simulate mode uses its
    nki and neuron mode runs for every target through its spike core."""
    from nkibuild.verify.sources import source_checks, wheel_source_checks

    frontends = [Path(p) for p in double.worker_path] if double and mode == "simulate" else []
    label = " (toolchain double's nki)" if frontends else ""
    checks = bundle_checks(bundle, mode, label, extra_path=frontends)
    if double is not None:
        runtime = [Path(p) for p in double.runtime_path]
        for target in bundle.info.targets():
            label = f" (toolchain double, {target})"
            checks += bundle_checks(bundle, "neuron", label, runtime, target)
    # Each kernel's own source against its reference (a wheel has none: skipped); the
    # double's nki.simulate really executes NKI kernels (on NumPy).
    if bundle.sources is None:
        checks += wheel_source_checks(bundle.info.to_json())
    elif double is None:
        checks += source_checks(bundle.sources)
    else:
        sources = replace(bundle.sources, extra_path=tuple(map(Path, double.worker_path)))
        checks += source_checks(sources, " (toolchain double's nki)")
    baseline = _read_baseline(bundle.baseline)
    if not update_baseline:
        _compare_with_baseline(checks, baseline)
    if all(c.ok for c in checks):
        _record_baseline(bundle.baseline, baseline, checks, replace=update_baseline)
    return checks


def _record_baseline(
    path: Path, baseline: dict[str, Any], checks: list[Check], *, replace: bool
) -> None:
    """Keep the first figures of every check as its baseline, unless asked to replace them."""
    fresh = {_key(check): check.figures for check in checks}
    merged = {**baseline, **fresh} if replace else {**fresh, **baseline}
    if merged != baseline:
        atomic_write_text(path, json.dumps(merged, indent=2, sort_keys=True))


def bundle_checks(
    bundle: BundleUnderTest,
    mode: str,
    label: str = "",
    extra_path: Sequence[Path] = (),
    target: str | None = None,
) -> list[Check]:
    """The bundle's kernels (with `target`: those with NEFFs for it, run as that target) in
    `mode` against their reference, labelled `label`; no baselines (the build step's)."""
    kernels = bundle.info.kernels.items()
    tolerances = {n: k.tolerance.to_json() for n, k in kernels if target in (None, *k.neffs)}
    request = {"package": bundle.package, "mode": mode, "tolerances": tolerances}
    # -I: no user site, no PYTHONPATH, no cwd on sys.path; the bootstrap adds the paths.
    python = [sys.executable, "-I"]
    chosen = {"NKIBUILD_TARGET": target} if target else {}
    environment = {**os.environ, **chosen, "NKIBUILD_MODE": ""}
    paths = (*bundle.paths, *extra_path)
    run = run_runner(python, paths, request, f"verifying {bundle.package}", None, environment)
    checks = []
    for result in run["results"]:
        check = Check(result["kernel"], result["variant"], mode + label)
        if "error" in result:
            check.problems.append(result["error"])
        else:
            _judge_result(bundle.info, mode, result, run["spike_double"], check)
        checks.append(check)
    return checks


def run_runner(
    python: list[str],
    paths: Sequence[Path],
    request: dict[str, Any],
    what: str,
    cwd: Path | None,
    env: dict[str, str],
) -> dict[str, Any]:
    """Run runner.py in `python` (an interpreter and its options), with `paths` first on
    sys.path, in its own process group and return its answer: `{"results": [...], **its
    last line}`. The answer comes through a file (runner.py's docstring), never stdout:
    what a kernel or reference prints goes to a log whose tail errors show. BuildError
    when the run outlasts the timeout (naming what was running; the process group is
    killed), fails, or leaves no complete answer."""
    from nkibuild.compiler.process import run_process
    from nkibuild.quantities import parse_duration

    try:  # NKIBUILD_VERIFY_TIMEOUT, else 30 minutes
        timeout = parse_duration(os.environ.get(ENV_TIMEOUT, VERIFY_TIMEOUT_S))
    except ValueError as error:
        raise UsageError(f"{ENV_TIMEOUT}: {error}") from None
    with tempfile.TemporaryDirectory(prefix="nkibuild-verify-") as scratch:
        answer, log, request_file = (Path(scratch, n) for n in ("answer", "log", "request"))
        request_file.write_text(json.dumps({**request, "output": str(answer)}))
        path = os.pathsep.join(map(str, paths))
        command = [*python, "-c", _BOOTSTRAP, path, str(RUNNER), str(request_file)]
        outcome = run_process(command, cwd or Path(scratch), log, timeout, env=env)
        lines, tail = _answer_lines(answer), _log_tail(log)
    if outcome.timed_out:
        running = next((line["running"] for line in reversed(lines) if "running" in line), None)
        raise BuildError(
            f"{what}: {running or 'the check'} did not finish within {timeout:g} s "
            f"({ENV_TIMEOUT}); it was stopped, and the checks after it did not run",
            log_tail=tail,
        )
    if outcome.returncode != 0 or not lines or "done" not in lines[-1]:
        raise BuildError(
            f"{what} failed (exit {outcome.returncode}; a kernel or reference may have ended "
            "the process)",
            log_tail=tail,
        )
    return {"results": [line for line in lines if "kernel" in line], **lines[-1]}


def _answer_lines(answer: Path) -> list[dict[str, Any]]:
    """The answer's JSON objects, one a line; none if it is absent or not runner.py's."""
    try:
        text = read_regular(answer, MAX_ANSWER_BYTES).decode("utf-8", errors="replace")
        lines = [load_json(line) for line in text.splitlines()]
    except (OSError, ValueError):  # ValueError: JsonLimitError
        return []
    return [line for line in lines if isinstance(line, dict)]


def _log_tail(log: Path) -> str:
    try:
        with open_regular(log, sys.maxsize) as handle:
            handle.seek(max(0, os.fstat(handle.fileno()).st_size - LOG_TAIL_BYTES))
            return handle.read(LOG_TAIL_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ""


# Runs the runner with the paths first on sys.path (the bundle, the project root, the
# double's packages), in place of the working directory `-c` puts there (-I puts none),
# so the runner's own directory never shadows them; site-packages stay, for NumPy.
_BOOTSTRAP = (
    "import os, runpy, sys; "
    "path, runner = sys.argv[1], sys.argv[2]; "
    "sys.path[: 1 - sys.flags.isolated] = path.split(os.pathsep); "
    "sys.argv = [runner, *sys.argv[3:]]; "
    "runpy.run_path(runner, run_name='__main__')"
)


def _judge_result(
    info: BuildInfo, mode: str, result: dict[str, Any], double: bool, check: Check
) -> None:
    reference = result["reference_outputs"]
    neffs = info.kernels[check.kernel].neffs
    for target, variants in sorted(neffs.items()):
        compiled = [
            {"dtype": t.dtype, "shape": list(t.shape)} for t in variants[check.variant].outputs
        ]
        if compiled != reference:
            check.problems.append(
                f"the reference returns {signature_text(reference)} but the {target} NEFF "
                f"returns {signature_text(compiled)}"
            )
    check.figures["reference_seconds"] = result["reference_seconds"]
    resolved = result.get("resolved_mode")
    if resolved and resolved != mode:
        check.mode += f" -> {resolved}"
    if "outputs" not in result:
        check.figures["note"] = (
            "reference only: auto chose reference mode on this host"
            if resolved == "reference"
            else f"reference only: {mode} mode does not apply to this kernel"
        )
        return
    if result["outputs"] != reference:
        check.problems.append(
            f"{mode} mode returned {signature_text(result['outputs'])}, "
            f"the reference {signature_text(reference)}"
        )
    check.figures["seconds"] = result["seconds"]
    if double:
        check.figures["note"] = "marshalling only: the toolchain double does not compute"
        return
    figures = ("max_abs_error", "max_rel_error", "benchmark_mean_ms")
    check.figures.update({name: result[name] for name in figures if name in result})
    if not result.get("within_tolerance", False):
        check.problems.append(
            f"{mode} mode differs from the reference by up to {result['max_abs_error']:.3g} "
            f"(relative {result['max_rel_error']:.3g}), beyond the kernel's tolerance"
        )


def signature_text(outputs: Sequence[dict[str, Any]]) -> str:
    return ", ".join(f"{o['dtype']}[{','.join(map(str, o['shape']))}]" for o in outputs)


def _key(check: Check) -> str:
    return f"{check.kernel}/{check.variant}/{check.mode}"


def _read_baseline(path: Path) -> dict[str, Any]:
    try:
        data = load_json(read_regular(path, MAX_BUILD_INFO_BYTES))
    except (OSError, ValueError):  # none yet, or not one nkibuild wrote: start afresh
        return {}
    return data if isinstance(data, dict) else {}


def _compare_with_baseline(checks: list[Check], baseline: dict[str, Any]) -> None:
    for check in checks:
        before = baseline.get(_key(check))
        if not before or not check.ok:
            continue
        for figure, growth, slack, problem in REGRESSIONS:
            now, then = check.figures.get(figure), before.get(figure)
            if now is not None and then is not None and now > growth * then + slack:
                check.problems.append("regression: " + problem.format(now=now, then=then))
