"""The remote NEFF cache over fsspec: file:// directories and a real S3 API (moto's server)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project

from nkibuild.cache import CacheChain, CacheKey, LocalCache
from nkibuild.cache.remote import RemoteCache, public_url
from nkibuild.cache.stats import CacheCounters, TierCounts
from nkibuild.cache.trust import CacheConfigError


def make_key(name: str) -> CacheKey:
    return CacheKey.of(hlo=name, compile_args=["--target", "trn2"])


def make_neff(tmp_path: Path, name: str, size: int = 2000) -> Path:
    neff = tmp_path / f"{name}.neff"
    neff.write_bytes(os.urandom(size))
    return neff


def publish(cache: RemoteCache, tmp_path: Path, name: str) -> tuple[CacheKey, Path]:
    key, neff = make_key(name), make_neff(tmp_path, name)
    log = tmp_path / f"{name}.log"
    log.write_text(f"compiled {name}\n")
    cache.publish(key, neff, {"unit": name}, log, vouched=True)
    return key, neff


def entry_record(cache: RemoteCache, key: CacheKey) -> dict[str, Any]:
    return json.loads(cache.fs.cat_file(f"{cache.entry_dir(key)}/entry.json"))


def stored_neff(cache: RemoteCache, key: CacheKey) -> str:
    return f"{cache.entry_dir(key)}/{entry_record(cache, key)['neff']}"


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.exists() else []


# --- file:// ------------------------------------------------------------------------------


@pytest.fixture
def remote_dir(tmp_path: Path) -> Path:
    return tmp_path / "remote"


@pytest.fixture
def cache(remote_dir: Path) -> RemoteCache:
    return RemoteCache(remote_dir.as_uri())


def test_a_remote_cache_that_cannot_be_opened_is_a_usage_error() -> None:
    """An unknown protocol (or a known one whose fsspec backend is not installed): a
    message, not fsspec's traceback from every compile task."""
    with pytest.raises(CacheConfigError) as raised:
        RemoteCache("nosuchproto://bucket/x")
    assert str(raised.value) == (
        "the remote cache nosuchproto://bucket/x cannot be opened: Protocol not known: nosuchproto"
    )


def test_file_url_round_trip(cache: RemoteCache, remote_dir: Path, tmp_path: Path) -> None:
    key, neff = publish(cache, tmp_path, "a")
    meta = cache.fetch(key, tmp_path / "out" / "a.neff")
    assert meta is not None
    assert (tmp_path / "out" / "a.neff").read_bytes() == neff.read_bytes()
    assert meta["unit"] == "a" and meta["key"] == key.to_json() and meta["digest"] == key.digest
    assert "neff" not in meta and "log" not in meta  # layout details stay in the remote
    assert cache.contains(key) and cache.entries() == [key.digest]
    record = entry_record(cache, key)
    assert record["neff"] == f"{record['sha256']}.neff"
    entry = remote_dir / "neff" / key.digest[:2] / key.digest
    assert (entry / record["log"]).read_text() == "compiled a\n"
    assert leftovers(entry) == sorted(["entry.json", record["neff"], record["log"]])  # no temps

    cache.publish(
        key, make_neff(tmp_path, "other"), {"unit": "other"}, vouched=True
    )  # already there: no-op
    assert entry_record(cache, key) == record
    assert cache.fetch(make_key("unknown"), tmp_path / "unknown.neff") is None
    assert not (tmp_path / "unknown.neff").exists()
    assert cache.notices == []


def test_a_corrupt_object_is_reported_and_discarded(cache: RemoteCache, tmp_path: Path) -> None:
    key, _ = publish(cache, tmp_path, "a")
    cache.fs.pipe_file(stored_neff(cache, key), b"tampered")
    destination = tmp_path / "out" / "a.neff"
    assert cache.fetch(key, destination) is None
    (notice,) = cache.notices
    assert "corrupt cache entry" in notice and "discarded" in notice and "sha256" in notice
    assert cache.entries() == [] and not cache.contains(key)
    assert not cache.fs.exists(cache.entry_dir(key))  # the objects went too
    assert leftovers(destination.parent) == []  # neither the NEFF nor a temp file


