"""`nkibuild verify`: bundles run on sample inputs against their references, with baselines."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_nkibuild

NKI_PROJECT = EXAMPLES / "nki-nkipy"
VERIFY = ["verify", "--toolchain", "fake"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(NKI_PROJECT, root, ignore=shutil.ignore_patterns("build", "dist"))
    return root


def checks(stdout: str) -> list[dict]:
    return json.loads(stdout)


def test_simulate_and_the_double_pass_and_record_a_baseline(project: Path) -> None:
    command = [*VERIFY, "--mode", "simulate", "--with-double", "--json"]
    result = run_nkibuild(command, project)
    assert result.returncode == 0, result.stdout + result.stderr
    found = checks(result.stdout)
    simulate = [c for c in found if c["mode"] == "simulate (toolchain double's nki)"]
    assert {(c["kernel"], c["variant"]) for c in simulate} == {
        ("matmul_tiled", "square"),
        ("matmul_tiled", "narrow"),
        ("rmsnorm", "tokens_128"),
        ("rmsnorm", "tokens_512"),
    }
    matmul = [c for c in simulate if c["kernel"] == "matmul_tiled"]
    assert all(0 < c["max_abs_error"] < 1e-3 for c in matmul)  # really computed, really close
    double = [c for c in found if c["mode"].startswith("neuron (toolchain double")]
    assert len(double) == 2 * 2 + 2 * 3  # matmul_tiled on trn2, trn3; rmsnorm on trn1 too
    assert all(c["note"].startswith("marshalling only") for c in double)
    baseline = json.loads((project / "build" / "state" / "verify-baseline.json").read_text())
    assert len(baseline) == len(found)


def test_a_grown_error_is_flagged_as_a_regression(project: Path) -> None:
    command = [*VERIFY, "--mode", "simulate", "--with-double"]
    assert run_nkibuild(command, project).returncode == 0
    reference = project / "kernels" / "reference.py"
    # Still within the kernel's tolerance (rtol 1e-4), but far from what it was.
    reference.write_text(
        reference.read_text().replace("np.matmul(lhsT.T, rhs)", "np.matmul(lhsT.T, rhs) * 1.00005")
    )
    result = run_nkibuild(command, project)
    assert result.returncode == 1
    assert "regression: the error grew from" in result.stdout
    accepted = run_nkibuild([*command, "--update-baseline"], project)
    assert accepted.returncode == 0, accepted.stdout
    assert run_nkibuild(command, project).returncode == 0


def test_a_reference_that_disagrees_with_the_neffs_fails(project: Path) -> None:
    reference = project / "kernels" / "reference.py"
    reference.write_text(
        reference.read_text().replace(
            "return np.matmul(lhsT.T, rhs)", "return np.matmul(lhsT.T, rhs).T"
        )
    )
    result = run_nkibuild([*VERIFY, "--mode", "reference"], project)
    assert result.returncode == 1
    assert (
        "the reference returns float32[1024,512] but the trn2 NEFF returns float32[512,1024]"
        in result.stdout
    )


def test_a_wheel_is_verified_where_it_lies(project: Path) -> None:
    assert run_nkibuild(["build", "--toolchain", "fake"], project).returncode == 0
    wheel = project / "dist" / "acme_nki_kernels-0.1.0-py3-none-any.whl"
    result = run_nkibuild(["verify", str(wheel), "--json"], project)
    assert result.returncode == 0, result.stderr
    found = checks(result.stdout)
    assert {c["mode"] for c in found if c["status"] == "ok"} == {"auto -> reference"}
    # A wheel's kernel sources (nki, nkipy: in _sources/) are not run: said so, not passed.
    skipped = [c for c in found if c["status"] == "skipped"]
    assert {(c["kernel"], c["mode"]) for c in skipped} == {
        ("matmul_tiled", "nki kernel under nki.simulate"),
        ("rmsnorm", "nkipy kernel on the CPU"),
    }
    assert len(skipped) == 4 and all(
        c["skipped"].startswith(
            "the wheel carries this kernel's source (in its `_sources` package), but "
            "`verify WHEEL` runs the bundle only: run `nkibuild verify` in the kernel's project"
        )
        for c in skipped
    )
    # The baseline goes to the project's build dir, never next to the wheel.
    assert not wheel.with_suffix(".verify.json").exists()
    assert (project / "build/state/verify-baselines" / f"{wheel.name}.verify.json").is_file()
    not_a_wheel = run_nkibuild(["verify", str(project / "nkibuild.yaml")], project)
    assert not_a_wheel.returncode == 2 and "not a readable wheel" in not_a_wheel.stderr
