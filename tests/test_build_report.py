"""`nkibuild build --report FILE`: a JSON report of every build (finished, failed or
interrupted) with each compile unit's origin, compile time and peak memory."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_nkibuild
from helpers import monorepo, softmax_manifest, softmax_project

from nkibuild.cache.stats import read_log

UNITS = ("softmax/default/trn1", "softmax/default/trn2")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return softmax_project(tmp_path / "project", softmax_manifest())


def build_with_report(project: Path, report: Path, *args: str, **env: str) -> dict[str, Any]:
    result = run_nkibuild(
        ["build", "--toolchain", "fake", "--report", str(report), *args], project, env=env
    )
    assert result.returncode == 0, result.stderr
    return json.loads(report.read_text())


def units(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {unit["unit"]: unit for unit in report["units"]}


def test_the_report_says_where_each_neff_came_from(
    project: Path, tmp_path: Path, isolated_cache: Path
) -> None:
    remote = (tmp_path / "remote").as_uri()
    # The double touches this much memory: the compile's measured peak is at least that.
    first = build_with_report(
        project, tmp_path / "1.json", "--remote-cache", remote, NKIBUILD_FAKE_CC_MEMORY_MB="64"
    )
    assert first["status"] == "ok" and first["ok"] is True and first["command"] == "build"
    compiled = units(first)
    assert sorted(compiled) == list(UNITS)
    for name, unit in compiled.items():
        assert unit["task"] == f"compile:{name}" and unit["status"] == "done"
        assert unit["origin"] == "compiled" and unit["error"] is None
        assert unit["compile_seconds"] > 0 and unit["peak_memory"] >= 64 << 20
    assert first["compiles"]["compiled"] == 2
    assert first["cache"]["local"] == {
        "hits": 0,
        "misses": 2,
        "errors": 0,
        "write_errors": 0,
        "failures": 0,
        "lookups": 2,
        "hit_rate": 0.0,
    }
    assert first["cache"]["remote"]["misses"] == 2

    # Another machine: an empty local cache, the remote shared. The figures are the
    # compile's that made the NEFF, carried by the cache entry.
    shutil.rmtree(project / "build")
    shutil.rmtree(isolated_cache / "neff")
    second = build_with_report(project, tmp_path / "2.json", "--remote-cache", remote)
    for name, unit in units(second).items():
        assert unit["origin"] == "cache-remote"
        assert unit["compile_seconds"] == compiled[name]["compile_seconds"]
        assert unit["peak_memory"] == compiled[name]["peak_memory"]
    assert second["cache"]["local"]["misses"] == 2 and second["cache"]["remote"]["hits"] == 2
    assert second["compiles"]["remote_cache_hits"] == 2

    shutil.rmtree(project / "build")
    third = build_with_report(project, tmp_path / "3.json", "--remote-cache", remote)
    assert {u["origin"] for u in third["units"]} == {"cache-local"}
    assert third["cache"]["local"]["hit_rate"] == 1.0
    assert third["cache"]["remote"]["lookups"] == 0  # the local tier answered

    # doit's state lost (a build killed before saving it): the NEFFs are in the build dir.
    shutil.rmtree(project / "build" / "state")
    fourth = build_with_report(project, tmp_path / "4.json")
    assert {u["origin"] for u in fourth["units"]} == {"build-dir"}
    assert fourth["cache"]["local"]["lookups"] == 0

    fifth = build_with_report(project, tmp_path / "5.json")
    assert [(u["status"], u["origin"]) for u in fifth["units"]] == [("up-to-date", None)] * 2
    assert fifth["status"] == "ok" and fifth["executed"] == []


def test_every_field_of_the_report_is_documented(project: Path, tmp_path: Path) -> None:
    report = build_with_report(project, tmp_path / "report.json")
    docs = (REPO / "docs" / "cli.md").read_text()
    section = docs.split("## Build reports")[1].split("\n## ")[0]
    documented = set(re.findall(r"`([a-z_]+)`", section))
    fields = {*report, *report["units"][0], *report["cache"]["local"], *report["compiles"]}
    assert fields - documented == set()


def test_a_failed_build_reports_what_finished_and_what_failed(
    project: Path, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    result = run_nkibuild(
        ["build", "--toolchain", "fake", "-k", "--report", str(report)],
        project,
        env={"NKIBUILD_FAKE_CC_FAULT": "exit1", "NKIBUILD_FAKE_CC_FAULT_MATCH": "trn2"},
    )
    assert result.returncode == 1
    document = json.loads(report.read_text())
    assert document["status"] == "failed" and document["ok"] is False
    done, failed = (units(document)[name] for name in UNITS)
    assert (done["status"], done["origin"]) == ("done", "compiled")
    assert (failed["status"], failed["origin"]) == ("failed", None)
    assert "neuronx-cc" in failed["error"] and failed["compile_seconds"] is None
    assert document["failed"] == {"compile:softmax/default/trn2": failed["error"]}
    assert document["blocked"] == ["bundle", "wheel"]


def test_an_interrupted_build_still_writes_its_report(
    project: Path, tmp_path: Path, isolated_cache: Path
) -> None:
    report = tmp_path / "report.json"
    counter = tmp_path / "compiles"
    env = {
        "NKIBUILD_FAKE_CC_FAULT": "hang",
        "NKIBUILD_FAKE_CC_FAULT_MATCH": "trn2",
        "NKIBUILD_FAKE_CC_COUNTER": str(counter),
    }
    command = ["build", "--toolchain", "fake", "-j", "2", "--report", str(report)]
    progress = tmp_path / "progress.txt"
    with progress.open("w") as output:
        build = subprocess.Popen(
            [sys.executable, "-m", "nkibuild", *command],
            cwd=project,
            env={**os.environ, "CI": "true", **env},
            stdout=output,
            stderr=subprocess.PIPE,
            text=True,
        )
    # Interrupted once trn1's compile task has finished (reported done, not just its
    # result.json written) and trn2's compiler hangs.
    deadline = time.monotonic() + 120
    while not (
        f"done   compile:{UNITS[0]}" in progress.read_text()
        and counter.exists()
        and len(counter.read_text().split()) >= 2
    ):
        assert build.poll() is None and time.monotonic() < deadline, build.stderr
        time.sleep(0.1)
    build.send_signal(signal.SIGINT)
    _, stderr = build.communicate(timeout=60)
    assert build.returncode == 130, stderr
    assert "Traceback" not in stderr
    document = json.loads(report.read_text())
    assert document["status"] == "interrupted" and document["ok"] is False
    # What finished is there; the compile that was stopped is not.
    assert [(u["unit"], u["origin"]) for u in document["units"]] == [(UNITS[0], "compiled")]
    assert document["cache"]["local"]["misses"] == 2  # both had looked the cache up
    (logged,) = read_log(isolated_cache).builds
    assert logged.tiers["local"].misses == 2


def test_a_report_that_cannot_be_written_fails_the_build_with_a_message(
    project: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    result = run_nkibuild(
        ["build", "--toolchain", "fake", "--report", str(blocker / "report.json")], project
    )
    assert result.returncode == 1
    assert f"error: the build report {blocker / 'report.json'} was not written:" in result.stderr
    assert "Traceback" not in result.stderr
    assert list((project / "dist").glob("*.whl"))  # the build itself finished


def test_a_release_report_covers_every_project(tmp_path: Path, isolated_cache: Path) -> None:
    """Two projects share the softmax kernel on three targets: three compiles, and the
    other project's three units wait for them and take their NEFFs from the cache."""
    root = monorepo(tmp_path / "repo")
    report = tmp_path / "release.json"
    result = run_nkibuild(
        ["release", "--toolchain", "fake", "--out", str(tmp_path / "out"), "--report", str(report)],
        root,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(report.read_text())
    assert document["command"] == "release" and document["status"] == "ok"
    by_task = {u["task"]: u for u in document["units"]}
    assert sorted({task.partition("/")[0] for task in by_task}) == ["alpha-kernels", "beta-kernels"]
    origins = sorted(u["origin"] for u in by_task.values())
    assert origins == ["cache-local"] * 3 + ["compiled"] * 3
    assert all(u["peak_memory"] > 0 for u in by_task.values())
    assert document["cache"]["local"]["hits"] == 3 and document["cache"]["local"]["misses"] == 3
    (logged,) = read_log(isolated_cache).builds
    assert logged.tiers["local"].hits == 3
