"""What a build does to its process: nothing to the garbage collector of its caller."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.cli.main import main


def test_a_build_leaves_the_collector_as_it_found_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    root = softmax_project(tmp_path / "p", softmax_manifest("{name: policy, version: 0.1.0}"))
    assert build(root).ok  # a library caller
    monkeypatch.chdir(root)
    manifest = (root / "nkibuild.yaml").read_text()
    (root / "nkibuild.yaml").write_text(manifest.replace("0.1.0", "0.2.0"))
    assert main(["build", "--toolchain", "fake"]) == 0  # the CLI, with something to run
    assert gc.get_threshold() == thresholds
    assert gc.get_freeze_count() == frozen
    assert gc.isenabled()
