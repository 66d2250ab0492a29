"""Shared fixtures: example projects in temp dirs, an isolated NEFF cache, CLI runners."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"


def pytest_configure(config: pytest.Config) -> None:
    """The Ctrl-C tests rely on SIGINT raising KeyboardInterrupt here and killing the
    builds they start: a launcher that ignores SIGINT (nohup, some CI runners, `trap ''
    INT`) passes that on to every process, so the disposition is set, not assumed."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Never touch the developer's real NEFF cache; never inherit their compiler flags."""
    cache = tmp_path_factory.mktemp("neff-cache")
    monkeypatch.setenv("NKIBUILD_CACHE_DIR", str(cache))
    monkeypatch.delenv("NEURON_CC_FLAGS", raising=False)
    monkeypatch.delenv("NKIBUILD_TOOLCHAIN", raising=False)
    monkeypatch.delenv("NKIBUILD_MODE", raising=False)
    for variable in (
        "NKIBUILD_REMOTE_CACHE",
        "NKIBUILD_CACHE_READ_ONLY",
        "NKIBUILD_NEURONX_CC",
        "NKIBUILD_MAX_COMPILE_MEMORY",
        "NKIBUILD_COMPILE_TIMEOUT",
    ):
        monkeypatch.delenv(variable, raising=False)
    return cache


@pytest.fixture
def example_project(tmp_path: Path) -> Path:
    """A private copy of examples/ (without build outputs)."""
    project = tmp_path / "project"
    shutil.copytree(
        EXAMPLES, project, ignore=shutil.ignore_patterns("build", "dist", "__pycache__")
    )
    return project


def run_nkibuild(
    args: Sequence[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, as users run it."""
    return subprocess.run(
        [sys.executable, "-m", "nkibuild", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "CI": "true", **(env or {})},
        check=False,
    )
