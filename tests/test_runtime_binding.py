"""Which runtime binding a bundle runs its NEFFs through: nrtpy where it is importable,
else spike, NKIBUILD_RUNTIME forcing one; what build_info() and `nkibuild doctor` say
about it; and that a bundle needs neither nki nor neuronx-cc to run. The bindings are
the toolchain double's (nrtpy's is a thin layer on spike's CPU core)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.toolchain_double import FAKE_RUNTIME_DIR

REPO = Path(__file__).resolve().parents[1]
# What a call reports: the binding, why, the model class that ran, and what got imported.
REPORT = """
    import json, sys
    import numpy as np
    from softmax_kernels import build_info, softmax
    from softmax_kernels._runtime import KernelError
    runtime = build_info()["runtime"]
    try:
        out = softmax(np.zeros((64, 1024), np.float32), mode="neuron")
        model = type(softmax.load()).__name__
    except KernelError as error:
        out, model = None, str(error)
    loaded = sorted({"nki", "neuronxcc", "nkibuild", "nrtpy", "spike"} & set(sys.modules))
    print(json.dumps({**runtime, "model": model, "loaded": loaded}))
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("binding")
    project = softmax_project(root / "p", softmax_manifest(reference=True))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NKIBUILD_CACHE_DIR", str(root / "cache"))
        assert build(project, "bundle").ok
    return project / "build" / "bundle" / "softmax-kernels"


def only_spike(tmp_path: Path) -> Path:
    """A directory holding the double's spike and not its nrtpy."""
    shutil.copytree(FAKE_RUNTIME_DIR / "spike", tmp_path / "only-spike" / "spike")
    return tmp_path / "only-spike"


def run(bundle: Path, script: str, *path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("NKIBUILD_", "NEURON_", "PYTHON"))
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env={**clean, "PYTHONPATH": os.pathsep.join(map(str, [bundle, *path])), **env},
        timeout=120,
        check=False,
    )


def report(bundle: Path, *path: Path, **env: str) -> dict:
    result = run(bundle, REPORT, *path, NKIBUILD_TARGET="trn2", **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_nrtpy_is_preferred_where_it_is_importable(bundle: Path, tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    found = report(bundle, FAKE_RUNTIME_DIR, NKIBUILD_FAKE_SPIKE_LOG=str(log))
    assert found["binding"] == "nrtpy" and found["why"] == "nrtpy is importable"
    assert found["double"] is True and found["model"] == "NrtpyModel"
    # It ran on the CPU core nrtpy's double shares with spike's, and nothing of the build.
    assert [json.loads(line)["event"] for line in log.read_text().splitlines()] == ["load", "call"]
    assert found["loaded"] == ["nrtpy", "spike"]


@pytest.mark.parametrize("binding", ["nrtpy", "spike"])
def test_nkibuild_runtime_forces_a_binding(bundle: Path, tmp_path: Path, binding: str) -> None:
    log = tmp_path / "calls.jsonl"
    found = report(
        bundle, FAKE_RUNTIME_DIR, NKIBUILD_RUNTIME=binding, NKIBUILD_FAKE_SPIKE_LOG=str(log)
    )
    assert (found["binding"], found["why"]) == (binding, f"NKIBUILD_RUNTIME={binding}")
    assert found["model"] == f"{binding.title()}Model"
    assert "nrtpy" in found["loaded"] if binding == "nrtpy" else found["loaded"] == ["spike"]
    load = json.loads(log.read_text().splitlines()[0])
    assert Path(load["path"]).parts[-3:] == ("trn2", "softmax", "default.neff")


def test_spike_serves_where_nrtpy_is_not_importable(bundle: Path, tmp_path: Path) -> None:
    found = report(bundle, only_spike(tmp_path))
    assert found["binding"] == "spike" and found["model"] == "SpikeModel"
    assert found["why"].startswith("nrtpy is not importable (install it from the Neuron pip")
    assert found["why"].endswith("; spike is importable")


def test_a_forced_binding_that_is_missing_is_an_error_not_the_other_one(
    bundle: Path, tmp_path: Path
) -> None:
    found = report(bundle, only_spike(tmp_path), NKIBUILD_RUNTIME="nrtpy")
    assert found["binding"] is None and found["loaded"] == []
    assert found["model"].startswith(
        "softmax_kernels.softmax: no Neuron runtime binding can run NEFFs here: nrtpy is not "
        "importable (install it from the Neuron pip repository, in an environment without nki;"
    )
    assert found["model"].endswith(
        "(NKIBUILD_RUNTIME=nrtpy); or run in reference mode (NKIBUILD_MODE=reference)"
    )


def test_an_unknown_binding_is_named(bundle: Path) -> None:
    found = report(bundle, FAKE_RUNTIME_DIR, NKIBUILD_RUNTIME="libnrt")
    assert found["binding"] is None
    assert "NKIBUILD_RUNTIME='libnrt' is not a binding; use nrtpy or spike" in found["model"]


def test_pypis_unrelated_spike_is_no_binding(bundle: Path, tmp_path: Path) -> None:
    # PyPI's `spike` is a simulator without spike's native core.
    (tmp_path / "spike").mkdir()
    (tmp_path / "spike" / "__init__.py").write_text("'an unrelated simulator'\n")
    found = report(bundle, tmp_path)
    assert found["binding"] is None and found["double"] is False
    assert "; spike is not importable (not PyPI's unrelated 'spike'" in found["why"]
    assert "no Neuron runtime binding can run NEFFs here" in found["model"]


def test_the_double_labels_its_nrtpy_core() -> None:
    script = "import nrtpy; print(nrtpy.IS_TOOLCHAIN_DOUBLE, nrtpy.NrtpyTensor.__mro__[1].__name__)"
    result = run(REPO, script, FAKE_RUNTIME_DIR)
    assert result.stdout.split() == ["True", "SpikeTensor"]  # spike's layer, renamed


def doctor(*args: str, path: Path | None = None) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "nkibuild", "doctor", *args],
        capture_output=True,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith(("NKIBUILD_", "PYTHON"))},
            "PYTHONPATH": os.pathsep.join(map(str, [REPO, *([path] if path else [])])),
        },
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_doctor_reports_the_binding_and_why(tmp_path: Path) -> None:
    found = json.loads(doctor("--json", path=FAKE_RUNTIME_DIR))["runtime"]
    assert found == {"binding": "nrtpy", "why": "nrtpy is importable", "double": True}
    line = [x for x in doctor(path=only_spike(tmp_path)).splitlines() if "runtime binding" in x]
    assert line == [
        "runtime binding for bundles here: spike (nkibuild's toolchain double): nrtpy is not "
        "importable (install it from the Neuron pip repository, in an environment without "
        "nki; No module named 'nrtpy'); spike is importable"
    ]
    (line,) = [x for x in doctor().splitlines() if "runtime binding" in x]
    assert line.startswith("runtime binding for bundles here: none: nrtpy is not importable")
    assert line.endswith("; bundles run their references (auto mode)")
