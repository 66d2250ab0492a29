"""The local NEFF cache and the tier chain: verified reads, corrupt entries, pruning."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from conftest import run_nkibuild

from nkibuild.cache import CacheChain, CacheKey, LocalCache
from nkibuild.quantities import format_size, parse_duration, parse_size


def publish(cache: LocalCache, tmp_path: Path, name: str, size: int) -> CacheKey:
    neff = tmp_path / f"{name}.neff"
    neff.write_bytes(os.urandom(size))
    key = CacheKey.of(hlo=name, compile_args=["--target", "trn2"])
    cache.publish(key, neff, {"unit": name}, vouched=True)
    return key


def test_entries_are_found_only_when_complete_and_verified(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    key = publish(cache, tmp_path, "a", 1000)
    meta = cache.fetch(key, tmp_path / "out.neff")
    assert meta is not None and meta["unit"] == "a" and meta["digest"] == key.digest
    assert (tmp_path / "out.neff").read_bytes() == (tmp_path / "a.neff").read_bytes()
    assert CacheKey.of(hlo="a", compile_args=["--target", "trn2"]).digest == key.digest
    assert cache.notices == []
    (cache.entry_dir(key) / "model.neff").write_bytes(b"tampered")
    assert cache.fetch(key, tmp_path / "again.neff") is None  # sha256 mismatch
    assert not (tmp_path / "again.neff").exists()
    assert not cache.entry_dir(key).exists()  # discarded, to be rebuilt
    (notice,) = cache.notices
    assert "corrupt cache entry" in notice and "discarded" in notice


def test_a_read_only_cache_reports_but_keeps_a_corrupt_entry(tmp_path: Path) -> None:
    writable = LocalCache(tmp_path / "cache")
    key = publish(writable, tmp_path, "a", 100)
    (writable.entry_dir(key) / "entry.json").write_text("{not json")
    reader = LocalCache(tmp_path / "cache", read_only=True)
    assert reader.fetch(key, tmp_path / "out.neff") is None
    assert "ignored (read-only cache)" in reader.notices[0]
    assert writable.entry_dir(key).exists()
    reader.publish(CacheKey.of(hlo="b"), tmp_path / "a.neff", {}, vouched=True)
    assert len(writable.entries()) == 1  # read-only never writes


def test_verify_finds_and_discards_corrupt_entries(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    good, bad = publish(cache, tmp_path, "good", 100), publish(cache, tmp_path, "bad", 100)
    neff = cache.entry_dir(bad) / "model.neff"
    data = bytearray(neff.read_bytes())
    data[0] ^= 0xFF  # one flipped byte
    neff.write_bytes(bytes(data))
    (problem,) = cache.verify()
    assert str(cache.entry_dir(bad)) in problem
    assert [e.directory for e in cache.entries()] == [cache.entry_dir(good)]
    assert cache.verify() == []


class FailingTier:
    location = "s3://unreachable/cache"
    kind = "remote"
    read_only = False

    def __init__(self) -> None:
        self.notices: list[str] = []

    def contains(self, key: CacheKey) -> bool:
        raise ConnectionError("connection refused")

    def fetch(self, key: CacheKey, destination: Path) -> None:
        raise ConnectionError("connection refused")

    def publish(
        self,
        key: CacheKey,
        neff: Path,
        meta: dict,
        log: Path | None = None,
        sha256: str | None = None,
    ) -> None:
        raise ConnectionError("connection refused")

    def discard(self, key: CacheKey) -> None:
        raise ConnectionError("connection refused")


def test_chain_backfills_earlier_tiers_and_survives_a_failing_one(tmp_path: Path) -> None:
    near, far = LocalCache(tmp_path / "near"), LocalCache(tmp_path / "far")
    key = publish(far, tmp_path, "k", 500)
    chain = CacheChain([near, FailingTier(), far])
    hit = chain.fetch(key, tmp_path / "out.neff")
    assert hit is not None and hit.location == str(tmp_path / "far")
    assert near.fetch(key, tmp_path / "near.neff") is not None  # copied to the first tier
    assert any("could not read from the cache at s3://unreachable" in n for n in chain.notices)
    assert chain.locate(key) == str(tmp_path / "near")
    missing = CacheKey.of(hlo="missing")
    assert chain.fetch(missing, tmp_path / "none.neff") is None
    chain.publish(missing, tmp_path / "k.neff", {"unit": "m"}, vouched=True)
    assert far.fetch(missing, tmp_path / "m.neff") is not None  # published past the failure


def test_prune_by_size_drops_least_recently_used_first(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    keys = [publish(cache, tmp_path, name, 10_000) for name in ("old", "mid", "new")]
    for age, key in zip((300, 200, 100), keys, strict=True):
        stamp = time.time() - age
        os.utime(cache.entry_dir(key) / "entry.json", (stamp, stamp))
    assert cache.fetch(keys[0], tmp_path / "hit.neff") is not None  # "old" is now the newest
    removed = cache.prune(max_bytes=25_000)
    assert [e.directory for e in removed] == [cache.entry_dir(keys[1])]
    assert {e.directory for e in cache.entries()} == {
        cache.entry_dir(keys[0]),
        cache.entry_dir(keys[2]),
    }


def test_prune_by_age_and_clear(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
    stale, fresh = publish(cache, tmp_path, "stale", 100), publish(cache, tmp_path, "fresh", 100)
    old = time.time() - 10 * 86400
    os.utime(cache.entry_dir(stale) / "entry.json", (old, old))
    assert [e.directory for e in cache.prune(max_age_s=7 * 86400)] == [cache.entry_dir(stale)]
    assert [e.directory for e in cache.clear()] == [cache.entry_dir(fresh)]
    assert cache.entries() == []


def test_cache_cli(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "cache")
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
    (entry,) = cache.entries()
    (entry.directory / "model.neff").write_bytes(b"tampered")
    verified = run_nkibuild(["cache", "verify", "--cache-dir", str(cache.root)], tmp_path)
    assert verified.returncode == 1 and "corrupt, discarded" in verified.stdout
    assert "0 entries" in verified.stdout.splitlines()[-1]
    publish(cache, tmp_path, "c", 10)
    cleared = run_nkibuild(["cache", "clear", "--cache-dir", str(cache.root)], tmp_path)
    assert "0 entries" in cleared.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    ("text", "size"),
    [("20G", 20 << 30), ("500M", 500 << 20), ("1.5K", 1536), ("1000", 1000), ("2GB", 2 << 30)],
)
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("30m", 1800.0)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["lots", "5X", "", "-3G"])
def test_parse_size_rejects_nonsense(text: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(text)


def test_format_size() -> None:
    assert [format_size(n) for n in (10, 2048, 5 << 30)] == ["10 B", "2.0 KiB", "5.0 GiB"]
