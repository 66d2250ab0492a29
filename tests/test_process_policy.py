"""What a build does to its process: only the CLI, which owns it, tunes the collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.cli.main import main


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """The collector as the test found it."""
    thresholds = gc.get_threshold()
    gc.unfreeze()
    yield
    gc.unfreeze()  # the objects this test's builds froze go back to the collector
    gc.set_threshold(*thresholds)


def test_only_the_cli_moves_what_a_build_loaded_out_of_the_collectors_sight(
    tmp_path: Path, unfrozen: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = softmax_project(tmp_path / "p", softmax_manifest("{name: policy, version: 0.1.0}"))
    assert build(root).ok  # a library caller: its process is left as it is
    assert gc.get_freeze_count() == 0
    monkeypatch.chdir(root)
    manifest = (root / "nkibuild.yaml").read_text()
    (root / "nkibuild.yaml").write_text(manifest.replace("0.1.0", "0.2.0"))
    assert main(["build", "--toolchain", "fake"]) == 0  # something to run: doit runs
    assert gc.get_freeze_count() > 0
