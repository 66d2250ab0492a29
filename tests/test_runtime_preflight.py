"""The preflight before a NEFF's first load: what each bundle records per NEFF (compiler
version, NEFF format, target, lnc) against the host's instance family, its runtime's lnc
and, where reported, the runtime's version. A mismatch is one KernelError naming both
sides and the way out, before the runtime sees the NEFF. Run through the toolchain
double, which reports the host and runtime version a test configures, on both bindings."""

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

from nkibuild.bundle import runtime
from nkibuild.toolchain_double import FAKE_RUNTIME_DIR

CALL = """
    import numpy as np
    from softmax_kernels import softmax
    from softmax_kernels._runtime import KernelError
    try:
        print(softmax(np.zeros((64, 1024), np.float32), mode="{mode}").shape)
    except KernelError as error:
        print(error)
"""
BINDINGS = ["nrtpy", "spike"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("preflight")
    project = softmax_project(root / "p", softmax_manifest(reference=True))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NKIBUILD_CACHE_DIR", str(root / "cache"))
        assert build(project, "bundle").ok
    return project / "build" / "bundle" / "softmax-kernels"


def call(bundle: Path, log: Path, mode: str = "neuron", **env: str) -> tuple[str, list[str]]:
    """What a call printed, and the events the double's runtime saw."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("NKIBUILD_", "NEURON_", "PYTHON"))
    }
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CALL.format(mode=mode))],
        capture_output=True,
        text=True,
        env={
            **clean,
            "PYTHONPATH": os.pathsep.join([str(bundle), str(FAKE_RUNTIME_DIR)]),
            "NKIBUILD_FAKE_SPIKE_LOG": str(log),
            **env,
        },
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    events = (
        [json.loads(line)["event"] for line in log.read_text().splitlines()] if log.exists() else []
    )
    return result.stdout.strip(), events


def test_each_neff_records_what_the_preflight_compares(bundle: Path) -> None:
    neffs = json.loads((bundle / "softmax_kernels" / "_build.json").read_text())
    recorded = {
        target: (
            n["default"]["neff_version"],
            n["default"]["lnc"],
            n["default"]["compiler_version"],
        )
        for target, n in neffs["kernels"]["softmax"]["neffs"].items()
    }
    assert recorded == {
        "trn1": ("2.0", 1, "2.23.0.0+nkibuild.fake"),
        "trn2": ("2.0", 2, "2.23.0.0+nkibuild.fake"),
    }


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_trn1_neff_on_trn2_needs_the_legacy_switch(
    bundle: Path, tmp_path: Path, binding: str
) -> None:
    host = {"NKIBUILD_RUNTIME": binding, "NKIBUILD_FAKE_RUNTIME_INSTANCE": "trn2.48xlarge"}
    said, events = call(bundle, tmp_path / "refused.jsonl", NKIBUILD_TARGET="trn1", **host)
    assert said == (
        "softmax_kernels.softmax: this is the trn1 NEFF but this host is a trn2.48xlarge (trn2) "
        "instance; run its trn2 NEFF (NKIBUILD_TARGET=trn2 or unset) or set "
        "NEURON_RT_ALLOW_LEGACY_NEFF=1 to run the trn1 NEFF on trn2; this NEFF was compiled "
        "for lnc=1 but the Neuron runtime runs trn2's default lnc=2 (NEURON_LOGICAL_NC_CONFIG "
        "unset); set NEURON_LOGICAL_NC_CONFIG=1 or rebuild with lnc: 2 in nkibuild.yaml"
    )
    assert events == []  # the runtime never saw the NEFF
    legacy = {"NEURON_RT_ALLOW_LEGACY_NEFF": "1", "NEURON_LOGICAL_NC_CONFIG": "1"}
    said, events = call(bundle, tmp_path / "ok.jsonl", NKIBUILD_TARGET="trn1", **host, **legacy)
    assert (said, events) == ("(64, 1024)", ["load", "call"])


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_newer_targets_neff_on_an_older_host_is_refused(
    bundle: Path, tmp_path: Path, binding: str
) -> None:
    said, events = call(
        bundle,
        tmp_path / "calls.jsonl",
        NKIBUILD_RUNTIME=binding,
        NKIBUILD_TARGET="trn2",
        NKIBUILD_FAKE_RUNTIME_INSTANCE="trn1.32xlarge",
        NEURON_RT_ALLOW_LEGACY_NEFF="1",  # only for a trn1 NEFF on trn2
    )
    assert said.startswith(
        "softmax_kernels.softmax: this is the trn2 NEFF but this host is a trn1.32xlarge (trn1) "
        "instance; run its trn1 NEFF (NKIBUILD_TARGET=trn1 or unset); this NEFF was compiled for "
        "lnc=2 but the Neuron runtime runs trn1's default lnc=1"
    )
    assert events == []


def test_a_host_of_a_target_not_built_says_to_rebuild(bundle: Path, tmp_path: Path) -> None:
    said, events = call(
        bundle,
        tmp_path / "calls.jsonl",
        NKIBUILD_TARGET="trn2",
        NKIBUILD_FAKE_RUNTIME_INSTANCE="trn3.48xlarge",
    )
    assert events == []  # the runtime never saw the NEFF
    assert said == (
        "softmax_kernels.softmax: this is the trn2 NEFF but this host is a trn3.48xlarge (trn3) "
        "instance; rebuild it for trn3 (built: trn1, trn2)"
    )


@pytest.mark.parametrize("binding", BINDINGS)
def test_the_runtime_version_is_checked_where_reported(
    bundle: Path, tmp_path: Path, binding: str
) -> None:
    host = {"NKIBUILD_RUNTIME": binding, "NKIBUILD_TARGET": "trn2"}
    old = {**host, "NKIBUILD_FAKE_RUNTIME_VERSION": "1.5.2"}
    said, events = call(bundle, tmp_path / "old.jsonl", **old)
    assert said == (
        "softmax_kernels.softmax: this NEFF (format 2.0, from neuronx-cc 2.23.0.0+nkibuild.fake) "
        f"needs a Neuron runtime >= 1.6.5, but {binding} runs on runtime 1.5.2; upgrade the "
        "Neuron runtime or rebuild with a compiler that writes an older NEFF format"
    )
    assert events == []
    current = {**host, "NKIBUILD_FAKE_RUNTIME_VERSION": "2.29.0"}
    assert call(bundle, tmp_path / "new.jsonl", **current) == ("(64, 1024)", ["load", "call"])


def test_a_set_lnc_must_match(bundle: Path, tmp_path: Path) -> None:
    said, events = call(
        bundle, tmp_path / "calls.jsonl", NKIBUILD_TARGET="trn2", NEURON_LOGICAL_NC_CONFIG="1"
    )
    assert said == (
        "softmax_kernels.softmax: this NEFF was compiled for lnc=2 but the Neuron runtime is set "
        "to NEURON_LOGICAL_NC_CONFIG=1; set NEURON_LOGICAL_NC_CONFIG=2 or rebuild with lnc: 1 in "
        "nkibuild.yaml"
    )
    assert events == []


def test_auto_mode_raises_rather_than_falling_back(bundle: Path, tmp_path: Path) -> None:
    # As a bundle of real NEFFs records them (auto never tries placeholders).
    real = tmp_path / "real"
    shutil.copytree(bundle, real)
    record = real / "softmax_kernels" / "_build.json"
    record.write_text(record.read_text().replace('"placeholder":true', '"placeholder":false'))
    said, events = call(
        real,
        tmp_path / "calls.jsonl",
        mode="auto",
        NKIBUILD_TARGET="trn1",
        NKIBUILD_FAKE_RUNTIME_INSTANCE="trn2.48xlarge",
        NEURON_LOGICAL_NC_CONFIG="1",
    )
    assert said.startswith("softmax_kernels.softmax: this is the trn1 NEFF but this host is a")
    assert events == []


def test_a_real_host_is_read_from_its_product_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    product = tmp_path / "product_name"
    product.write_text("trn2.3xlarge\n")
    monkeypatch.setattr(runtime, "PRODUCT_NAME_FILE", str(product))
    monkeypatch.delitem(sys.modules, "nrtpy", raising=False)  # not the double's core
    monkeypatch.delenv(runtime.LNC_ENV, raising=False)
    monkeypatch.delenv(runtime.LEGACY_NEFF_ENV, raising=False)
    binding = runtime.Binding("nrtpy", "nrtpy is importable")
    neff = {"lnc": 2, "neff_version": "2.0", "compiler_version": "2.23.6484.0"}
    runtime._preflight("pkg.k", "trn2", neff, binding, ["trn2"])  # matches: no error
    with pytest.raises(runtime.KernelError, match=r"^pkg\.k: this is the trn1 NEFF but this host"):
        runtime._preflight("pkg.k", "trn1", neff, binding, ["trn1", "trn2"])
    monkeypatch.setenv(runtime.LEGACY_NEFF_ENV, "1")
    runtime._preflight("pkg.k", "trn1", neff, binding, ["trn1"])
    product.unlink()  # off EC2: no family, no default lnc, nothing to compare
    runtime._preflight("pkg.k", "trn1", {**neff, "lnc": 1}, binding, ["trn1"])
