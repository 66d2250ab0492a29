"""Incremental builds, asserted through what doit executed (its own state), not timing."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import build, pretend_new_compiler

from nkibuild.graph.loader import DEP_FILE
from nkibuild.graph.report import BuildSummary

pytest.importorskip("jax")

ALL_COMPILES = {
    "compile:scaled_add/small/trn1",
    "compile:scaled_add/small/trn2",
    "compile:scaled_add/large/trn1",
    "compile:scaled_add/large/trn2",
    "compile:matmul_rowsum/default/trn1",
    "compile:matmul_rowsum/default/trn2",
    "compile:softmax/default/trn2",
}


def ran(summary: BuildSummary, prefix: str) -> set[str]:
    return {name for name in summary.executed if name.startswith(prefix)}


@pytest.fixture
def built(example_project: Path) -> Path:
    first = build(example_project)
    assert first.ok, first.to_json()
    assert ran(first, "compile:") == ALL_COMPILES
    assert {"bundle", "wheel"} <= set(first.executed)
    return example_project


def test_no_change_runs_nothing(built: Path) -> None:
    summary = build(built)
    assert summary.ok
    assert summary.executed == []
    assert len(summary.up_to_date) == len(ALL_COMPILES) + 4 + 2  # 4 extractions, bundle, wheel


def test_editing_one_kernel_file_reruns_only_its_tasks(built: Path) -> None:
    source = built / "kernels" / "jax_kernels.py"
    source.write_text(source.read_text().replace("return alpha * x + y", "return alpha * x - y"))
    summary = build(built)
    assert summary.ok
    # Both kernels in the edited file are re-traced; only the changed HLO is recompiled.
    assert ran(summary, "extract:") == {
        "extract:scaled_add/small",
        "extract:scaled_add/large",
        "extract:matmul_rowsum/default",
    }
    assert ran(summary, "compile:") == {u for u in ALL_COMPILES if "scaled_add" in u}
    assert {"bundle", "wheel"} <= set(summary.executed)


def test_replacing_a_prebuilt_hlo_reruns_only_that_kernel(built: Path) -> None:
    import jax
    import jax.numpy as jnp

    def log_softmax(logits: jax.Array) -> jax.Array:
        return jax.nn.log_softmax(logits, axis=-1)

    sample = jax.ShapeDtypeStruct((64, 1024), jnp.float32)
    proto = jax.jit(log_softmax).lower(sample).compiler_ir("hlo").as_serialized_hlo_module_proto()
    (built / "kernels" / "softmax.hlo.pb").write_bytes(proto)
    summary = build(built)
    assert ran(summary, "extract:") == {"extract:softmax/default"}
    assert ran(summary, "compile:") == {"compile:softmax/default/trn2"}


def test_changing_one_targets_flag_reruns_only_those_compiles(built: Path) -> None:
    manifest = built / "nkibuild.yaml"
    text = manifest.read_text()
    assert "trn1: {optlevel: 1}" in text
    manifest.write_text(text.replace("trn1: {optlevel: 1}", "trn1: {optlevel: 3}"))
    summary = build(built)
    assert ran(summary, "extract:") == set()
    assert ran(summary, "compile:") == {
        "compile:scaled_add/small/trn1",
        "compile:scaled_add/large/trn1",
    }


def test_changing_a_constant_retraces_that_kernel_only(built: Path) -> None:
    manifest = built / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("alpha: 0.5", "alpha: 0.25"))
    summary = build(built)
    assert ran(summary, "extract:") == {"extract:scaled_add/small", "extract:scaled_add/large"}
    assert ran(summary, "compile:") == {u for u in ALL_COMPILES if "scaled_add" in u}


def test_changing_a_shape_rebuilds_that_variant_only(built: Path) -> None:
    manifest = built / "nkibuild.yaml"
    text = manifest.read_text()
    manifest.write_text(
        text.replace(
            "large: {x: [1024, 512], y: [1024, 512]}", "large: {x: [2048, 512], y: [2048, 512]}"
        )
    )
    summary = build(built)
    assert ran(summary, "extract:") == {"extract:scaled_add/large"}
    assert ran(summary, "compile:") == {
        "compile:scaled_add/large/trn1",
        "compile:scaled_add/large/trn2",
    }


def test_moving_a_kernel_within_the_manifest_rebuilds_nothing(built: Path) -> None:
    manifest = built / "nkibuild.yaml"
    manifest.write_text("# a comment shifts every line\n\n" + manifest.read_text())
    summary = build(built)
    # Only the bundle's provenance summary (the manifest's sha256) and so the wheel change.
    assert summary.executed == ["bundle", "wheel"]


def test_compiler_version_change_recompiles_everything(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_new_compiler(monkeypatch)
    summary = build(built)
    assert ran(summary, "extract:") == set()
    assert ran(summary, "compile:") == ALL_COMPILES


def test_rerun_after_lost_doit_state_compiles_nothing(built: Path, isolated_cache: Path) -> None:
    # doit saves its state only at the end of a run; a killed build loses it.
    (built / "build" / "state" / DEP_FILE).unlink()
    summary = build(built)
    assert summary.ok
    assert summary.origins.get("compiled", 0) == 0
    assert summary.origins.get("build-dir", 0) == len(ALL_COMPILES)


def test_touching_a_source_without_changing_it_runs_nothing(built: Path) -> None:
    source = built / "kernels" / "jax_kernels.py"
    source.write_text(source.read_text())  # new mtime, same content
    summary = build(built)
    # doit's md5 checker compares the touched file's content, not just its stat.
    assert summary.executed == []


def test_touching_a_neff_without_changing_it_runs_nothing(built: Path) -> None:
    neff = built / "build" / "compile" / "softmax" / "default" / "trn2" / "model.neff"
    neff.write_bytes(neff.read_bytes())  # new stat, same content: the outputs check hashes it
    assert build(built).executed == []


def test_a_changed_neff_is_compiled_again_and_shipped(built: Path) -> None:
    neff = built / "build" / "compile" / "softmax" / "default" / "trn2" / "model.neff"
    original = neff.read_bytes()
    neff.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    summary = build(built)
    assert summary.ok
    assert "compile:softmax/default/trn2" in summary.executed
    assert neff.read_bytes() == original


def test_deleting_an_output_rebuilds_just_that_output(built: Path) -> None:
    wheel = next((built / "dist").glob("*.whl"))
    wheel.unlink()
    summary = build(built)
    assert summary.executed == ["wheel"]
    assert wheel.exists()


def test_a_selection_runs_what_it_names_and_the_next_build_the_rest(built: Path) -> None:
    (built / "build" / "compile" / "softmax" / "default" / "trn2" / "model.neff").unlink()
    wheel = next((built / "dist").glob("*.whl"))
    wheel.unlink()
    summary = build(built, "compile:softmax/*")
    assert summary.executed == ["compile:softmax/default/trn2"]
    assert not wheel.exists()
    # What the selection skipped runs now (the compile record says where its NEFF came from).
    assert build(built).executed == ["bundle", "wheel"]
    assert wheel.exists()


def test_a_passed_variable_reruns_extraction_only(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NKIBUILD_PASS_ENV", "KERNEL_TUNING")
    monkeypatch.setenv("KERNEL_TUNING", "1")
    first = build(built)
    assert len(ran(first, "extract:")) == 4  # the variable entered every extraction's check
    monkeypatch.setenv("KERNEL_TUNING", "2")
    second = build(built)
    assert len(ran(second, "extract:")) == 4
    assert ran(second, "compile:") == set()  # same HLO: nothing to recompile


def test_another_bundle_or_wheel_writer_writes_both_again(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upgraded nkibuild may write other bytes for the same bundle.json."""
    monkeypatch.setattr("nkibuild.code_digest", lambda: "another writer")
    assert build(built).executed == ["bundle", "wheel"]
