"""A compile that fails on its own is recorded under its cache key (docs/compiler.md,
"Known failures"): the next build, here or on another machine through the remote
cache, reports it without running the compiler, unless --retry-failed; a compile that
was killed, timed out or taken by the OOM killer is never recorded; `explain` and
`cache stats` show it."""

from __future__ import annotations

import json
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import build, failed, ok, pretend_new_compiler, softmax_manifest, softmax_project
from test_remote_cache import s3_cache, s3_endpoint, s3_url  # noqa: F401  (fixtures)

from nkibuild.cache import CacheKey, LocalCache
from nkibuild.compiler.neuronxcc import FailedCompile, _check_outcome
from nkibuild.compiler.process import ProcessOutcome
from nkibuild.errors import BuildError
from nkibuild.graph.report import BuildSummary
from nkibuild.manifest import load_manifest
from nkibuild.plan import resolve
from nkibuild.settings import BuildOptions

UNIT = "softmax/default/trn2"
MANIFEST = softmax_manifest("{name: memo, version: 0.1.0}", defaults="{targets: [trn2]}")
FAKE = BuildOptions(toolchain="fake")
RETRY = BuildOptions(toolchain="fake", retry_failed=True)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return softmax_project(tmp_path / "p", MANIFEST)


@pytest.fixture
def compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[], int]:
    """How many times the fake compiler has been run so far."""
    counter = tmp_path / "compiles"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_COUNTER", str(counter))
    return lambda: len(counter.read_text().splitlines()) if counter.exists() else 0


def failure_of(summary: BuildSummary) -> str:
    (failure,) = summary.failures
    assert failure.name == f"compile:{UNIT}"
    return failure.detail


def failure_records(cache_dir: Path) -> list[dict]:
    entries = LocalCache(cache_dir).entries()
    records = [json.loads((e.directory / "entry.json").read_text()) for e in entries]
    return [record for record in records if "failure" in record]


@pytest.mark.parametrize(
    ("fault", "status", "runs"), [("exit1", 1, 1), ("exit70", 70, 2), ("hugelog", 1, 1)]
)
def test_a_compile_that_failed_on_its_own_is_reported_at_once(
    root: Path,
    compiles: Callable[[], int],
    monkeypatch: pytest.MonkeyPatch,
    isolated_cache: Path,
    fault: str,
    status: int,
    runs: int,
) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", fault)
    first = failure_of(build(root))
    assert compiles() == runs  # exit 70 was retried once first
    (record,) = failure_records(isolated_cache)
    assert record["failure"]["returncode"] == status and record["unit"] == UNIT
    # The compiler would pass now: that it is not asked shows the record answered.
    monkeypatch.delenv("NKIBUILD_FAKE_CC_FAULT")
    again = failure_of(build(root))
    assert compiles() == runs
    assert "(a known failure: this key" in again and "Pass --retry-failed" in again
    assert f"exit status: {status}" in again
    assert again.split("log tail:")[1] == first.split("log tail:")[1]  # the same tail


@pytest.mark.parametrize("fault", ["kill9", "hang", "empty", "garbage"])
def test_a_killed_timed_out_or_refused_compile_is_not_recorded(
    root: Path,
    compiles: Callable[[], int],
    monkeypatch: pytest.MonkeyPatch,
    isolated_cache: Path,
    fault: str,
) -> None:
    """kill9: the OOM killer (twice: retried alone); hang: stopped at nkibuild's timeout;
    empty and garbage: exit 0 with no usable NEFF. The next build runs the compiler."""
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", fault)
    options = BuildOptions(toolchain="fake", compile_timeout=3.0 if fault == "hang" else None)
    assert "a known failure" not in failure_of(build(root, options=options))
    runs = compiles()
    assert runs >= 1  # the compiler ran (kill9: also its retry)
    assert "a known failure" not in failure_of(build(root, options=options))
    assert compiles() == 2 * runs
    assert failure_records(isolated_cache) == []
    monkeypatch.delenv("NKIBUILD_FAKE_CC_FAULT")
    assert build(root).ok


@pytest.mark.parametrize(
    ("returncode", "timed_out", "recorded"),
    [
        (1, False, True),
        (70, False, True),  # the internal error, after its retries
        (2, False, True),
        (-signal.SIGKILL, False, False),  # the OOM killer
        (-signal.SIGKILL, True, False),  # nkibuild's timeout
        (1, True, False),  # exited 1 as the timeout fired: not known to fail on its own
        (-signal.SIGTERM, False, False),  # killed from outside
        (-signal.SIGSEGV, False, False),  # a signal: never taken for a verdict on the key
    ],
)
def test_only_a_failure_status_of_its_own_is_worth_recording(
    root: Path, returncode: int, timed_out: bool, recorded: bool
) -> None:
    (unit,) = resolve(load_manifest(root / "nkibuild.yaml"))
    outcome = ProcessOutcome(returncode, 0, 1.0, timed_out)
    with pytest.raises(BuildError) as raised:
        _check_outcome(unit, ["neuronx-cc"], root, outcome, 3.0, 2)
    assert isinstance(raised.value, FailedCompile) is recorded


