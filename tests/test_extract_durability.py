"""Extracted artifacts are written atomically but not fsync'd (issue 17 goal 5): what a
power loss could tear is found before anything is compiled from it, and redone.

A power loss can leave a renamed file with its size and times but not its bytes, which
the outputs check (trusting unchanged stats, as doit does) would take as intact. Those
tests make the check trust the stats (`trusted_stats`) to stand for that, then show the
compile stage refusing the damaged artifact (the compiler never starts, nothing reaches
the cache) and the next build extracting it again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.cache import LocalCache
from nkibuild.graph import intact

UNITS = ("softmax/default/trn1", "softmax/default/trn2")


def project(root: Path) -> Path:
    return softmax_project(root, softmax_manifest("{name: durable, version: 0.1.0}"))


def artifact_dir(root: Path) -> Path:
    (directory,) = (root / "build" / "extract").glob("**/artifact.json")
    return directory.parent


def trusted_stats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every recorded output passes the outputs check, as one whose stats a power loss
    kept would."""

    def intact_check(self: intact.OutputsIntact, task: Any, values: dict[str, Any]) -> bool:
        return True

    monkeypatch.setattr(intact.OutputsIntact, "__call__", intact_check)


def damage_in_place(path: Path) -> None:
    """Other bytes of the same size, as a torn write leaves them (zeros)."""
    path.write_bytes(bytes(path.stat().st_size))


@pytest.mark.parametrize(
    ("damaged", "why"),
    [
        ("model.hlo_module.pb", "its HLO module is not the one it recorded"),
        ("artifact.json", "its artifact.json is not readable"),
    ],
)
def test_a_torn_artifact_is_never_compiled_and_the_next_build_extracts_it_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    isolated_cache: Path,
    damaged: str,
    why: str,
) -> None:
    root = project(tmp_path / "p")
    assert build(root, "extract:*").ok
    directory = artifact_dir(root)
    clean = {name: (directory / name).read_bytes() for name in ("model.hlo_module.pb",)}
    damage_in_place(directory / damaged)
    counter = tmp_path / "compiles"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_COUNTER", str(counter))

    with monkeypatch.context() as power_loss:
        trusted_stats(power_loss)
        summary = build(root, "compile:*", keep_going=True)
    assert not summary.executed  # the extraction was trusted, and no compile finished
    failures = {failure.name: failure.detail for failure in summary.failures}
    assert sorted(failures) == [f"compile:{unit}" for unit in UNITS]
    first, second = (failures[f"compile:{unit}"] for unit in UNITS)  # -j1: in this order
    assert f"the extracted artifact in {directory} is damaged ({why})" in first
    assert "it was removed and the next build extracts it again" in first
    assert f"the extracted artifact in {directory} is damaged (it has no artifact.json)" in second
    assert all("Traceback" not in detail for detail in failures.values())
    assert not counter.exists()  # the compiler never ran
    assert LocalCache(isolated_cache).entries() == []  # nothing reached the cache
    assert not (directory / "artifact.json").exists()

    summary = build(root, "compile:*")
    assert summary.ok, summary.to_json()
    assert summary.origins == {"compiled": 2}
    assert any(name.startswith("extract:") for name in summary.executed)
    assert (directory / "model.hlo_module.pb").read_bytes() == clean["model.hlo_module.pb"]
    assert json.loads((directory / "artifact.json").read_text())["frontend"] == "hlo"


def test_a_cache_hit_needs_no_intact_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache key is the recorded hash: a NEFF cached for it is the right one whatever
    happened to the module file since, so a hit is not refused for a torn module."""
    assert build(project(tmp_path / "a"), "compile:*").origins == {"compiled": 2}
    root = project(tmp_path / "b")
    assert build(root, "extract:*").ok
    damage_in_place(artifact_dir(root) / "model.hlo_module.pb")
    with monkeypatch.context() as power_loss:
        trusted_stats(power_loss)
        assert build(root, "compile:*").origins == {"cache-local": 2}


class NoRay:
    """A Ray connection that must not be used."""

    def get(self, address: str | None) -> Any:
        raise AssertionError("a Ray task was started for a damaged artifact")


def test_a_torn_module_is_refused_before_a_ray_worker_gets_it(tmp_path: Path) -> None:
    from nkibuild.cache import CacheKey
    from nkibuild.compiler import CompileJob, CompileOptions
    from nkibuild.compiler.ray_executor import RayExecutor
    from nkibuild.context import load_context
    from nkibuild.frontends import DamagedArtifact, load_artifact
    from nkibuild.settings import BuildOptions

    root = project(tmp_path / "p")
    assert build(root, "extract:*").ok
    directory = artifact_dir(root)
    artifact = load_artifact(directory)
    damage_in_place(directory / "model.hlo_module.pb")
    context = load_context(
        root / "nkibuild.yaml", root / "build", root / "dist", BuildOptions(toolchain="fake")
    )
    unit = context.units[0]
    job = CompileJob(unit, artifact, context.toolchain, tmp_path / "out", CacheKey.of(hlo="x"), 0)
    executor = RayExecutor(NoRay(), context.settings.cache, None)  # type: ignore[arg-type]
    with pytest.raises(DamagedArtifact, match="its HLO module is not the one it recorded"):
        executor.produce(job, CompileOptions(), [])
    assert not (directory / "artifact.json").exists()  # forgotten where it was extracted


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ("extract/softmax/default/artifact.json", "its artifact.json is not readable"),
        ("compile/softmax/default/trn2/result.json", "result.json is missing or damaged"),
    ],
)
def test_a_torn_record_the_bundle_reads_fails_one_build_and_the_next_redoes_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    isolated_cache: Path,
    record: str,
    message: str,
) -> None:
    """The bundle reads each unit's extraction and compile records when it runs (here:
    the package changed). A record a power loss tore under stats the outputs check still
    trusts is reported and removed, not read again by every later build."""
    root = project(tmp_path / "p")
    assert build(root).ok
    damaged = root / "build" / record
    kept = damaged.stat()
    damage_in_place(damaged)
    os.utime(damaged, ns=(kept.st_atime_ns, kept.st_mtime_ns))
    manifest = root / "nkibuild.yaml"
    manifest.write_text(manifest.read_text().replace("version: 0.1.0", "version: 0.1.1"))
    with monkeypatch.context() as power_loss:
        trusted_stats(power_loss)
        failed = build(root)
    assert not failed.ok
    (failure,) = failed.failures
    assert failure.name == "bundle" and message in failure.detail
    assert "Traceback" not in failure.detail
    assert not damaged.exists()
    assert build(root).ok
    assert json.loads(damaged.read_text())  # written again
