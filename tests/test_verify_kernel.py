"""verify runs each kernel's own source on the CPU against its reference.

With the toolchain double (or off Trainium) the bundle's modes fall back to the
reference, so only running the kernel's source itself catches a kernel body that
disagrees with its reference: JAX kernels under jax.jit, nkipy kernels as NumPy
functions; NKI kernels only under nki.simulate, hlo kernels never (skipped, not passed).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_nkibuild
from helpers import build, write_project

from nkibuild.manifest import load_manifest
from nkibuild.verify import Check
from nkibuild.verify.sources import project_sources, source_checks

VERIFY = ["verify", "--toolchain", "fake"]

JAX_MANIFEST = """\
format-version: 1
package: {name: scale-kernels, version: 0.1.0}
defaults: {targets: [trn2]}
%(top)s
kernels:
  scale:
    frontend: jax
    source: kernels/kernels.py:scale
    reference: kernels/reference.py:scale
    inputs:
      x: {shape: [8, 16], dtype: float32}
    constants: {alpha: 2.0}
    variants:
      small: {x: [8, 16]}
      large: {x: [32, 16]}
%(kernel)s
"""

# The kernel imports a sibling module, as a script would (its directory on sys.path).
JAX_KERNEL = """\
import jax.numpy as jnp
from utils import BIAS


def scale(x, alpha):
    return jnp.multiply(alpha, x) + BIAS
"""

REFERENCE = """\
import numpy as np


def scale(x, alpha):
    return alpha * x


def norm(x, eps):
    return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
"""


def jax_project(root: Path, bias: float, *, top: str = "", kernel: str = "") -> Path:
    pytest.importorskip("jax")
    manifest = JAX_MANIFEST % {"top": top, "kernel": kernel}
    files = {
        "kernels/kernels.py": JAX_KERNEL,
        "kernels/utils.py": f"BIAS = {bias!r}\n",
        "kernels/reference.py": REFERENCE,
    }
    return write_project(root, manifest, files)


NKIPY_MANIFEST = """\
format-version: 1
package: {name: norm-kernels, version: 0.1.0}
defaults: {targets: [trn2]}
kernels:
  norm:
    frontend: nkipy
    source: kernels/nkipy_kernels.py:norm
    reference: kernels/reference.py:norm
    inputs:
      x: {shape: [4, 32], dtype: float32}
    constants: {eps: 1.0e-6}
