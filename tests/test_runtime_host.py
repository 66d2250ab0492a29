"""The bundle runtime on real hosts: which target an instance type means, what counts as
a usable runtime binding, the Neuron SDK check, and simulate mode with the unit's lnc and target."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import build, write_project

from nkibuild.bundle import runtime
from nkibuild.bundle.runtime import KernelError, host_target
from nkibuild.toolchain_double import FAKES_DIR  # the double's nki, to simulate with


@pytest.fixture
def instance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str | None], None]:
    """Pretend this host is an EC2 instance of a given type."""
    monkeypatch.delenv(runtime.TARGET_ENV, raising=False)

    def pretend(instance_type: str | None) -> None:
        product = tmp_path / "product_name"
        if instance_type is None:
            product.unlink(missing_ok=True)
        else:
            product.write_text(instance_type + "\n")
        monkeypatch.setattr(runtime, "PRODUCT_NAME_FILE", str(product))

    return pretend


@pytest.mark.parametrize(
    ("instance_type", "target"),
    [
        ("trn1.2xlarge", "trn1"),
        ("trn1.32xlarge", "trn1"),
        ("trn1n.32xlarge", "trn1"),
        ("trn2.48xlarge", "trn2"),
        ("trn2u.48xlarge", "trn2"),
        ("trn3.48xlarge", "trn3"),
        ("m7i.large", None),  # no Neuron device: reference mode is right
        (None, None),  # not on EC2 at all
    ],
)
def test_instance_families_map_to_their_targets(
    instance, instance_type: str | None, target: str | None
) -> None:
    instance(instance_type)
    assert host_target() == target


@pytest.mark.parametrize("instance_type", ["inf2.xlarge", "trn4.48xlarge", "inf1.2xlarge"])
def test_an_unknown_neuron_family_is_an_error_not_a_fallback(instance, instance_type: str) -> None:
    instance(instance_type)
    with pytest.raises(KernelError, match=rf"this host is a {instance_type} instance") as error:
        host_target()
    assert "NKIBUILD_TARGET" in str(error.value) and "NKIBUILD_MODE=reference" in str(error.value)


def test_the_target_override_is_checked(instance, monkeypatch: pytest.MonkeyPatch) -> None:
    instance("m7i.large")
    monkeypatch.setenv(runtime.TARGET_ENV, "trn2")
    assert host_target() == "trn2"
    monkeypatch.setenv(runtime.TARGET_ENV, "trn9")
    with pytest.raises(KernelError, match="NKIBUILD_TARGET='trn9' is not a target"):
        host_target()


def test_the_sdk_range_is_checked_only_against_a_known_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(runtime.SDK_VERSION_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "spike._spike", raising=False)  # not the double's core
    real = runtime.Binding("spike", "spike is importable")
    runtime._check_sdk("pkg.kernel", ">=2.29,<3", real)  # no version reported: not checked
    monkeypatch.setenv(runtime.SDK_VERSION_ENV, "2.30.1")
    runtime._check_sdk("pkg.kernel", ">=2.29,<3", real)
    monkeypatch.setenv(runtime.SDK_VERSION_ENV, "2.28.0")
    with pytest.raises(KernelError, match=r"built for Neuron SDK >=2\.29,<3, but this host has"):
        runtime._check_sdk("pkg.kernel", ">=2.29,<3", real)


def binding_with(tmp_path: Path, files: dict[str, str]) -> str:
    """The binding a process gets with `files` on its path: name, then why."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    script = "from nkibuild.bundle.runtime import runtime_binding as b; print(*b(), sep='\\n')"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def test_pypis_unrelated_spike_does_not_count(tmp_path: Path) -> None:
    found = binding_with(tmp_path, {"spike/__init__.py": "'an unrelated simulator'\n"})
    assert found.startswith("None\nnrtpy is not importable")
    assert "spike is not importable (not PyPI's unrelated 'spike'" in found


def test_a_spike_whose_native_core_cannot_load_does_not_count(tmp_path: Path) -> None:
    # As a spike built without libnrt: the extension module fails to load.
    broken = "raise ImportError('libnrt.so.1: cannot open shared object file')\n"
    found = binding_with(tmp_path, {"spike/__init__.py": "", "spike/_spike.py": broken})
    assert found.startswith("None\n") and "libnrt.so.1" in found


def test_a_spike_with_its_native_core_counts(tmp_path: Path) -> None:
    files = {"spike/__init__.py": "", "spike/_spike.py": "IS_NATIVE = True\n"}
    assert binding_with(tmp_path, files).splitlines()[0] == "spike"


KERNEL = """\
import os

import nki
import nki.language as nl

TARGET_CODES = {"trn1": 10.0, "trn2": 20.0, "trn3": 30.0}


@nki.jit
def probe(a):
    # What the simulator ran with: the launch grid, and the target NKI lowers for.
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    code = TARGET_CODES.get(os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"), 0.0)
    nl.store(out, nl.add(nl.multiply(nl.load(a), 0.0), nl.num_programs() + code))
    return out
"""
MANIFEST = """\
format-version: 1
package: {name: probe-kernels, version: 1.0.0}
defaults: {targets: [TARGET]}
kernels:
  probe:
    frontend: nki
    source: kernels/k.py:probe
    inputs:
      a: {shape: [128, 64], dtype: float32}
"""


@pytest.mark.parametrize(
    ("nki", "target", "expected"),
    # NKI 0.3 dropped trn1; NKI 0.7 takes the grid from NEURON_LOGICAL_NC_CONFIG, not kernel[2]
    [("0.2.0", "trn1", 11.0), ("0.3.0", "trn2", 22.0), ("0.7.0", "trn3", 32.0)],
)
def test_simulate_runs_with_the_units_lnc_and_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nki: str, target: str, expected: float
) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_NKI_VERSION", nki)
    files = {"kernels/k.py": KERNEL}
    project = write_project(tmp_path / "p", MANIFEST.replace("TARGET", target), files)
    summary = build(project, "bundle")
    assert summary.ok, summary.to_json()
    (bundle,) = (project / "build" / "bundle").iterdir()
    script = textwrap.dedent(
        """
        import numpy as np
        from probe_kernels import probe
        print(float(probe(np.ones((128, 64), np.float32), mode="simulate")[0, 0]))
        """
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NEURON_")},
        "PYTHONPATH": os.pathsep.join([str(bundle), str(FAKES_DIR)]),
        runtime.TARGET_ENV: target,
    }
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    # lnc auto: 1 on trn1, 2 on trn2 (the grid), plus the target's code.
    assert float(result.stdout.strip()) == expected
