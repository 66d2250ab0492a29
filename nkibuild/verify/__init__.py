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

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild.errors import BuildError, UsageError
from nkibuild.fsutil import atomic_write_text

if TYPE_CHECKING:
    from nkibuild.bundle.buildinfo import BuildInfo
    from nkibuild.toolchain import Toolchain
    from nkibuild.verify.sources import ProjectSources

RUNNER = Path(__file__).with_name("runner.py")
BUILD_INFO = "_build.json"
ERROR_GROWTH = 2.0  # an error this many times the baseline's is a regression
SLOWDOWN = 1.10  # and so is a benchmark this much slower
VERIFY_TIMEOUT_S = 1800


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
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(scratch)
    except (OSError, zipfile.BadZipFile) as error:
        raise UsageError(f"{wheel}: not a readable wheel ({error})") from None
    packages = [p.parent.name for p in scratch.glob(f"*/{BUILD_INFO}")]
    if len(packages) != 1:
        raise UsageError(f"{wheel}: not an nkibuild bundle (no single package with {BUILD_INFO})")
    from nkibuild.bundle.buildinfo import BuildInfo, BuildInfoError

    try:
        info = BuildInfo.from_text((scratch / packages[0] / BUILD_INFO).read_text())
    except BuildInfoError as error:
        raise UsageError(f"{wheel}: {error.of(f'{packages[0]}/{BUILD_INFO}')}") from None
    return BundleUnderTest(packages[0], (scratch,), info, wheel.with_suffix(".verify.json"))


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
    frontends = [Path(p) for p in double.worker_path] if double and mode == "simulate" else []
    label = " (toolchain double's nki)" if frontends else ""
    checks = _judge(bundle, mode, _run(bundle, mode, {}, frontends), label)
    if double is not None:
        runtime = [Path(p) for p in double.runtime_path]
        for target in bundle.info.targets():
            env = {"NKIBUILD_TARGET": target}
            results = _run(bundle, "neuron", env, extra_path=runtime, target=target)
            checks += _judge(bundle, "neuron", results, f" (toolchain double, {target})")
    checks += _source_checks(bundle, double)
    baseline = _read_baseline(bundle.baseline)
    if not update_baseline:
        _compare_with_baseline(checks, baseline)
    if all(c.ok for c in checks):
        _record_baseline(bundle.baseline, baseline, checks, replace=update_baseline)
    return checks


def bundle_checks(bundle: BundleUnderTest, mode: str) -> list[Check]:
    """The bundle run in one mode against its reference, without baselines (build step)."""
    return _judge(bundle, mode, _run(bundle, mode, {}), "")


def _source_checks(bundle: BundleUnderTest, double: Toolchain | None) -> list[Check]:
    """Each kernel's own source against its reference (a wheel has no source: skipped)."""
    from dataclasses import replace

    from nkibuild.verify.sources import source_checks, wheel_source_checks

    if bundle.sources is None:
        return wheel_source_checks(bundle.info)
    if double is None:
        return source_checks(bundle.sources)
    # The double's nki.simulate really executes NKI kernels (on NumPy).
    sources = replace(bundle.sources, extra_path=tuple(Path(p) for p in double.worker_path))
    return source_checks(sources, " (toolchain double's nki)")


def _record_baseline(
    path: Path, baseline: dict[str, Any], checks: list[Check], *, replace: bool
) -> None:
    """Keep the first figures of every check as its baseline, unless asked to replace them."""
    merged = dict(baseline)
    for check in checks:
        if replace or _key(check) not in merged:
            merged[_key(check)] = check.figures
    if merged != baseline:
        atomic_write_text(path, json.dumps(merged, indent=2, sort_keys=True))