"""


def nkipy_project(root: Path, kernel_body: str) -> Path:
    kernel = f"import numpy as np\n\n\ndef norm(x, eps):\n    {kernel_body}\n"
    files = {"kernels/nkipy_kernels.py": kernel, "kernels/reference.py": REFERENCE}
    return write_project(root, NKIPY_MANIFEST, files)


def checks_of(project: Path) -> list[Check]:
    """The source checks alone, through the Python API (no build needed)."""
    manifest = load_manifest(project / "nkibuild.yaml")
    return source_checks(project_sources(manifest, sys.executable))


def by_variant(checks: list[Check]) -> dict[str, Check]:
    return {check.variant: check for check in checks}


# --- nkibuild verify ---------------------------------------------------------


def test_a_jax_kernel_that_disagrees_with_its_reference_fails_verify(tmp_path: Path) -> None:
    project = jax_project(tmp_path / "p", bias=1.0)
    result = run_nkibuild(VERIFY, project)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "scale/small [jax kernel on the CPU]: FAILED" in result.stdout
    assert "scale/large [jax kernel on the CPU]: FAILED" in result.stdout
    # kernel 2x + 1, reference 2x: every element is off by exactly 1.
    assert (
        "the jax kernel disagrees with its reference (kernels/reference.py:scale): "
        "float32[8,16] max abs error 1, max rel error" in result.stdout
    )
    assert (
        "beyond rtol 1e-05, atol 1e-06 (the default for float32; set `tolerance:` in the "
        "manifest to change it)" in result.stdout
    )
    assert "Traceback" not in result.stdout + result.stderr


def test_an_agreeing_jax_kernel_passes_verify(tmp_path: Path) -> None:
    project = jax_project(tmp_path / "p", bias=0.0)
    result = run_nkibuild([*VERIFY, "--json"], project)
    assert result.returncode == 0, result.stdout + result.stderr
    found = [c for c in json.loads(result.stdout) if c["mode"] == "jax kernel on the CPU"]
    assert {c["variant"]: c["status"] for c in found} == {"small": "ok", "large": "ok"}
    assert all(c["max_abs_error"] == 0.0 for c in found)


def test_the_manifest_tolerance_decides_and_is_named(tmp_path: Path) -> None:
    loose = jax_project(tmp_path / "loose", 1e-3, kernel="    tolerance: {atol: 1.0e-2}\n")
    assert all(c.status == "ok" for c in checks_of(loose))
    tight = jax_project(tmp_path / "tight", 1e-3, kernel="    tolerance: {atol: 1.0e-4}\n")
    problems = [p for c in checks_of(tight) for p in c.problems]
    assert len(problems) == 2
    assert "max abs error 0.001" in problems[0]
    assert "atol 0.0001 (the kernel's `tolerance`)" in problems[0]


def test_a_kernel_whose_outputs_differ_in_dtype_fails(tmp_path: Path) -> None:
    project = jax_project(tmp_path / "p", bias=0.0)
    reference = project / "kernels" / "reference.py"
    reference.write_text(REFERENCE.replace("return alpha * x", "return (alpha * x).astype('f8')"))
    [problem] = by_variant(checks_of(project))["small"].problems
    assert problem == (
        "the jax kernel returns float32[8,16] but its reference (kernels/reference.py:scale) "
        "returns float64[8,16]"
    )


def test_a_kernel_that_raises_or_exits_fails_its_own_checks_only(tmp_path: Path) -> None:
    project = jax_project(tmp_path / "p", bias=0.0)
    kernels = project / "kernels" / "kernels.py"
    kernels.write_text(JAX_KERNEL.replace("+ BIAS", "+ BIAS + undefined_name"))
    [problem] = by_variant(checks_of(project))["large"].problems
    assert problem == "the kernel raised NameError: name 'undefined_name' is not defined"
    kernels.write_text("import sys\n\nsys.exit(3)\n\n\ndef scale(x):\n    return x\n")
    [problem] = by_variant(checks_of(project))["small"].problems
    assert problem == "cannot load the kernel kernels/kernels.py: SystemExit: 3"


def test_projects_never_share_user_modules(tmp_path: Path) -> None:
    """Same file names, different bodies: each project runs its own `utils`."""
    agreeing = jax_project(tmp_path / "a", bias=0.0)
    disagreeing = jax_project(tmp_path / "b", bias=5.0)
    again = jax_project(tmp_path / "c", bias=0.0)
    assert all(c.status == "ok" for c in checks_of(agreeing))
    assert all("max abs error 5" in c.problems[0] for c in checks_of(disagreeing))
    assert all(c.status == "ok" for c in checks_of(again))


def test_an_nkipy_kernel_is_run_as_numpy_and_a_disagreement_caught(tmp_path: Path) -> None:
    body = "return 2 * x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)"
    [check] = checks_of(nkipy_project(tmp_path / "bad", body))
    assert check.mode == "nkipy kernel on the CPU"
    assert check.status == "failed"
    assert check.problems[0].startswith(
        "the nkipy kernel disagrees with its reference (kernels/reference.py:norm): "
        "float32[4,32] max abs error"
    )
    same = "return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)"
    [check] = checks_of(nkipy_project(tmp_path / "good", same))
    assert check.status == "ok" and check.figures["max_abs_error"] == 0.0


def test_an_nkipy_kernel_without_a_reference_is_skipped_not_passed(tmp_path: Path) -> None:
    project = nkipy_project(tmp_path / "p", "return x")
    manifest = project / "nkibuild.yaml"
    manifest.write_text(
        manifest.read_text().replace("    reference: kernels/reference.py:norm\n", "")
    )
    [check] = checks_of(project)
    assert check.status == "skipped" and check.ok and not check.figures
    assert check.skipped == "no reference: an nkipy kernel without one is its own reference"


@pytest.fixture
def nki_project(tmp_path: Path) -> Path:
    root = tmp_path / "nki"
    shutil.copytree(EXAMPLES / "nki-nkipy", root, ignore=shutil.ignore_patterns("build", "dist"))
    return root


def test_nki_and_hlo_kernels_are_reported_as_skipped_not_passed(
    nki_project: Path, tmp_path: Path
) -> None:
    checks = checks_of(nki_project)
    nki = [c for c in checks if c.kernel == "matmul_tiled"]
    assert [c.status for c in nki] == ["skipped", "skipped"]
    assert nki[0].skipped.startswith(
        "not runnable on the CPU: an nki kernel needs nki.simulate, and the `nki` package is "
        "not importable here"
    )
    assert {c.status for c in checks if c.kernel == "rmsnorm"} == {"ok"}
    result = run_nkibuild([*VERIFY, "--mode", "reference"], nki_project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "matmul_tiled/square [nki kernel under nki.simulate]: skipped (not runnable on the CPU"
        in result.stdout
    )
    assert "all ok (2 skipped: nothing compared)" in result.stdout
    hlo = EXAMPLES / "nkibuild.yaml"
    [softmax] = [c for c in checks_of(hlo.parent) if c.kernel == "softmax"]
    assert softmax.status == "skipped"
    assert softmax.skipped == (
        "not runnable on the CPU: an hlo kernel is a prebuilt module, not source code"
    )


def test_with_the_double_nki_kernels_run_under_its_simulate(nki_project: Path) -> None:
    reference = nki_project / "kernels" / "reference.py"
    reference.write_text(
        reference.read_text().replace("np.matmul(lhsT.T, rhs)", "lhsT.T @ rhs + 1")
    )
    result = run_nkibuild([*VERIFY, "--mode", "reference", "--with-double", "--json"], nki_project)
    assert result.returncode == 1, result.stdout + result.stderr
    mode = "nki kernel under nki.simulate (toolchain double's nki)"
    simulated = [c for c in json.loads(result.stdout) if c["mode"] == mode]
    assert [c["status"] for c in simulated] == ["failed", "failed"]
    assert "the nki kernel disagrees with its reference" in simulated[0]["problems"][0]


# --- the opt-in build step ---------------------------------------------------


def task_names(project: Path) -> list[str]:
    from helpers import load_context

    from nkibuild.graph.tasks import task_dicts
    from nkibuild.settings import BuildOptions

    context = load_context(
        project / "nkibuild.yaml",
        project / "build",
        project / "dist",
        BuildOptions(toolchain="fake"),
    )
    return [task["basename"] for task in task_dicts(context)]


def test_verify_true_adds_a_verify_task_between_bundle_and_wheel(tmp_path: Path) -> None:
    assert task_names(jax_project(tmp_path / "off", bias=0.0))[-2:] == ["bundle", "wheel"]
    on = jax_project(tmp_path / "on", bias=0.0, top="verify: true")
    assert task_names(on)[-3:] == ["bundle", "verify", "wheel"]


def test_the_verify_step_fails_on_a_disagreeing_kernel(tmp_path: Path) -> None:
    project = jax_project(tmp_path / "p", bias=1.0, top="verify: true")
    summary = build(project, "verify")
    [failure] = summary.failures
    assert failure.name == "verify"
    assert failure.detail.startswith("verify: 2 of 4 checks failed")
    assert (
        "scale/small [jax kernel on the CPU]: the jax kernel disagrees with its reference "
        "(kernels/reference.py:scale): float32[8,16] max abs error 1," in failure.detail
    )
    report = json.loads((project / "build" / "verify" / "checks.json").read_text())
    assert [(c["mode"], c["status"]) for c in report] == [
        ("jax kernel on the CPU", "failed"),
        ("jax kernel on the CPU", "failed"),
        ("reference", "ok"),  # the bundle's reference has the NEFFs' signature
        ("reference", "ok"),
    ]
    # A failure sticks: the next build checks again and fails again.
    assert [f.name for f in build(project, "verify").failures] == ["verify"]


def test_the_verify_step_passes_and_reruns_only_on_change(tmp_path: Path) -> None:
    project = jax_project(tmp_path / "p", bias=0.0, top="verify: true")
    summary = build(project, "verify")
    assert summary.ok, [f.detail for f in summary.failures]
    [outcome] = [o for o in summary.outcomes if o.name == "verify"]
    assert (outcome.status, outcome.detail) == ("done", "4 checks passed")
    report = project / "build" / "verify" / "checks.json"
    written = report.read_bytes()
    assert "verify" in build(project, "verify").up_to_date
    reference = project / "kernels" / "reference.py"
    reference.write_text(REFERENCE.replace("return alpha * x", "return x * alpha"))
    again = build(project, "verify")
    assert "verify" in again.executed and again.ok
    assert report.read_bytes() == written  # no timings: the same results, the same bytes


def test_a_reference_saved_while_verify_runs_is_checked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 30 class 2 for the verify step: the checks passed against the reference as it
    was; the one saved meanwhile disagrees, and is what the step must answer for."""
    import nkibuild.verify.task as verify_task

    project = jax_project(tmp_path / "p", bias=0.0, top="verify: true")
    real_checks, runs = verify_task.build_checks, []

    def checks_then_save(context: object) -> object:
        checks = real_checks(context)
        runs.append(1)
        if len(runs) == 1:  # the user saves while the first run checks
            saved = REFERENCE.replace("return alpha * x", "return alpha * x + 1")
            (project / "kernels" / "reference.py").write_text(saved)
        return checks

    monkeypatch.setattr(verify_task, "build_checks", checks_then_save)
    summary = build(project, "verify")
    assert len(runs) == 2
    assert [f.name for f in summary.failures] == ["verify"]  # not passed on the old one


