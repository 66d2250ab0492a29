"""Kernel against reference, from the project's own source, on the CPU.

The bundle's checks compare a mode with the reference; with placeholder NEFFs (the
toolchain double) or off Trainium that mode falls back to the reference itself, so a
kernel whose body disagrees with its reference would pass. This check runs the
kernel's own source where the CPU can: JAX kernels under `jax.jit` (constants static,
as they were traced), nkipy kernels as the NumPy functions they are, NKI kernels under
`nki.simulate` when it is installed. hlo kernels (and NKI kernels without a
simulator) are reported as skipped, never as passed.

User code runs in `runner.py`, in a fresh interpreter per project (the
frontends' interpreter), with the project root first on sys.path: never in the
nkibuild process, and never sharing a module with another project.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nkibuild.manifest.model import Kernel, Manifest, SourceRef
from nkibuild.verify import Check, run_runner, signature_text

# How each frontend's source runs on the CPU (a check's `mode`).
MODES = {
    "jax": "jax kernel on the CPU",
    "nkipy": "nkipy kernel on the CPU",
    "nki": "nki kernel under nki.simulate",
    "hlo": "hlo kernel on the CPU",
}
IN_PROJECT = (
    "run `nkibuild verify` in the kernel's project to compare the kernel itself with its "
    "reference on the CPU"
)
NOT_IN_WHEEL = f"a wheel holds no source of this kernel to run: {IN_PROJECT}"
# nki and nkipy kernels' files ship in the bundle (its `_sources` package, for simulate
# mode and NumPy), but as modules of the bundle, not at their paths in the project.
SHIPPED_NOT_RUN = (
    "the wheel carries this kernel's source (in its `_sources` package), but `verify WHEEL` "
    f"runs the bundle only: {IN_PROJECT}"
)


@dataclass(frozen=True)
class ProjectSources:
    root: Path  # the manifest's directory: kernel paths are relative to it
    kernels: tuple[Kernel, ...]
    python: str  # the interpreter the frontends run in (it has jax)
    extra_path: tuple[Path, ...] = ()  # e.g. the toolchain double's nki, before the project


def project_sources(manifest: Manifest, python: str) -> ProjectSources:
    return ProjectSources(manifest.root, manifest.kernels, python)


def source_checks(sources: ProjectSources, nki_label: str = "") -> list[Check]:
    """One check per kernel and variant, run in a fresh interpreter: compared, skipped
    (with why) or failed. `nki_label` says whose nki.simulate ran the NKI kernels."""
    request = {"root": str(sources.root), "kernels": [_kernel_job(k) for k in sources.kernels]}
    # The check is about the CPU: JAX must not pick up a Neuron (or GPU) plugin.
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"}
    what = f"running the kernels of {sources.root} on the CPU"
    paths = (*sources.extra_path, sources.root)
    answer = run_runner([sources.python], paths, request, what, sources.root, env)
    by_name = {kernel.name: kernel for kernel in sources.kernels}
    checks = []
    for result in answer["results"]:
        kernel = by_name[result["kernel"]]
        label = nki_label if kernel.frontend == "nki" else ""
        check = Check(kernel.name, result["variant"], MODES[kernel.frontend] + label)
        _judge(kernel, result, check)
        checks.append(check)
    return checks


def wheel_source_checks(build_info: dict[str, Any]) -> list[Check]:
    """For a bare wheel, from its `_build.json`: every kernel and variant, skipped, saying why."""
    from nkibuild.bundle import SHIPPED_FRONTENDS

    checks = []
    for name, kernel in sorted(build_info["kernels"].items()):
        for variant in kernel["variants"]:
            check = Check(name, variant, MODES.get(kernel["frontend"], "kernel on the CPU"))
            shipped = kernel["frontend"] in SHIPPED_FRONTENDS
            check.skipped = SHIPPED_NOT_RUN if shipped else NOT_IN_WHEEL
            checks.append(check)
    return checks


def _kernel_job(kernel: Kernel) -> dict[str, Any]:
    return {
        "name": kernel.name,
        "frontend": kernel.frontend,
        "source": _where(kernel.source),
        "reference": _where(kernel.reference) if kernel.reference else None,
        "constants": [[name, value] for name, value in kernel.constants],
        # The inputs' shapes and dtypes, as runner.py's bundle check derives them: the
        # samples are the same.
        "variants": [
            {"name": v.name, "inputs": [t.to_json() for t in v.inputs]} for v in kernel.variants
        ],
        "tolerance": {"rtol": kernel.tolerance.rtol, "atol": kernel.tolerance.atol},
    }


def _where(ref: SourceRef) -> dict[str, str | None]:
    return {"path": ref.path, "function": ref.function}


def _judge(kernel: Kernel, result: dict[str, Any], check: Check) -> None:
    if "skipped" in result:
        check.skipped = result["skipped"]
    elif "error" in result:
        check.problems.append(result["error"])
    elif result["kernel_outputs"] != result["reference_outputs"]:
        check.problems.append(
            f"the {kernel.frontend} kernel returns {signature_text(result['kernel_outputs'])} "
            f"but its reference ({kernel.reference}) returns "
            f"{signature_text(result['reference_outputs'])}"
        )
    else:
        check.figures["max_abs_error"] = result["max_abs_error"]
        check.figures["max_rel_error"] = result["max_rel_error"]
        if not result["within_tolerance"]:
            check.problems.append(_disagreement(kernel, result))


def _disagreement(kernel: Kernel, result: dict[str, Any]) -> str:
    """Names the first output beyond tolerance, its errors and the tolerance applied."""
    index, worst = next((i, o) for i, o in enumerate(result["outputs"]) if not o["within"])
    several = len(result["outputs"]) > 1
    output = result["kernel_outputs"][index]
    which = f"output {index} " if several else ""
    given = kernel.tolerance
    source = (
        "the kernel's `tolerance`"
        if given.rtol is not None or given.atol is not None
        else f"the default for {output['dtype']}; set `tolerance:` in the manifest to change it"
    )
    return (
        f"the {kernel.frontend} kernel disagrees with its reference ({kernel.reference}): "
        f"{which}{signature_text([output])} max abs error {worst['max_abs_error']:.3g}, "
        f"max rel error {worst['max_rel_error']:.3g}, beyond rtol {worst['rtol']:.3g}, "
        f"atol {worst['atol']:.3g} ({source})"
    )
