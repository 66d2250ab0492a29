"""Cache observability: each tier's hits, misses and errors counted per build, kept in a
bounded log in the local cache, and shown by `nkibuild cache stats [--json]`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project

from nkibuild.cache.stats import (
    MAX_BUILDS,
    MAX_LOG_BYTES,
    CacheCounters,
    TierCounts,
    log_path,
    read_log,
    record_build,
)


def counts(hits: int = 0, misses: int = 0, errors: int = 0) -> dict[str, TierCounts]:
    return {"local": TierCounts(hits, misses, errors)}


def test_tier_counts_add_up_and_give_a_hit_rate() -> None:
    total = TierCounts(3, 1, 0, 2) + TierCounts(1, 2, 1, 0)
    assert total == TierCounts(hits=4, misses=3, errors=1, write_errors=2)
    assert total.lookups == 8 and total.hit_rate == 0.5
    assert TierCounts().hit_rate is None
    assert TierCounts(1, 3).to_json() == {
        "hits": 1,
        "misses": 3,
        "errors": 0,
        "write_errors": 0,
        "failures": 0,
        "lookups": 4,
        "hit_rate": 0.25,
    }


def test_counters_from_many_threads_lose_nothing() -> None:
    counters = CacheCounters()

    def count() -> None:
        for _ in range(1000):
            counters.count("local", "misses")
            counters.count("remote", "hits")

    threads = [threading.Thread(target=count) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counters.rejected_hit("remote")
    assert counters.snapshot() == {
        "local": TierCounts(misses=8000),
        "remote": TierCounts(hits=7999, misses=1),
    }


def test_the_log_sums_the_builds_it_keeps(tmp_path: Path) -> None:
    assert record_build(tmp_path, counts(hits=2, misses=1)) == []
    assert record_build(tmp_path, {**counts(misses=3), "remote": TierCounts(1, 2, 1)}) == []
    log = read_log(tmp_path)
    assert len(log.builds) == 2 and log.notices == ()
    assert log.totals() == {"local": TierCounts(2, 4), "remote": TierCounts(1, 2, 1)}


def test_the_log_keeps_only_the_last_builds(tmp_path: Path) -> None:
    for number in range(MAX_BUILDS + 5):
        record_build(tmp_path, counts(hits=number), finished=float(number))
    builds = read_log(tmp_path).builds
    assert len(builds) == MAX_BUILDS
    assert [b.finished for b in builds] == [float(n) for n in range(5, MAX_BUILDS + 5)]


def test_concurrent_builds_in_processes_and_threads_lose_no_record(tmp_path: Path) -> None:
    """Four processes and four threads append at once; every record is in the log."""
    script = (
        "import sys; from pathlib import Path\n"
        "from nkibuild.cache.stats import TierCounts, record_build\n"
        "for _ in range(10):\n"
        "    assert record_build(Path(sys.argv[1]), {'local': TierCounts(hits=1)}) == []\n"
    )
    processes = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path)]) for _ in range(4)]

    def append() -> None:
        for _ in range(10):
            assert record_build(tmp_path, counts(misses=1)) == []

    threads = [threading.Thread(target=append) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [process.wait(timeout=120) for process in processes] == [0] * 4
    log = read_log(tmp_path)
    assert len(log.builds) == 80 and log.notices == ()
    assert log.totals()["local"] == TierCounts(hits=40, misses=40)
    assert [p.name for p in log_path(tmp_path).parent.iterdir()] == ["builds.json"]


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"{not json", "Expecting property name"),
        (b'{"format": 1, "builds": [{"finished": 1, "tiers": {"local": {"hits": -4}}}]}', "count"),
        (b'{"format": 1, "builds": [{"finished": 1, "tiers": {"local": []}}]}', "not an object"),
        (b'{"format": 9, "builds": []}', "not a format-1 build log"),
        (b"[" * 5000 + b"]" * 5000, "nested more than 8 levels deep"),
        (b'{"format": 1, "builds": [{"finished": 1e999, "tiers": {}}]}', "1e999, out of range"),
        (
            b'{"format": 1, "builds": [{"finished": 1, "tiers": {"local": {"hits": 1%s}}}]}'
            % (b"0" * 30),
            "31 digits",
        ),
    ],
)
def test_a_damaged_log_is_ignored_with_a_notice_and_replaced(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = log_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    log = read_log(tmp_path)
    assert log.builds == () and len(log.notices) == 1
    assert log.notices[0].startswith(f"the cache's build log {path} is damaged (")
    assert why in log.notices[0] and log.notices[0].endswith("; its counts are ignored")
    notices = record_build(tmp_path, counts(hits=1))
    assert len(notices) == 1 and notices[0].endswith("; a new one was started")
    assert read_log(tmp_path).totals()["local"] == TierCounts(hits=1)


def test_the_log_never_follows_a_symlink_out_of_the_cache(tmp_path: Path) -> None:
    """Whoever can write to the cache directory cannot make a build read, truncate or
    replace a file elsewhere through the log."""
    cache, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    precious = outside / "builds.json"
    precious.write_text('{"format": 1, "builds": []}')
    (cache / "stats").mkdir(parents=True)
    (cache / "stats" / "builds.json").symlink_to(precious)
    log = read_log(cache)
    assert log.notices == (
        f"the cache's build log {log_path(cache)} is damaged (builds.json is a symbolic "
        "link); its counts are ignored",
    )
    assert record_build(cache, counts(hits=1))[0].endswith("; a new one was started")
    assert not log_path(cache).is_symlink() and read_log(cache).totals()["local"].hits == 1
    assert precious.read_text() == '{"format": 1, "builds": []}'

    shutil.rmtree(cache / "stats")
    (cache / "stats").symlink_to(outside)
    assert record_build(cache, counts(hits=1)) == [
        f"not recording this build's cache counts in {log_path(cache)}: "
        "stats is a symbolic link or not a directory"
    ]
    assert sorted(p.name for p in outside.iterdir()) == ["builds.json"]
    assert precious.read_text() == '{"format": 1, "builds": []}'


def test_a_fifo_or_a_huge_log_is_refused_without_reading_it(tmp_path: Path) -> None:
    import os

    (tmp_path / "stats").mkdir()
    os.mkfifo(log_path(tmp_path))  # opening it for reading would block forever
    assert "builds.json is not a regular file" in read_log(tmp_path).notices[0]
    log_path(tmp_path).unlink()
    log_path(tmp_path).write_bytes(b" " * (MAX_LOG_BYTES + 1))
    assert f"more than {MAX_LOG_BYTES}" in read_log(tmp_path).notices[0]


def test_an_unwritable_log_is_a_notice_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "stats").write_text("a file where the log's directory goes")
    assert record_build(tmp_path, counts(hits=1)) == [
        f"not recording this build's cache counts in {log_path(tmp_path)}: "
        "stats is a symbolic link or not a directory"
    ]
    inside_a_file = tmp_path / "stats" / "cache"
    assert record_build(inside_a_file, counts(hits=1)) == [
        f"could not record this build's cache counts in {log_path(inside_a_file)}: Not a directory"
    ]


# --- through the CLI -------------------------------------------------------------------------


def stats_json(cache_dir: Path, *extra: str) -> dict:
    result = run_nkibuild(
        ["cache", "stats", "--json", "--cache-dir", str(cache_dir), *extra], cache_dir.parent
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return softmax_project(tmp_path / "project", softmax_manifest())


def test_cache_stats_counts_hits_and_misses_over_the_last_builds(
    project: Path, isolated_cache: Path
) -> None:
    cold = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert cold.returncode == 0, cold.stderr
    shutil.rmtree(project / "build")  # a fresh checkout: both NEFFs come from the cache
    warm = run_nkibuild(["build", "--toolchain", "fake"], project)
    assert warm.returncode == 0, warm.stderr
    assert "2 local cache hits" in warm.stdout
    # Up to date: nothing looked up, so nothing recorded.
    assert run_nkibuild(["build", "--toolchain", "fake"], project).returncode == 0

    stats = stats_json(isolated_cache)
    assert stats["builds"] == 2 and stats["entries"] == 2
    local = stats["tiers"]["local"]
    assert local["location"] == str(isolated_cache) and local["entries"] == 2
    assert (local["hits"], local["misses"], local["errors"], local["hit_rate"]) == (2, 2, 0, 0.5)
    remote = stats["tiers"]["remote"]
    assert remote["location"] is None and remote["lookups"] == 0 and remote["hit_rate"] is None

    plain = run_nkibuild(["cache", "stats", "--cache-dir", str(isolated_cache)], project)
    assert plain.returncode == 0, plain.stderr
    assert "hits over the last 2 builds that used the cache:" in plain.stdout
    assert "  local:  2 hits, 2 misses, 0 errors (50% of 4 lookups); 2 entries" in plain.stdout
    assert "  remote: 0 hits, 0 misses, 0 errors (no lookups)" in plain.stdout


def test_a_read_only_cache_gets_no_log(project: Path, isolated_cache: Path) -> None:
    result = run_nkibuild(["build", "--toolchain", "fake", "--cache-read-only"], project)
    assert result.returncode == 0, result.stderr
    assert not (isolated_cache / "stats").exists()
    assert stats_json(isolated_cache)["builds"] == 0


def test_cache_stats_with_a_damaged_log_warns_and_counts_nothing(isolated_cache: Path) -> None:
    log = log_path(isolated_cache)
    log.parent.mkdir(parents=True)
    log.write_text('{"format": 1, "builds": "lots"}')
    result = run_nkibuild(["cache", "stats", "--cache-dir", str(isolated_cache)], isolated_cache)
    assert result.returncode == 0
    assert f"warning: the cache's build log {log} is damaged (no list of builds)" in result.stderr
    assert "Traceback" not in result.stderr
    assert "  local:  0 hits, 0 misses, 0 errors (no lookups)" in result.stdout
