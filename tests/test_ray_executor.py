"""--executor ray: compile units run as Ray tasks on a local Ray instance; NEFFs come
back through the cache. Needs Ray (in the test extra); skipped without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import monorepo, softmax_manifest, softmax_project

pytest.importorskip("ray")


def test_a_build_on_ray_compiles_each_unit_in_a_ray_task(tmp_path: Path) -> None:
    manifest = softmax_manifest(defaults="{targets: [trn1, trn2], compile-memory: 256M}")
    root = softmax_project(tmp_path / "p", manifest)
    counter = tmp_path / "compiles"
    env = {"NKIBUILD_FAKE_CC_COUNTER": str(counter), "RAY_AUTH_MODE": "disabled"}
    command = ["build", "--toolchain", "fake", "--executor", "ray", "-j", "2", "--json"]
    result = run_nkibuild(command, root, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["compile_origins"] == {"ray": 2}
    assert len(counter.read_text().splitlines()) == 2  # the workers ran the compiler
    assert len(list((root / "build" / "compile").glob("*/*/*/model.neff"))) == 2
    again = run_nkibuild(command, root, env=env, timeout=600)
    assert json.loads(again.stdout)["executed"] == []  # up to date: Ray is not even started


def test_ray_needs_a_writable_cache(tmp_path: Path) -> None:
    root = softmax_project(tmp_path / "p", softmax_manifest())
    command = ["build", "--toolchain", "fake", "--executor", "ray", "--no-cache"]
    result = run_nkibuild(command, root, timeout=600)
    assert result.returncode == 2  # refused before anything builds
    assert "--executor ray needs a writable NEFF cache" in result.stderr


def test_a_release_compiles_on_ray_once_per_distinct_unit(tmp_path: Path) -> None:
    root = monorepo(tmp_path / "repo")
    counter = tmp_path / "compiles"
    env = {"NKIBUILD_FAKE_CC_COUNTER": str(counter), "RAY_AUTH_MODE": "disabled"}
    command = ["release", ".", "--out", "dist-all", "--toolchain", "fake", "-j", "2"]
    result = run_nkibuild([*command, "--executor", "ray"], root, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert len(counter.read_text().splitlines()) == 3  # shared kernels compile once
    report = json.loads((root / "dist-all" / "release-report.json").read_text())
    origins = [u["origin"] for p in report["projects"] for u in p["units"]]
    assert sorted(origins) == ["cache-local"] * 3 + ["ray"] * 3