def _run(
    bundle: BundleUnderTest,
    mode: str,
    env: dict[str, str],
    extra_path: Sequence[Path] = (),
    target: str | None = None,
) -> dict[str, Any]:
    """The runner's results for the bundle's kernels (those with NEFFs for `target`, if given)."""
    kernels = bundle.info.kernels.items()
    tolerances = {n: k.tolerance.to_json() for n, k in kernels if target in (None, *k.neffs)}
    request = {"package": bundle.package, "mode": mode, "tolerances": tolerances}
    with tempfile.TemporaryDirectory(prefix="nkibuild-verify-") as scratch:
        request_file = Path(scratch) / "request.json"
        request_file.write_text(json.dumps(request))
        path = os.pathsep.join(str(p) for p in (*bundle.paths, *extra_path))
        # -I: no user site, no PYTHONPATH, no cwd on sys.path; the bootstrap adds `path`.
        command = [sys.executable, "-I", "-c", _BOOTSTRAP, path, str(RUNNER), str(request_file)]
        proc = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env={**os.environ, **env, "NKIBUILD_MODE": ""},
            timeout=VERIFY_TIMEOUT_S,
            check=False,
        )
    if proc.returncode != 0:
        raise BuildError(
            f"verifying {bundle.package} failed to run (exit {proc.returncode})",
            log_tail=proc.stderr[-4000:],
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


# Runs the runner with only the bundle (and, for the double, the fake spike) added to
# sys.path: the interpreter's site-packages stay, so NumPy and friends are found.
_BOOTSTRAP = (
    "import runpy, sys; "
    "path, runner = sys.argv[1], sys.argv[2]; "
    "sys.path[:0] = path.split(__import__('os').pathsep); "
    "sys.argv = [runner, *sys.argv[3:]]; "
    "runpy.run_path(runner, run_name='__main__')"
)


def _judge(bundle: BundleUnderTest, mode: str, run: dict[str, Any], label: str) -> list[Check]:
    checks = []
    for result in run["results"]:
        check = Check(result["kernel"], result["variant"], mode + label)
        if "error" in result:
            check.problems.append(result["error"])
        else:
            _judge_result(bundle.info, mode, result, run["spike_double"], check)
        checks.append(check)
    return checks


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
                f"the reference returns {_signature(reference)} but the {target} NEFF "
                f"returns {_signature(compiled)}"
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
            f"{mode} mode returned {_signature(result['outputs'])}, "
            f"the reference {_signature(reference)}"
        )
    check.figures["seconds"] = result["seconds"]
    if double:
        check.figures["note"] = "marshalling only: the toolchain double does not compute"
        return
    check.figures["max_abs_error"] = result["max_abs_error"]
    check.figures["max_rel_error"] = result["max_rel_error"]
    if "benchmark_mean_ms" in result:
        check.figures["benchmark_mean_ms"] = result["benchmark_mean_ms"]
    if not result.get("within_tolerance", False):
        check.problems.append(
            f"{mode} mode differs from the reference by up to {result['max_abs_error']:.3g} "
            f"(relative {result['max_rel_error']:.3g}), beyond the kernel's tolerance"
        )


def _signature(outputs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{o['dtype']}[{','.join(map(str, o['shape']))}]" for o in outputs)


def _key(check: Check) -> str:
    return f"{check.kernel}/{check.variant}/{check.mode}"


def _read_baseline(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _compare_with_baseline(checks: list[Check], baseline: dict[str, Any]) -> None:
    for check in checks:
        before = baseline.get(_key(check))
        if not before or not check.ok:
            continue
        error, error_before = check.figures.get("max_abs_error"), before.get("max_abs_error")
        grew = error is not None and error_before is not None
        if grew and error > ERROR_GROWTH * error_before + 1e-12:
            check.problems.append(
                f"regression: the error grew from {error_before:.3g} to {error:.3g}"
            )
        mean, mean_before = check.figures.get("benchmark_mean_ms"), before.get("benchmark_mean_ms")
        if mean is not None and mean_before is not None and mean > SLOWDOWN * mean_before:
            check.problems.append(
                f"regression: spike benchmark {mean:.3f} ms, baseline {mean_before:.3f} ms"
            )
