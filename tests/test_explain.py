"""`nkibuild explain`: each input of a unit's key, changed, is named as the cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import build, pretend_new_compiler, softmax_manifest, softmax_project

from nkibuild.context import load_context
from nkibuild.graph.explain import Explanation, explain
from nkibuild.settings import BuildOptions

MANIFEST = softmax_manifest(
    "{name: explained, version: 0.1.0}", defaults="{targets: [trn1, trn2], optlevel: 2}"
)
TRN1 = "softmax/default/trn1"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = softmax_project(tmp_path / "p", MANIFEST)
    assert build(root).ok
    return root


def why(root: Path, *names: str) -> dict[str, Explanation]:
    context = load_context(
        root / "nkibuild.yaml", root / "build", root / "dist", BuildOptions(toolchain="fake")
    )
    return {e.unit: e for e in explain(context, list(names))}


def test_a_fresh_build_dir_has_never_built_anything(tmp_path: Path) -> None:
    root = softmax_project(tmp_path / "p", MANIFEST)
    explained = why(root, TRN1)[TRN1]
    assert explained.rebuild
    assert explained.reasons == (
        "extraction softmax/default never ran in this build directory",
        "never compiled in this build directory",
    )


def test_after_a_build_everything_is_up_to_date(project: Path) -> None:
    explained = why(project)
    assert sorted(explained) == [TRN1, "softmax/default/trn2"]
    assert not any(e.rebuild for e in explained.values())
    assert "the NEFF in the build directory is current" in explained[TRN1].outcome


def test_a_changed_source_file_is_named(project: Path) -> None:
    hlo = project / "kernels" / "softmax.hlo.pb"
    hlo.write_bytes(hlo.read_bytes() + b"\0")
    (reason,) = why(project, TRN1)[TRN1].reasons
    assert reason.startswith("file kernels/softmax.hlo.pb changed (sha256 ")


def test_a_changed_flag_names_the_arguments_and_the_cache_lookup(project: Path) -> None:
    manifest = project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("optlevel: 2", "optlevel: 3"))
    explained = why(project, "softmax")
    reason = explained[TRN1].reasons[0]
    assert reason.startswith("compiler arguments: `--target trn1 --lnc 1 --optlevel 2")
    assert reason.endswith("-> `--target trn1 --lnc 1 --optlevel 3 --auto-cast none`")
    assert "compile with neuronx-cc" in explained[TRN1].outcome
    manifest.write_text(manifest.read_text().replace("optlevel: 3", "optlevel: 2"))
    (project / "build" / "compile" / TRN1 / "model.neff").unlink()
    explained = why(project, TRN1)[TRN1]
    assert explained.reasons == ("the NEFF of the last build is missing or damaged",)
    assert explained.outcome.startswith("no compile: key ")  # the shared cache has it
    assert explained.render().startswith(f"{TRN1}: NEFF taken from the cache (no compile)\n")
    assert explained.action == "fetch" and explained.rebuild


def test_compiler_version_and_neuron_cc_flags_are_named(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pretend_new_compiler(monkeypatch)
    monkeypatch.setenv("NEURON_CC_FLAGS", "--verbose info")
    reasons = why(project, TRN1)[TRN1].reasons
    assert reasons == (
        "compiler version: '2.23.0.0+nkibuild.fake' -> '2.99.0.0+other'",
        "NEURON_CC_FLAGS: '' -> '--verbose info'",
    )


def test_passed_variables_are_named_without_their_values(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NKIBUILD_PASS_ENV", "ACME_TOKEN")
    monkeypatch.setenv("ACME_TOKEN", "s3cr3t")
    (reason,) = why(project, TRN1)[TRN1].reasons
    assert reason == "passed environment variables changed: ACME_TOKEN"


def test_cli_explain_text_json_and_unknown_units(project: Path) -> None:
    manifest = project / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("optlevel: 2", "optlevel: 1"))
    text = run_nkibuild(["explain", "--toolchain", "fake", TRN1], project)
    assert text.returncode == 0
    assert text.stdout.startswith(f"{TRN1}: recompiled\n  - compiler arguments: ")
    data = json.loads(run_nkibuild(["explain", "--toolchain", "fake", "--json"], project).stdout)
    assert [e["unit"] for e in data] == [TRN1, "softmax/default/trn2"]
    assert all(e["rebuild"] and e["action"] == "compile" for e in data)
    unknown = run_nkibuild(["explain", "--toolchain", "fake", "softmax/default/trn9"], project)
    assert unknown.returncode == 2 and "did you mean softmax/default/trn" in unknown.stderr


def test_a_re_extraction_whose_hlo_stays_the_same_is_not_called_a_rebuild(
    tmp_path: Path,
) -> None:
    manifest = softmax_manifest(kernel="    deps: [kernels/helpers.py]\n")
    root = softmax_project(tmp_path / "p", manifest, {"kernels/helpers.py": "X = 1\n"})
    assert build(root).ok
    (root / "kernels" / "helpers.py").write_text("X = 2\n")
    explained = why(root, TRN1)[TRN1]
    assert explained.action == "re-extract" and not explained.rebuild
    head, reason = explained.render().splitlines()[:2]
    assert head == f"{TRN1}: re-extracted; recompiled only if its HLO changes"
    assert reason.startswith("  - file kernels/helpers.py changed (sha256 ")
    assert "the NEFF in the build directory is kept (no compile)" in explained.outcome
    summary = build(root)  # and that is what the build does (the bundle records the deps'
    # digests: its provenance summary)
    assert summary.executed == ["extract:softmax/default", "bundle", "wheel"]
    assert not summary.origins