def test_a_read_only_cache_reports_but_keeps_a_corrupt_entry(
    cache: RemoteCache, remote_dir: Path, tmp_path: Path
) -> None:
    key, _ = publish(cache, tmp_path, "a")
    cache.fs.pipe_file(stored_neff(cache, key), b"tampered")
    reader = RemoteCache(remote_dir.as_uri(), read_only=True)
    assert reader.fetch(key, tmp_path / "out.neff") is None
    (notice,) = reader.notices
    assert "corrupt cache entry" in notice and "ignored (read-only cache)" in notice
    assert reader.entries() == [key.digest]
    assert not (tmp_path / "out.neff").exists()


def _edited(**fields: Any) -> Any:
    """entry.json as published, with `fields` replaced (None: removed)."""

    def edit(record: dict[str, Any]) -> bytes:
        record = {**record, **fields}
        return json.dumps({k: v for k, v in record.items() if v is not None}).encode()

    return edit


@pytest.mark.parametrize(
    ("entry_json", "why"),
    [
        (lambda _: b"{not json", "unreadable entry.json"),
        (lambda _: b"\xff\xfe", "unreadable entry.json"),
        (lambda _: b"[1, 2]", "not an object"),
        (lambda _: b'{"neff": "x.neff"}', "another key"),
        (_edited(sha256=None), "no valid sha256"),
        (_edited(sha256="00"), "no valid sha256"),
        (_edited(neff=None), "no valid NEFF object"),
        (_edited(neff="../../elsewhere.neff"), "no valid NEFF object"),
        (_edited(neff="/etc/passwd"), "no valid NEFF object"),
        (_edited(log="../x.log"), "invalid log object"),
    ],
)
def test_a_garbage_entry_json_is_corrupt(
    cache: RemoteCache, tmp_path: Path, entry_json: Any, why: str
) -> None:
    key, _ = publish(cache, tmp_path, "a")
    record = entry_record(cache, key)
    cache.fs.pipe_file(f"{cache.entry_dir(key)}/entry.json", entry_json(record))
    assert cache.fetch(key, tmp_path / "a.neff") is None
    (notice,) = cache.notices
    assert "corrupt" in notice and why in notice
    assert cache.entries() == []


def test_a_missing_object_is_corrupt(cache: RemoteCache, tmp_path: Path) -> None:
    key, _ = publish(cache, tmp_path, "a")
    cache.fs.rm_file(stored_neff(cache, key))
    assert cache.fetch(key, tmp_path / "a.neff") is None
    assert "is missing" in cache.notices[0]
    assert cache.entries() == []


def test_read_only_publish_writes_nothing(remote_dir: Path, tmp_path: Path) -> None:
    reader = RemoteCache(remote_dir.as_uri(), read_only=True)
    reader.publish(make_key("a"), make_neff(tmp_path, "a"), {"unit": "a"}, vouched=True)
    assert not remote_dir.exists()
    assert reader.entries() == []


def test_a_half_published_entry_is_a_miss_and_does_not_block_the_next(
    cache: RemoteCache, tmp_path: Path
) -> None:
    key, neff = publish(cache, tmp_path, "a")
    cache.fs.rm_file(f"{cache.entry_dir(key)}/entry.json")  # as if killed before the last write
    assert cache.fetch(key, tmp_path / "a.neff") is None
    assert cache.notices == [] and not cache.contains(key) and cache.entries() == []
    cache.publish(key, neff, {"unit": "a"}, vouched=True)
    assert cache.fetch(key, tmp_path / "a.neff") is not None


def test_a_remote_hit_is_copied_into_the_local_tier(
    cache: RemoteCache, remote_dir: Path, tmp_path: Path
) -> None:
    key, neff = publish(cache, tmp_path, "a")
    local = LocalCache(tmp_path / "local")
    chain = CacheChain([local, RemoteCache(remote_dir.as_uri())])
    hit = chain.fetch(key, tmp_path / "out.neff")
    assert hit is not None and hit.location == remote_dir.as_uri()
    local_meta = local.fetch(key, tmp_path / "again.neff")
    assert local_meta is not None and "neff" not in local_meta and local_meta["unit"] == "a"
    assert (tmp_path / "again.neff").read_bytes() == neff.read_bytes()
    assert chain.notices == []


