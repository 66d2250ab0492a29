"""The shared NEFF cache: content-addressed entries, verified reads, size and age pruning."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import run_nkibuild

from nkibuild.cache import CacheKey, NeffCache
from nkibuild.cli.commands import parse_size
from nkibuild.errors import UsageError


def publish(cache: NeffCache, tmp_path: Path, name: str, size: int) -> CacheKey:
    neff = tmp_path / f"{name}.neff"
    neff.write_bytes(os.urandom(size))
    key = CacheKey.of(hlo=name, compile_args=["--target", "trn2"])
    cache.put(key, neff, {"unit": name})
    return key


def test_entries_are_found_only_when_complete_and_verified(tmp_path: Path) -> None:
    cache = NeffCache(tmp_path / "cache")
    key = publish(cache, tmp_path, "a", 1000)
    hit = cache.get(key)
    assert hit is not None and hit[1]["unit"] == "a"
    assert CacheKey.of(hlo="a", compile_args=["--target", "trn2"]).digest == key.digest
    (cache.entry_dir(key) / "model.neff").write_bytes(b"tampered")
    assert cache.get(key) is None  # sha256 mismatch: discarded, to be rebuilt
    assert not cache.entry_dir(key).exists()


def test_prune_by_size_drops_least_recently_used_first(tmp_path: Path) -> None:
    cache = NeffCache(tmp_path / "cache")
    keys = [publish(cache, tmp_path, name, 10_000) for name in ("old", "mid", "new")]
    for age, key in zip((300, 200, 100), keys, strict=True):
        stamp = time.time() - age
        os.utime(cache.entry_dir(key) / "entry.json", (stamp, stamp))
    assert cache.get(keys[0]) is not None  # a hit makes "old" the most recently used
    removed = cache.prune(max_bytes=25_000)
    assert [e.directory for e in removed] == [cache.entry_dir(keys[1])]
    assert {e.directory for e in cache.entries()} == {
        cache.entry_dir(keys[0]),
        cache.entry_dir(keys[2]),
    }


def test_prune_by_age_and_clear(tmp_path: Path) -> None:
    cache = NeffCache(tmp_path / "cache")
    stale, fresh = publish(cache, tmp_path, "stale", 100), publish(cache, tmp_path, "fresh", 100)
    old = time.time() - 10 * 86400
    os.utime(cache.entry_dir(stale) / "entry.json", (old, old))
    assert [e.directory for e in cache.prune(max_age_s=7 * 86400)] == [cache.entry_dir(stale)]
    assert [e.directory for e in cache.clear()] == [cache.entry_dir(fresh)]
    assert cache.entries() == []


def test_cache_cli(tmp_path: Path) -> None:
    cache = NeffCache(tmp_path / "cache")
    for name in ("a", "b"):
        publish(cache, tmp_path, name, 2048)
    stats = run_nkibuild(["cache", "stats", "--cache-dir", str(cache.root)], tmp_path)
    assert stats.returncode == 0 and "2 entries" in stats.stdout
    pruned = run_nkibuild(
        ["cache", "prune", "--max-size", "3K", "--cache-dir", str(cache.root)], tmp_path
    )
    assert "removed 1 entries" in pruned.stdout and "1 entries" in pruned.stdout.splitlines()[-1]
    refused = run_nkibuild(["cache", "prune", "--cache-dir", str(cache.root)], tmp_path)
    assert refused.returncode == 2 and "needs --max-size" in refused.stderr
    cleared = run_nkibuild(["cache", "clear", "--cache-dir", str(cache.root)], tmp_path)
    assert "0 entries" in cleared.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    ("text", "size"),
    [("20G", 20 << 30), ("500M", 500 << 20), ("1.5K", 1536), ("1000", 1000), ("2GB", 2 << 30)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_parse_size_rejects_nonsense() -> None:
    with pytest.raises(UsageError):
        parse_size("lots")