def test_the_verify_step_names_what_it_skipped(nki_project: Path) -> None:
    manifest = nki_project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("kernels:\n", "verify: true\nkernels:\n", 1))
    summary = build(nki_project, "verify")
    assert summary.ok, [f.detail for f in summary.failures]
    [outcome] = [o for o in summary.outcomes if o.name == "verify"]
    assert outcome.detail == "6 checks passed, 2 skipped"
    [notice] = outcome.notices
    assert notice.startswith(
        "matmul_tiled (square, narrow) skipped: not runnable on the CPU: an nki kernel needs "
        "nki.simulate"
    )


def test_verify_named_before_the_wheel_stops_the_build_before_it(tmp_path: Path) -> None:
    """`nkibuild build verify wheel`: a failed verify withholds the wheel, with or
    without --keep-going (the wheel depends on the verify report)."""
    project = jax_project(tmp_path / "p", bias=1.0, top="verify: true")
    summary = build(project, "verify", "wheel")
    assert [f.name for f in summary.failures] == ["verify"]
    assert not list((project / "dist").glob("*.whl"))
    kept_going = build(project, "verify", "wheel", keep_going=True)
    assert [f.name for f in kept_going.failures] == ["verify"]
    assert "wheel" in kept_going.names("blocked")
    assert not list((project / "dist").glob("*.whl"))


def test_a_default_build_runs_verify_and_withholds_the_wheel(tmp_path: Path) -> None:
    project = jax_project(tmp_path / "p", bias=1.0, top="verify: true")
    summary = build(project, keep_going=True)
    assert [f.name for f in summary.failures] == ["verify"]
    assert "wheel" in summary.names("blocked")  # also under --keep-going
    assert not list((project / "dist").glob("*.whl"))
    (project / "kernels" / "utils.py").write_text("BIAS = 0.0\n")
    assert build(project).ok
    assert list((project / "dist").glob("*.whl"))