def test_retry_failed_compiles_again_and_a_neff_then_wins(
    root: Path, compiles: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "exit1")
    assert not build(root).ok and compiles() == 1
    detail = failure_of(build(root, options=RETRY))
    assert compiles() == 2 and "a known failure" not in detail  # run again, failed again
    monkeypatch.delenv("NKIBUILD_FAKE_CC_FAULT")
    monkeypatch.setenv("NKIBUILD_RETRY_FAILED", "1")  # the environment's switch
    assert build(root).ok and compiles() == 3
    monkeypatch.delenv("NKIBUILD_RETRY_FAILED")
    shutil.rmtree(root / "build")
    assert build(root).origins == {"cache-local": 1}  # the NEFF wins over the record
    assert compiles() == 3


def test_a_new_compiler_version_flag_or_argument_is_a_new_key_and_is_tried(
    root: Path, compiles: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "exit1")
    assert not build(root).ok
    monkeypatch.setenv("NEURON_CC_FLAGS", "--verbose")
    assert not build(root).ok
    pretend_new_compiler(monkeypatch)
    assert not build(root).ok
    manifest = softmax_manifest(
        "{name: memo, version: 0.1.0}", defaults="{targets: [trn2], optlevel: 1}"
    )
    (root / "nkibuild.yaml").write_text(manifest)
    assert "a known failure" not in failure_of(build(root))
    assert compiles() == 4  # each a new key: each tried
    assert "a known failure" in failure_of(build(root))
    assert compiles() == 4


def test_the_record_travels_through_the_remote_cache(
    tmp_path: Path, compiles: Callable[[], int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI shards with their own local caches and one remote: one runs the failing
    compile, the others are told at once, and keep the record locally."""
    monkeypatch.setenv("NKIBUILD_REMOTE_CACHE", (tmp_path / "remote").as_uri())
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "exit1")
    assert not build(softmax_project(tmp_path / "shard1", MANIFEST)).ok
    assert compiles() == 1
    monkeypatch.setenv("NKIBUILD_CACHE_DIR", str(tmp_path / "shard2-cache"))
    shard2 = softmax_project(tmp_path / "shard2", MANIFEST)
    detail = failure_of(build(shard2))
    assert compiles() == 1 and f"the cache at {(tmp_path / 'remote').as_uri()}" in detail
    monkeypatch.delenv("NKIBUILD_REMOTE_CACHE")
    detail = failure_of(build(shard2))
    assert compiles() == 1 and f"the cache at {tmp_path / 'shard2-cache'} records" in detail


def test_a_failure_record_round_trips_through_s3(
    s3_endpoint: str,  # noqa: F811
    s3_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    key = CacheKey.of(hlo="h", compile_args=["--target", "trn2"])
    failure = {"returncode": 1, "message": "neuronx-cc failed", "log_tail": "ERROR: no"}
    writer = s3_cache(s3_endpoint, s3_url)
    writer.publish(key.failure, None, {"unit": "u", "failure": failure}, vouched=True)
    reader = s3_cache(s3_endpoint, s3_url, read_only=True)
    assert reader.fetch(key, tmp_path / "x.neff") is None  # a NEFF is not a failure
    meta = reader.fetch(key.failure, None)
    assert meta is not None and meta["failure"] == failure and meta["unit"] == "u"
    assert not (tmp_path / "x.neff").exists()


def test_explain_and_cache_stats_show_it(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "exit1")
    first = failed(run_nkibuild(["build", "--toolchain", "fake"], root), 1)
    assert "a known failure" not in first.stderr
    again = failed(run_nkibuild(["build", "--toolchain", "fake"], root), 1)
    assert f"compile:{UNIT} failed:\n{UNIT}: neuronx-cc failed (a known failure" in again.stderr
    explained = ok(run_nkibuild(["explain", "--toolchain", "fake", "--json", UNIT], root))
    (unit,) = json.loads(explained.stdout)
    assert unit["action"] == "known-failure" and not unit["rebuild"]
    assert "failed to compile before (neuronx-cc failed, exit status 1)" in unit["outcome"]
    text = ok(run_nkibuild(["explain", "--toolchain", "fake", UNIT], root)).stdout
    assert f"{UNIT}: fails at once: its compile is a known failure" in text
    stats = json.loads(ok(run_nkibuild(["cache", "stats", "--json"], root)).stdout)
    assert stats["tiers"]["local"]["failures"] == 1 and stats["builds"] == 2
    lines = ok(run_nkibuild(["cache", "stats"], root)).stdout
    assert "1 known compile failures reported" in lines
    retried = failed(run_nkibuild(["build", "--toolchain", "fake", "--retry-failed"], root), 1)
    assert "a known failure" not in retried.stderr and "neuronx-cc failed" in retried.stderr