def test_location_never_shows_credentials(tmp_path: Path) -> None:
    assert public_url("s3://AKIA:secret@bucket/prefix") == "s3://bucket/prefix"
    assert public_url("https://host/cache?sig=secret") == "https://host/cache"
    assert public_url("simplecache::s3://k:s@bucket/p") == "simplecache::s3://bucket/p"
    assert RemoteCache(tmp_path.as_uri()).location == tmp_path.as_uri()


# --- S3, against moto's server on localhost ---------------------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (pip install 'nkibuild[test]')")
    moto_server = pytest.importorskip(
        "moto.server", reason="the S3 tests need moto[server] (pip install 'nkibuild[test]')"
    )
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_url(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; credentials and proxies set so nothing leaves localhost."""
    for variable, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    bucket = f"neff-{uuid.uuid4().hex[:12]}"
    # Not s3fs's mkdir: it sends LocationConstraint=us-east-1, which S3 (and moto) reject.
    boto3 = pytest.importorskip("boto3")
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    return f"s3://{bucket}/team/cache"


def s3_cache(endpoint: str, url: str, *, read_only: bool = False) -> RemoteCache:
    """Each instance is its own client, as on its own machine: no shared fsspec instance."""
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    return RemoteCache(url, read_only=read_only, storage_options=options)


def test_s3_round_trip_seen_from_another_machine(
    s3_endpoint: str, s3_url: str, tmp_path: Path
) -> None:
    # The reader lists first, so a stale listing cache would hide the later publish.
    reader = s3_cache(s3_endpoint, s3_url)
    key = make_key("a")
    assert reader.entries() == [] and not reader.contains(key)
    assert reader.fetch(key, tmp_path / "miss.neff") is None

    writer = s3_cache(s3_endpoint, s3_url)
    _, neff = publish(writer, tmp_path, "a")
    assert reader.contains(key) and reader.entries() == [key.digest]
    meta = reader.fetch(key, tmp_path / "out.neff")
    assert meta is not None and meta["unit"] == "a" and meta["digest"] == key.digest
    assert (tmp_path / "out.neff").read_bytes() == neff.read_bytes()
    assert reader.location == s3_url
    assert writer.notices == [] and reader.notices == []

    fresh = s3_cache(s3_endpoint, s3_url, read_only=True)
    assert fresh.fetch(key, tmp_path / "fresh.neff") is not None
    fresh.publish(make_key("b"), neff, {"unit": "b"}, vouched=True)
    assert fresh.entries() == [key.digest]  # read-only wrote nothing


def test_s3_half_published_entry_is_a_miss_even_in_a_stale_listing(
    s3_endpoint: str, s3_url: str, tmp_path: Path
) -> None:
    writer, reader = s3_cache(s3_endpoint, s3_url), s3_cache(s3_endpoint, s3_url)
    key, neff = publish(writer, tmp_path, "a")
    writer.fs.rm_file(f"{writer.entry_dir(key)}/entry.json")  # an upload killed before the end
    # Any user of the (shared, by default) fsspec instance may have cached this listing.
    assert len(reader.fs.ls(reader.entry_dir(key))) == 2
    assert reader.fetch(key, tmp_path / "out.neff") is None and reader.notices == []
    assert not reader.contains(key)

    writer.publish(key, neff, {"unit": "a"}, vouched=True)
    assert reader.contains(key) and reader.entries() == [key.digest]
    assert reader.fetch(key, tmp_path / "out.neff") is not None


def test_s3_corrupt_object_is_detected_and_discarded(
    s3_endpoint: str, s3_url: str, tmp_path: Path
) -> None:
    writer = s3_cache(s3_endpoint, s3_url)
    key, _ = publish(writer, tmp_path, "a")
    writer.fs.pipe_file(stored_neff(writer, key), b"tampered")

    read_only = s3_cache(s3_endpoint, s3_url, read_only=True)
    assert read_only.fetch(key, tmp_path / "a.neff") is None
    assert "ignored (read-only cache)" in read_only.notices[0]
    assert read_only.entries() == [key.digest]

    reader = s3_cache(s3_endpoint, s3_url)
    assert reader.fetch(key, tmp_path / "out.neff") is None
    assert "corrupt" in reader.notices[0] and "discarded" in reader.notices[0]
    assert not (tmp_path / "out.neff").exists()
    assert reader.entries() == [] and not writer.contains(key)
    assert writer.fs.find(writer.entry_dir(key)) == []  # the objects went too


def test_s3_writers_of_one_key_never_mix(s3_endpoint: str, s3_url: str, tmp_path: Path) -> None:
    """Both writers see no entry, both upload, the last entry.json wins: whole, never a mix."""
    first, second = s3_cache(s3_endpoint, s3_url), s3_cache(s3_endpoint, s3_url)
    key = make_key("a")
    first_neff, second_neff = make_neff(tmp_path, "first"), make_neff(tmp_path, "second")
    # The interleaving made deterministic: hide the first entry.json while the second
    # writer publishes, then let the first writer's entry.json land last.
    first.publish(key, first_neff, {"unit": "first"}, vouched=True)
    entry_file = f"{first.entry_dir(key)}/entry.json"
    first_record = first.fs.cat_file(entry_file)
    first.fs.rm_file(entry_file)
    second.publish(key, second_neff, {"unit": "second"}, vouched=True)
    first.fs.pipe_file(entry_file, first_record)

    reader = s3_cache(s3_endpoint, s3_url)
    meta = reader.fetch(key, tmp_path / "out.neff")
    assert meta is not None and meta["unit"] == "first" and reader.notices == []
    assert (tmp_path / "out.neff").read_bytes() == first_neff.read_bytes()
    objects = {Path(p).name for p in reader.fs.find(reader.entry_dir(key))}
    assert {f"{meta['sha256']}.neff", "entry.json"} <= objects and len(objects) == 3


def test_s3_concurrent_writers_race(s3_endpoint: str, s3_url: str, tmp_path: Path) -> None:
    writers = [s3_cache(s3_endpoint, s3_url) for _ in range(2)]
    keys = [make_key(f"race-{n}") for n in range(4)]
    neffs = [make_neff(tmp_path, f"writer-{n}") for n in range(len(writers))]
    start = threading.Barrier(len(writers))

    def race(index: int) -> None:
        start.wait()
        for key in keys:
            writers[index].publish(key, neffs[index], {"unit": f"writer-{index}"}, vouched=True)

    with ThreadPoolExecutor(len(writers)) as pool:
        list(pool.map(race, range(len(writers))))

    reader = s3_cache(s3_endpoint, s3_url)
    contents = {n.read_bytes(): f"writer-{i}" for i, n in enumerate(neffs)}
    for key in keys:
        out = tmp_path / f"{key.digest}.neff"
        meta = reader.fetch(key, out)
        assert meta is not None and contents[out.read_bytes()] == meta["unit"]
    assert reader.notices == [] and sorted(reader.entries()) == sorted(k.digest for k in keys)


def test_s3_builds_on_two_machines_compile_once(
    s3_endpoint: str, s3_url: str, tmp_path: Path
) -> None:
    """End to end through the CLI: machine B, a fresh checkout with an empty local cache,
    takes every NEFF machine A compiled from the S3 cache and runs the compiler 0 times."""
    manifest = softmax_manifest(
        "{name: s3-kernels, version: 0.1.0}", top=f"cache: {{remote: '{s3_url}'}}"
    )
    counts = []
    for machine in ("a", "b"):
        root = softmax_project(tmp_path / machine / "checkout", manifest)
        counter = tmp_path / f"{machine}.compiles"
        env = {
            "AWS_ENDPOINT_URL": s3_endpoint,
            "NKIBUILD_CACHE_DIR": str(tmp_path / machine / "local-cache"),
            "NKIBUILD_FAKE_CC_COUNTER": str(counter),
        }
        result = run_nkibuild(["build", "--toolchain", "fake", "--json"], root, env=env)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["notices"] == []
        counts.append(len(counter.read_text().splitlines()) if counter.exists() else 0)
        shutil.rmtree(root / "build")
    assert counts == [2, 0]
    assert len(s3_cache(s3_endpoint, s3_url).entries()) == 2


# --- counts per tier (cache stats, build reports) --------------------------------------------


def test_the_chain_counts_each_tiers_hits_and_misses(
    cache: RemoteCache, remote_dir: Path, tmp_path: Path
) -> None:
    key, _ = publish(cache, tmp_path, "a")
    stats = CacheCounters()
    chain = CacheChain([LocalCache(tmp_path / "local"), RemoteCache(remote_dir.as_uri())], stats)
    assert chain.fetch(key, tmp_path / "1.neff") is not None  # remote hit, copied to local
    assert chain.fetch(key, tmp_path / "2.neff") is not None  # local hit: remote not asked
    assert chain.fetch(make_key("absent"), tmp_path / "3.neff") is None
    assert stats.snapshot() == {"local": TierCounts(1, 2), "remote": TierCounts(1, 1)}
    # A hit whose NEFF the compile stage then refuses served nothing: it becomes a miss.
    chain.discard(key, str(tmp_path / "local"))
    assert stats.snapshot()["local"] == TierCounts(hits=0, misses=3)


def test_a_corrupt_entry_counts_as_a_miss_not_an_error(cache: RemoteCache, tmp_path: Path) -> None:
    key, _ = publish(cache, tmp_path, "a")
    cache.fs.pipe_file(stored_neff(cache, key), b"tampered")
    stats = CacheCounters()
    assert CacheChain([cache], stats).fetch(key, tmp_path / "out.neff") is None
    assert stats.snapshot() == {"remote": TierCounts(misses=1)}
    assert "corrupt cache entry" in cache.notices[0]


def unreachable_s3(url: str) -> RemoteCache:
    """An S3 endpoint nothing listens on, asked once (no retries): a network failure."""
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"},
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 2},
        "skip_instance_cache": True,
    }
    return RemoteCache(url, storage_options=options)


def test_an_unreachable_remote_counts_errors_apart_from_misses(s3_url: str, tmp_path: Path) -> None:
    stats = CacheCounters()
    chain = CacheChain([LocalCache(tmp_path / "local"), unreachable_s3(s3_url)], stats)
    key = make_key("a")
    assert chain.fetch(key, tmp_path / "out.neff") is None
    chain.publish(key, make_neff(tmp_path, "a"), {"unit": "a"}, vouched=True)
    assert stats.snapshot() == {
        "local": TierCounts(misses=1),
        "remote": TierCounts(errors=1, write_errors=1),
    }
    assert stats.snapshot()["remote"].hit_rate == 0.0
    assert [n.split(":")[0] for n in chain.notices] == [
        "could not read from the cache at s3",
        "could not publish to the cache at s3",
    ]


def test_cache_stats_counts_the_remotes_entries_and_bytes(
    cache: RemoteCache, remote_dir: Path, tmp_path: Path, isolated_cache: Path
) -> None:
    for name in ("a", "b"):
        publish(cache, tmp_path, name)
    (remote_dir / "neff" / "ab").mkdir(parents=True)  # a killed upload: objects, no entry.json
    (remote_dir / "neff" / "ab" / "stray.neff").write_bytes(b"x" * 100)
    on_disk = sum(p.stat().st_size for p in (remote_dir / "neff").rglob("*") if p.is_file())
    result = run_nkibuild(
        ["cache", "stats", "--json", "--remote-cache", remote_dir.as_uri()], tmp_path
    )
    assert result.returncode == 0, result.stderr
    remote = json.loads(result.stdout)["tiers"]["remote"]
    assert remote["location"] == remote_dir.as_uri()
    assert (remote["entries"], remote["bytes"]) == (2, on_disk)


def test_cache_stats_with_an_unreachable_remote_warns_and_says_unknown(tmp_path: Path) -> None:
    result = run_nkibuild(
        ["cache", "stats", "--json", "--remote-cache", "nosuchprotocol://bucket/x"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "warning: could not list the remote cache at nosuchprotocol://bucket/x: " in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    remote = json.loads(result.stdout)["tiers"]["remote"]
    assert (remote["entries"], remote["bytes"]) == (None, None)


def test_s3_usage_counts_complete_entries_and_every_object(
    s3_endpoint: str, s3_url: str, tmp_path: Path
) -> None:
    writer = s3_cache(s3_endpoint, s3_url)
    for name in ("a", "b"):
        publish(writer, tmp_path, name)
    # A killed upload: its NEFF object is there (it costs storage), its entry.json is not.
    writer.fs.pipe_file(f"{writer.entry_dir(make_key('c'))}/{'0' * 64}.neff", b"x" * 300)
    records = sum(
        len(writer.fs.cat_file(f"{writer.entry_dir(make_key(name))}/entry.json"))
        for name in ("a", "b")
    )
    logs = len("compiled a\n") + len("compiled b\n")
    reader = s3_cache(s3_endpoint, s3_url)
    assert reader.usage() == (2, 2 * 2000 + logs + records + 300)
