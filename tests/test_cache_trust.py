"""Cache entries prove they belong to their key; nothing in a cache dir is followed or
deleted unless nkibuild wrote it; optional HMAC signing (docs/cache.md, "Trust")."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import run_nkibuild
from helpers import build, softmax_manifest, softmax_project
from test_remote_cache import s3_cache, s3_endpoint, s3_url  # noqa: F401  (fixtures)

from nkibuild.cache import CacheChain, CacheKey, LocalCache, safefs
from nkibuild.cache.remote import RemoteCache
from nkibuild.cache.trust import (
    ENV_KEY,
    ENV_KEY_FILE,
    ENV_REQUIRE,
    CacheConfigError,
    CacheTrust,
    trust_from_environment,
)
from nkibuild.graph.report import BuildSummary
from nkibuild.settings import BuildOptions

SECRET = b"team-secret-0123456789abcdef"
OTHER = b"someone-elses-secret-987654321"


def key_of(name: str) -> CacheKey:
    return CacheKey.of(hlo=name, compile_args=["--target", "trn2"])


def publish(cache: LocalCache | RemoteCache, tmp_path: Path, name: str) -> CacheKey:
    neff = tmp_path / f"{name}.neff"
    neff.write_bytes(os.urandom(3000))
    key = key_of(name)
    cache.publish(
        key, neff, {"unit": name, "compile_seconds": 1.5, "peak_memory": 1000}, vouched=True
    )
    return key


def record_of(cache: LocalCache, key: CacheKey) -> dict[str, Any]:
    return json.loads((cache.entry_dir(key) / "entry.json").read_text())


def write_record(cache: LocalCache, key: CacheKey, record: dict[str, Any] | str) -> None:
    text = record if isinstance(record, str) else json.dumps(record)
    (cache.entry_dir(key) / "entry.json").write_text(text)


def refused(cache: LocalCache | RemoteCache, key: CacheKey, tmp_path: Path, why: str) -> None:
    """`key` is a miss with a corrupt-entry notice naming `why`; nothing was written."""
    destination = tmp_path / "out" / "model.neff"
    assert cache.fetch(key, destination) is None
    assert not destination.exists()
    assert any("corrupt cache entry" in n and why in n for n in cache.notices), cache.notices


@pytest.fixture
def cache(tmp_path: Path) -> LocalCache:
    return LocalCache(tmp_path / "cache")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the cache that nothing may touch."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "precious.txt").write_text("user data")
    return directory


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else b"<dir>"
        for p in sorted(directory.rglob("*"))
    }


# --- the key -------------------------------------------------------------------------------


def test_an_entry_copied_under_another_key_is_refused(cache: LocalCache, tmp_path: Path) -> None:
    a, b = publish(cache, tmp_path, "a"), key_of("b")
    cache.entry_dir(b).parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(cache.entry_dir(a), cache.entry_dir(b))
    refused(cache, b, tmp_path, "another key")
    assert not cache.entry_dir(b).exists()  # discarded: B will be compiled and published
    assert cache.fetch(a, tmp_path / "a-out.neff") is not None  # A is untouched


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (lambda r, b: {**r, "digest": b.digest}, "do not hash to its key"),  # digest forged
        (lambda r, b: {**r, "digest": b.digest, "key": {**r["key"], "hlo": "c"}}, "do not hash"),
        (lambda r, b: {**r, "digest": "0" * 64}, "another key"),
        (lambda r, b: {k: v for k, v in r.items() if k != "key"}, "another key"),
        (lambda r, b: {**r, "key": ["not", "a", "dict"]}, "another key"),
    ],
    ids=["digest-only", "inputs-edited", "other-digest", "no-key", "key-list"],
)
def test_a_record_for_another_key_is_refused(
    cache: LocalCache, tmp_path: Path, edit: Callable[..., dict], why: str
) -> None:
    a, b = publish(cache, tmp_path, "a"), key_of("b")
    shutil.copytree(cache.entry_dir(a), cache.entry_dir(b))
    write_record(cache, b, edit(record_of(cache, a), b))
    refused(cache, b, tmp_path, why)


# --- entry files -------------------------------------------------------------------------


def test_a_neff_symlinked_to_a_system_file_is_refused(
    cache: LocalCache, tmp_path: Path, outside: Path
) -> None:
    key = publish(cache, tmp_path, "a")
    target = outside / "precious.txt"
    neff = cache.entry_dir(key) / "model.neff"
    neff.unlink()
    neff.symlink_to(target)
    # The attacker records the target's real hash and size: only the file type gives it away.
    data = target.read_bytes()
    write_record(
        cache,
        key,
        {**record_of(cache, key), "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)},
    )
    before = snapshot(outside)
    refused(cache, key, tmp_path, "symbolic link")
    assert snapshot(outside) == before
    assert neff.is_symlink()  # not nkibuild's: left in place, and said so
    assert any("left in place" in n for n in cache.notices)
    for passwd in ("/etc/passwd", "/etc/hostname"):
        neff.unlink()
        neff.symlink_to(passwd)
        assert cache.fetch(key, tmp_path / "p.neff") is None


def test_a_fifo_neff_does_not_block(cache: LocalCache, tmp_path: Path) -> None:
    key = publish(cache, tmp_path, "a")
    neff = cache.entry_dir(key) / "model.neff"
    neff.unlink()
    os.mkfifo(neff)
    started = time.monotonic()
    refused(cache, key, tmp_path, "FIFO")
    assert time.monotonic() - started < 5
    assert stat.S_ISFIFO(neff.lstat().st_mode)  # left in place


def test_a_fifo_entry_json_does_not_block(cache: LocalCache, tmp_path: Path) -> None:
    key = publish(cache, tmp_path, "a")
    record = cache.entry_dir(key) / "entry.json"
    record.unlink()
    os.mkfifo(record)
    refused(cache, key, tmp_path, "FIFO")
    assert cache.verify()  # reported there too, without blocking


def test_a_device_neff_is_refused(cache: LocalCache, tmp_path: Path) -> None:
    key = publish(cache, tmp_path, "a")
    neff = cache.entry_dir(key) / "model.neff"
    neff.unlink()
    try:
        os.mknod(neff, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("creating a device node is not permitted here")
    refused(cache, key, tmp_path, "character device")


def test_a_10_gb_sparse_neff_is_refused_without_being_read(
    cache: LocalCache, tmp_path: Path
) -> None:
    key = publish(cache, tmp_path, "a")
    neff = cache.entry_dir(key) / "model.neff"
    with open(neff, "r+b") as handle:
        handle.truncate(10 << 30)
    started = time.monotonic()
    refused(cache, key, tmp_path, "more than")
    assert time.monotonic() - started < 5
    # Below the cap, the recorded size still refuses it before a byte is hashed.
    key = publish(cache, tmp_path, "b")
    with open(cache.entry_dir(key) / "model.neff", "r+b") as handle:
        handle.truncate(1 << 30)
    started = time.monotonic()
    refused(cache, key, tmp_path, "more than the recorded 3000")
    assert time.monotonic() - started < 5


def test_an_oversized_or_symlinked_entry_json_is_refused(
    cache: LocalCache, tmp_path: Path, outside: Path
) -> None:
    key = publish(cache, tmp_path, "a")
    write_record(cache, key, json.dumps(record_of(cache, key)) + " " * (2 << 20))
    refused(cache, key, tmp_path, "more than")
    key = publish(cache, tmp_path, "b")
    (outside / "entry.json").write_text(json.dumps(record_of(cache, key)))
    (cache.entry_dir(key) / "entry.json").unlink()
    (cache.entry_dir(key) / "entry.json").symlink_to(outside / "entry.json")
    refused(cache, key, tmp_path, "symbolic link")
    assert (outside / "entry.json").exists()


# --- metadata values -------------------------------------------------------------------------


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    ("field", "raw", "why"),
    [
        ("compile_seconds", '"fast"', "compile_seconds is invalid"),
        ("compile_seconds", "NaN", "NaN"),
        ("compile_seconds", "Infinity", "Infinity"),
        ("compile_seconds", "1e999", "out of range"),
        ("compile_seconds", "-1", "compile_seconds is invalid"),
        ("compile_seconds", "true", "compile_seconds is invalid"),
        ("peak_memory", '"1e999"', "peak_memory is invalid"),
        ("peak_memory", "1.5", "peak_memory is invalid"),
        ("peak_memory", str(2**64), "peak_memory is invalid"),
        ("peak_memory", "9" * 400, "digits"),
        ("peak_memory", "9" * 5000, "digits"),
        ("peak_memory", "[]", "peak_memory is invalid"),
        ("unit", "5", "unit is not a string"),
        ("unit", json.dumps("x" * 5000), "unit is not a string"),
        ("compiler_version", "{}", "compiler_version is not a string"),
        ("size", '"3000"', "invalid size"),
        ("size", "-1", "invalid size"),
        ("sha256", '"abc"', "no valid sha256"),
        ("sha256", "null", "no valid sha256"),
        ("extra", _deep(100), "nested more than"),
        ("extra", _deep(100_000), "nested more than"),
    ],
    ids=lambda value: value if len(str(value)) < 20 else f"{str(value)[:8]}...({len(value)})",
)
def test_bad_metadata_is_discarded_and_reported(
    cache: LocalCache, tmp_path: Path, field: str, raw: str, why: str
) -> None:
    key = publish(cache, tmp_path, "a")
    record = record_of(cache, key)
    record[field] = "@VALUE@"
    write_record(cache, key, json.dumps(record).replace('"@VALUE@"', raw))
    chain = CacheChain([cache])
    assert chain.fetch(key, tmp_path / "out.neff") is None  # never an exception
    assert any(why in notice for notice in chain.notices), chain.notices
    assert not cache.entry_dir(key).exists()


def test_a_hit_returns_only_validated_metadata(cache: LocalCache, tmp_path: Path) -> None:
    key = publish(cache, tmp_path, "a")
    write_record(cache, key, {**record_of(cache, key), "evil": {"x": 1}, "neff": "../../x"})
    meta = cache.fetch(key, tmp_path / "out.neff")
    assert meta is not None and "evil" not in meta and "neff" not in meta
    assert meta["compile_seconds"] == 1.5 and meta["peak_memory"] == 1000


# --- verify, prune, clear ----------------------------------------------------------------


def _symlinked_layouts(cache: LocalCache, tmp_path: Path, outside: Path) -> list[Path]:
    """A valid-looking entry outside, reached through a symlinked entry dir, a symlinked
    shard dir and (separately) a symlinked neff/ dir."""
    donor = LocalCache(tmp_path / "donor")
    links = []
    for name, level in (("x", "entry"), ("y", "shard")):
        key = publish(donor, tmp_path, name)
        copy = outside / name
        shutil.copytree(donor.entry_dir(key), copy)
        entry = cache.entry_dir(key)
        if level == "entry":
            entry.parent.mkdir(parents=True, exist_ok=True)
            entry.symlink_to(copy)
            links.append(entry)
        else:
            (outside / "shard").mkdir()
            shutil.copytree(copy, outside / "shard" / entry.name)
            entry.parent.symlink_to(outside / "shard")
            links.append(entry.parent)
    return links


def test_verify_prune_clear_never_follow_a_symlink_out(
    cache: LocalCache, tmp_path: Path, outside: Path
) -> None:
    good = publish(cache, tmp_path, "good")
    links = _symlinked_layouts(cache, tmp_path, outside)
    before = snapshot(outside)
    for link in links:
        key = key_of("x") if link.name == key_of("x").digest else key_of("y")
        assert cache.fetch(key, tmp_path / "o.neff") is None
    assert [e.directory for e in cache.entries()] == [cache.entry_dir(good)]
    problems = cache.verify()
    assert sum("not followed, left in place" in p for p in problems) == 2, problems
    assert cache.prune(max_age_s=0) and cache.clear() == []
    assert cache.remove_unfinished(older_than_s=0) == 0
    assert snapshot(outside) == before
    assert all(link.is_symlink() for link in links)


def test_a_symlinked_neff_dir_is_not_entered(
    cache: LocalCache, tmp_path: Path, outside: Path
) -> None:
    donor = LocalCache(outside / "donor")
    key = publish(donor, tmp_path, "a")
    cache.root.mkdir()
    (cache.root / "neff").symlink_to(outside / "donor" / "neff")
    before = snapshot(outside)
    assert cache.fetch(key, tmp_path / "o.neff") is None
    assert cache.entries() == [] and cache.clear() == []
    assert any("not followed" in p for p in cache.verify())
    cache.publish(
        key_of("b"), tmp_path / "a.neff", {}, vouched=True
    )  # never writes through it either
    assert snapshot(outside) == before


def test_clear_and_prune_delete_only_what_nkibuild_wrote(cache: LocalCache, tmp_path: Path) -> None:
    keys = [publish(cache, tmp_path, name) for name in ("a", "b", "c")]
    foreign = [
        cache.root / "notes.txt",
        cache.root / "neff" / "README",
        cache.root / "neff" / "zz" / "file",  # not a hex shard
        cache.root / "neff" / keys[0].digest[:2] / "not-an-entry" / "data",
        cache.root / "neff" / keys[0].digest[:2] / ".git" / "config",
        cache.entry_dir(keys[1]) / "user.txt",  # inside an entry
    ]
    for path in foreign:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("not nkibuild's")
    old = time.time() - 7200
    for path in foreign:
        os.utime(path.parent, (old, old))
    removed = cache.clear()
    assert {e.directory for e in removed} == {cache.entry_dir(keys[0]), cache.entry_dir(keys[2])}
    assert any("did not write (user.txt)" in n for n in cache.notices)
    cache.remove_unfinished(older_than_s=0)
    assert all(path.read_text() == "not nkibuild's" for path in foreign)
    assert (cache.entry_dir(keys[1]) / "model.neff").exists()  # the entry is not half-removed


def test_unfinished_writes_are_recognized_by_their_names(cache: LocalCache, tmp_path: Path) -> None:
    key = publish(cache, tmp_path, "a")
    shard = cache.entry_dir(key).parent
    digest = key.digest
    ours = [shard / f".{digest}.abcd_123.new", shard / f".{digest}.discard-42"]
    theirs = [shard / ".cache", shard / f".{digest}.new", shard / ".x.abcdefgh.new"]
    for directory in ours + theirs:
        directory.mkdir()
        (directory / "model.neff").write_bytes(b"x")
    (ours[0] / "keep.me").write_text("foreign file in one of our temp dirs")
    assert cache.remove_unfinished(older_than_s=0) == 1
    assert not ours[1].exists()
    assert (ours[0] / "keep.me").exists() and all(d.exists() for d in theirs)


def test_cli_verify_reports_symlinks_without_a_traceback(
    cache: LocalCache, tmp_path: Path, outside: Path
) -> None:
    publish(cache, tmp_path, "good")
    _symlinked_layouts(cache, tmp_path, outside)
    before = snapshot(outside)
    result = run_nkibuild(["cache", "verify", "--cache-dir", str(cache.root)], tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "left in place" in result.stdout
    cleared = run_nkibuild(["cache", "clear", "--cache-dir", str(cache.root)], tmp_path)
    assert cleared.returncode == 0 and "removed 1 entries" in cleared.stdout
    assert snapshot(outside) == before


def _namespaces() -> bool:
    try:
        probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@pytest.mark.skipif(not _namespaces(), reason="needs `unshare -rm` for a read-only mount")
def test_clear_on_a_read_only_cache_fails_truthfully(cache: LocalCache, tmp_path: Path) -> None:
    for name in ("a", "b"):
        publish(cache, tmp_path, name)
    root = str(cache.root)
    script = (
        f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && "
        f"exec python -m nkibuild cache clear --cache-dir {root}"
    )
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-euc", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr
    assert f"could not remove {root}/neff/" in result.stderr
    assert "Read-only file system" in result.stderr
    assert "removed" not in result.stdout
    assert "2 entries" in result.stdout
    assert len(cache.entries()) == 2


# --- signing -------------------------------------------------------------------------------


def test_signed_entries_verify_only_with_their_key(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    writer = LocalCache(root, trust=CacheTrust(SECRET))
    key = publish(writer, tmp_path, "a")
    assert len(record_of(writer, key)["signature"]) == 64
    same = LocalCache(root, trust=CacheTrust(SECRET, require_signed=True), read_only=True)
    assert same.fetch(key, tmp_path / "ok.neff") is not None
    foreign = LocalCache(root, trust=CacheTrust(OTHER, require_signed=True), read_only=True)
    refused(foreign, key, tmp_path, "signature does not verify")
    assert LocalCache(root, read_only=True).fetch(key, tmp_path / "x.neff") is not None


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: {**r, "unit": "evil"},
        lambda r: {**r, "peak_memory": 1},
        lambda r: {**r, "sha256": "0" * 64},
        lambda r: {**r, "signature": "0" * 64},
        lambda r: {**r, "signature": "not hex"},
        lambda r: {**r, "signature": None},
    ],
    ids=["unit", "memory", "sha256", "zero-signature", "malformed", "unsigned"],
)
def test_an_altered_signed_entry_is_refused(tmp_path: Path, edit: Callable[..., dict]) -> None:
    cache = LocalCache(tmp_path / "cache", trust=CacheTrust(SECRET, require_signed=True))
    key = publish(cache, tmp_path, "a")
    record = {k: v for k, v in edit(record_of(cache, key)).items() if v is not None}
    write_record(cache, key, record)
    refused(cache, key, tmp_path, "sign")


def test_an_entry_resigned_with_another_key_or_copied_is_refused(tmp_path: Path) -> None:
    cache = LocalCache(tmp_path / "cache", trust=CacheTrust(SECRET, require_signed=True))
    attacker = LocalCache(tmp_path / "cache", trust=CacheTrust(OTHER))
    key = publish(attacker, tmp_path, "a")
    refused(cache, key, tmp_path, "signature does not verify")
    # A validly signed entry for A, copied under B: the key check refuses it first.
    a, b = publish(cache, tmp_path, "a2"), key_of("b2")
    shutil.copytree(cache.entry_dir(a), cache.entry_dir(b))
    refused(cache, b, tmp_path, "another key")


def test_a_required_signature_refuses_unsigned_entries(tmp_path: Path) -> None:
    key = publish(LocalCache(tmp_path / "cache"), tmp_path, "a")
    strict = LocalCache(tmp_path / "cache", trust=CacheTrust(SECRET, require_signed=True))
    refused(strict, key, tmp_path, "unsigned")
    lenient = LocalCache(tmp_path / "cache", trust=CacheTrust(SECRET))
    key = publish(LocalCache(tmp_path / "cache"), tmp_path, "b")
    assert lenient.fetch(key, tmp_path / "b.neff") is not None


def test_a_backfilled_hit_is_signed_with_the_local_key(tmp_path: Path) -> None:
    trust = CacheTrust(SECRET, require_signed=True)
    remote = RemoteCache((tmp_path / "remote").as_uri(), trust=trust)
    key = publish(remote, tmp_path, "a")
    local = LocalCache(tmp_path / "local", trust=trust)
    assert CacheChain([local, remote]).fetch(key, tmp_path / "a-out.neff") is not None
    assert local.fetch(key, tmp_path / "again.neff") is not None  # signed on the way in


def write_key(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({ENV_KEY: "short"}, "is 5 bytes; use at least 16"),
        ({ENV_REQUIRE: "1"}, "no key is set"),
        ({ENV_REQUIRE: "maybe", ENV_KEY: "x" * 20}, "NKIBUILD_REQUIRE_SIGNED_CACHE='maybe'"),
        ({ENV_KEY: "x" * 20, ENV_KEY_FILE: "/k"}, "not both"),
        ({ENV_KEY_FILE: "/nonexistent/key"}, "No such file"),
        ({ENV_KEY_FILE: "/dev/null"}, "not a regular file"),
        ({ENV_KEY_FILE: "/"}, "not a regular file"),
    ],
)
def test_bad_signing_settings_name_the_setting(environ: dict[str, str], message: str) -> None:
    with pytest.raises(CacheConfigError, match=message) as raised:
        trust_from_environment(environ)
    assert "x" * 20 not in str(raised.value)  # never the secret


def test_signing_settings_from_a_key_file(tmp_path: Path) -> None:
    path = write_key(tmp_path / "key", SECRET + b"\n")
    trust = trust_from_environment({ENV_KEY_FILE: str(path), ENV_REQUIRE: "yes"})
    assert trust == CacheTrust(SECRET, require_signed=True)
    assert trust_from_environment({}) == CacheTrust()
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(CacheConfigError, match="not a regular file"):
        trust_from_environment({ENV_KEY_FILE: str(tmp_path / "fifo")})


def test_cli_signing_flags(tmp_path: Path) -> None:
    """A release refuses a cache entry signed with another key (or none) and compiles
    instead; a bad flag combination stops at once with exit 2, no traceback."""
    project = softmax_project(tmp_path / "p", softmax_manifest("{name: signed, version: 0.1.0}"))
    key_file = write_key(tmp_path / "team.key", SECRET)
    other_file = write_key(tmp_path / "other.key", OTHER)
    env = {"NKIBUILD_CACHE_DIR": str(tmp_path / "cache")}

    def build(*flags: str) -> subprocess.CompletedProcess[str]:
        shutil.rmtree(project / "build", ignore_errors=True)
        return run_nkibuild(["build", "--toolchain", "fake", "--json", *flags], project, env=env)

    first = build("--cache-key-file", str(key_file))
    assert first.returncode == 0, first.stderr
    trusted = build("--cache-key-file", str(key_file), "--require-signed-cache")
    assert trusted.returncode == 0 and json.loads(trusted.stdout)["notices"] == []
    foreign = build("--cache-key-file", str(other_file), "--require-signed-cache")
    assert foreign.returncode == 0, foreign.stderr
    notices = json.loads(foreign.stdout)["notices"]
    assert notices and all("signature does not verify" in n for n in notices), notices
    missing = build("--require-signed-cache")
    assert missing.returncode == 2 and "no key is set" in missing.stderr
    assert "Traceback" not in missing.stderr
    short = build("--cache-key-file", str(write_key(tmp_path / "s", b"abc")))
    assert short.returncode == 2 and "use at least 16" in short.stderr


# --- remote tiers ----------------------------------------------------------------------------


def test_remote_entry_copied_under_another_key_is_refused(tmp_path: Path) -> None:
    remote_dir = tmp_path / "remote"
    cache = RemoteCache(remote_dir.as_uri())
    a, b = publish(cache, tmp_path, "a"), key_of("b")
    shutil.copytree(remote_dir / "neff" / a.digest[:2] / a.digest, Path(cache.entry_dir(b)))
    refused(cache, b, tmp_path, "another key")


def test_file_remote_objects_that_are_not_files_are_refused(tmp_path: Path, outside: Path) -> None:
    cache = RemoteCache((tmp_path / "remote").as_uri())
    key = publish(cache, tmp_path, "a")
    entry = Path(cache.entry_dir(key))
    record = json.loads((entry / "entry.json").read_text())
    neff = entry / record["neff"]
    neff.unlink()
    neff.symlink_to(outside / "precious.txt")
    refused(cache, key, tmp_path, "symbolic link")
    assert (outside / "precious.txt").read_text() == "user data"
    key = publish(cache, tmp_path, "b")
    entry = Path(cache.entry_dir(key))
    neff = entry / json.loads((entry / "entry.json").read_text())["neff"]
    neff.unlink()
    os.mkfifo(neff)
    refused(cache, key, tmp_path, "FIFO")
    key = publish(cache, tmp_path, "c")
    entry = Path(cache.entry_dir(key))
    shutil.copytree(entry, outside / "c")
    shutil.rmtree(entry)
    entry.symlink_to(outside / "c")
    before = snapshot(outside)
    refused(cache, key, tmp_path, "symbolic link")
    assert snapshot(outside) == before


@pytest.mark.parametrize("linked", ["neff", "shard"])
def test_local_publish_never_writes_through_a_symlinked_dir(
    cache: LocalCache, tmp_path: Path, outside: Path, linked: str
) -> None:
    shard = cache.entry_dir(key_of("a")).parent
    shard.parent.parent.mkdir(parents=True)
    if linked == "neff":
        shard.parent.symlink_to(outside)
    else:
        shard.parent.mkdir()
        shard.symlink_to(outside)
    before = snapshot(outside)
    publish(cache, tmp_path, "a")
    assert snapshot(outside) == before
    (notice,) = cache.notices
    assert notice.startswith(f"not publishing to {cache.root}: ")
    assert "is a symbolic link or not a directory" in notice


def test_file_remote_publish_never_writes_through_a_symlink(tmp_path: Path, outside: Path) -> None:
    remote_dir = tmp_path / "remote"
    remote_dir.mkdir()
    (remote_dir / "neff").symlink_to(outside)
    cache = RemoteCache(remote_dir.as_uri())
    before = snapshot(outside)
    publish(cache, tmp_path, "a")
    assert snapshot(outside) == before
    assert any("not publishing" in notice for notice in cache.notices)


def test_s3_entries_prove_their_key_and_signature(
    s3_endpoint: str,  # noqa: F811
    s3_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    writer = s3_cache(s3_endpoint, s3_url)
    writer.trust = CacheTrust(SECRET)
    a, b = publish(writer, tmp_path, "a"), key_of("b")
    fs = writer.fs
    for path in fs.ls(writer.entry_dir(a), detail=False):
        fs.copy(path, f"{writer.entry_dir(b)}/{path.rsplit('/', 1)[-1]}")
    reader = s3_cache(s3_endpoint, s3_url, read_only=True)
    reader.trust = CacheTrust(SECRET, require_signed=True)
    refused(reader, b, tmp_path, "another key")
    assert reader.fetch(a, tmp_path / "a.neff") is not None
    stranger = s3_cache(s3_endpoint, s3_url, read_only=True)
    stranger.trust = CacheTrust(OTHER, require_signed=True)
    refused(stranger, a, tmp_path, "signature does not verify")
    huge = publish(writer, tmp_path, "huge")
    fs.pipe_file(f"{writer.entry_dir(huge)}/entry.json", b" " * (2 << 20))
    refused(reader, huge, tmp_path, "more than")


def test_s3_discard_removes_only_nkibuilds_objects(
    s3_endpoint: str,  # noqa: F811
    s3_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    cache = s3_cache(s3_endpoint, s3_url)
    key = publish(cache, tmp_path, "a")
    entry = cache.entry_dir(key)
    cache.fs.pipe_file(f"{entry}/README.txt", b"someone else's")
    record = json.loads(cache.fs.cat_file(f"{entry}/entry.json"))
    cache.fs.pipe_file(f"{entry}/{record['neff']}", b"tampered")
    refused(cache, key, tmp_path, "sha256")
    cache.fs.invalidate_cache()
    assert [p.rsplit("/", 1)[-1] for p in cache.fs.ls(entry, detail=False)] == ["README.txt"]


# --- trust stays with the entry ---------------------------------------------------------------

FAILURE = {"returncode": 1, "message": "neuronx-cc failed", "log_tail": "ERROR: rejected"}


def publish_entry(cache: LocalCache | RemoteCache, tmp_path: Path, name: str, kind: str) -> None:
    """A NEFF entry, or a failed compile's record, for `key_of(name)`."""
    if kind == "neff":
        publish(cache, tmp_path, name)
    else:
        meta = {"unit": name, "failure": FAILURE}
        cache.publish(key_of(name).failure, None, meta, vouched=True)


def stored_key(name: str, kind: str) -> CacheKey:
    return key_of(name) if kind == "neff" else key_of(name).failure


@pytest.mark.parametrize("kind", ["neff", "failure"])
@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_a_fetched_entry_keeps_the_trust_it_arrived_with(
    tmp_path: Path, kind: str, signed: bool
) -> None:
    """A build holding the key, accepting unsigned entries, copies a remote hit into its
    local cache: signed only if it arrived signed, so a strict build later refuses
    what nobody with the key ever vouched for."""
    url = (tmp_path / "remote").as_uri()
    publish_entry(
        RemoteCache(url, trust=CacheTrust(SECRET if signed else None)), tmp_path, "a", kind
    )
    lenient = CacheTrust(SECRET)
    local = LocalCache(tmp_path / "local", trust=lenient)
    chain = CacheChain([local, RemoteCache(url, trust=lenient)])
    if kind == "neff":
        hit = chain.fetch(key_of("a"), tmp_path / "a.neff")
    else:
        hit = chain.known_failure(key_of("a"))
    assert hit is not None and hit.kind == "remote" and hit.vouched is signed
    key = stored_key("a", kind)
    assert ("signature" in record_of(local, key)) is signed
    strict = LocalCache(local.root, trust=CacheTrust(SECRET, require_signed=True))
    if signed:
        assert strict.fetch(key, tmp_path / "ok.neff") is not None
    else:
        refused(strict, key, tmp_path, "unsigned")


def test_a_signing_build_never_launders_an_unsigned_remote_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through builds: one without the key publishes to the remote; one with the key (not
    requiring signatures) takes the entry from there into a fresh local cache; a release
    that requires signatures then refuses that copy and compiles."""
    root = softmax_project(tmp_path / "p", softmax_manifest(defaults="{targets: [trn1]}"))
    counter = tmp_path / "compiles"
    monkeypatch.setenv("NKIBUILD_FAKE_CC_COUNTER", str(counter))
    remote = (tmp_path / "remote").as_uri()

    def fresh_build(cache: str, remote_cache: str | None = None) -> BuildSummary:
        shutil.rmtree(root / "build", ignore_errors=True)
        options = BuildOptions(
            toolchain="fake", cache_dir=tmp_path / cache, remote_cache=remote_cache
        )
        return build(root, options=options)

    assert fresh_build("unsigned-writer", remote).origins == {"compiled": 1}
    monkeypatch.setenv(ENV_KEY, SECRET.decode())
    assert fresh_build("signer", remote).origins == {"cache-remote": 1}
    monkeypatch.setenv(ENV_REQUIRE, "1")
    strict = fresh_build("signer")
    assert strict.origins == {"compiled": 1} and len(counter.read_text().splitlines()) == 2
    assert any("it is unsigned and signed entries are required" in n for n in strict.notices)


KEY_TEXTS = [b"@", b"@\n", b"@\r\n", b"  @  \n", b"\t@", b"\n@\n\n"]


@pytest.mark.parametrize("text", KEY_TEXTS, ids=repr)
@pytest.mark.parametrize("source", ["env", "file"])
def test_the_key_is_one_whichever_way_it_is_given(tmp_path: Path, source: str, text: bytes) -> None:
    """The same key with or without a trailing newline or surrounding whitespace, from
    the environment or a file, signs and verifies alike."""
    raw = text.replace(b"@", SECRET)
    if source == "env":
        environ = {ENV_KEY: raw.decode()}
    else:
        environ = {ENV_KEY_FILE: str(write_key(tmp_path / "key", raw))}
    writer = LocalCache(tmp_path / "cache", trust=trust_from_environment(environ))
    key = publish(writer, tmp_path, "a")
    for other in (
        {ENV_KEY: SECRET.decode()},
        {ENV_KEY_FILE: str(write_key(tmp_path / "k2", SECRET))},
    ):
        trust = trust_from_environment({**other, ENV_REQUIRE: "1"})
        reader = LocalCache(writer.root, trust=trust, read_only=True)
        assert reader.fetch(key, tmp_path / "ok.neff") is not None, other


@pytest.mark.parametrize("source", ["env", "file"])
def test_a_key_of_whitespace_is_no_key(tmp_path: Path, source: str) -> None:
    environ = (
        {ENV_KEY: " \n\t"}
        if source == "env"
        else {ENV_KEY_FILE: str(write_key(tmp_path / "k", b" \n"))}
    )
    with pytest.raises(CacheConfigError, match="is 0 bytes"):
        trust_from_environment(environ)


# --- publishing never follows a symlink planted in the cache -------------------------------


def _swap_while_writing(monkeypatch: pytest.MonkeyPatch, path: Path, outside: Path) -> None:
    """What an attacker racing a publish does, once its first file is being written: the
    directory it checked moved away, a symlink out of the cache put in its place."""
    fill, done = safefs._fill, []

    def racing(*args: Any) -> None:
        if not done:
            path.rename(path.with_name(path.name + ".moved"))
            path.symlink_to(outside, target_is_directory=True)
            done.append(path)
        fill(*args)

    monkeypatch.setattr(safefs, "_fill", racing)


# Where a link out of the cache is planted, and what the publish then does: replaces the
# link (it is in a name nkibuild writes), refuses the publish, or finds the entry there.
REMOTE_ATTACKS = {
    "neff-dir": "refused",
    "shard-dir": "refused",
    "entry-dir": "refused",
    "object-file": "replaced",  # <sha256>.neff -> a file outside
    "object-dir": "replaced",  # <sha256>.neff -> a directory outside (a move goes into it)
    "entry-json": "present",  # entry.json -> a directory outside: an entry seems there
    "entry-json-dangling": "replaced",
    "temp": "refused",  # the temp file's name, guessed
    "swapped": "diverted",  # the entry dir swapped for a link after it was checked
}
# (a notice says the publish failed, the entry can be fetched) for each outcome
OUTCOMES = {
    "refused": (True, False),
    "replaced": (False, True),
    "present": (False, False),
    "diverted": (False, False),  # written where the checked dir went: the link is refused
}


@pytest.mark.parametrize("attack", sorted(REMOTE_ATTACKS))
def test_a_file_remote_publish_never_follows_a_planted_symlink(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch, attack: str
) -> None:
    remote_dir = tmp_path / "remote"
    cache = RemoteCache(remote_dir.as_uri())
    neff = tmp_path / "a.neff"
    neff.write_bytes(os.urandom(3000))
    sha = hashlib.sha256(neff.read_bytes()).hexdigest()
    key = key_of("a")
    entry = Path(cache.entry_dir(key))
    monkeypatch.setattr(safefs.secrets, "token_hex", lambda n: "0" * 2 * n)  # guessed names
    planted = {
        "neff-dir": entry.parent.parent,
        "shard-dir": entry.parent,
        "entry-dir": entry,
        "object-file": entry / f"{sha}.neff",
        "object-dir": entry / f"{sha}.neff",
        "entry-json": entry / "entry.json",
        "entry-json-dangling": entry / "entry.json",
        "temp": entry / f".{sha}.neff.{'0' * 32}.tmp",
    }.get(attack)
    if planted is not None:
        planted.parent.mkdir(parents=True, exist_ok=True)
        target = {"object-file": "precious.txt", "entry-json-dangling": "new.json"}.get(attack)
        planted.symlink_to(outside / target if target else outside)
    if attack == "swapped":
        _swap_while_writing(monkeypatch, entry, outside)
    before = snapshot(outside)
    chain = CacheChain([cache])
    chain.publish(key, neff, {"unit": "a"}, vouched=True)
    assert snapshot(outside) == before
    assert not any(path.is_symlink() for path in outside.rglob("*"))
    notice, fetched = OUTCOMES[REMOTE_ATTACKS[attack]]
    assert (chain.notices != []) is notice, chain.notices
    assert (cache.fetch(key, tmp_path / "out.neff") is not None) is fetched, cache.notices


@pytest.mark.parametrize("attack", ["entry-dir", "stage", "swapped-shard", "swapped-stage"])
def test_a_local_publish_never_follows_a_planted_symlink(
    cache: LocalCache, tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch, attack: str
) -> None:
    key = key_of("a")
    entry = cache.entry_dir(key)
    entry.parent.mkdir(parents=True)
    monkeypatch.setattr(safefs.secrets, "token_hex", lambda n: "0" * 2 * n)
    stage = entry.parent / f".{key.digest}.00000000.new"
    if attack == "entry-dir":
        entry.symlink_to(outside)
    elif attack == "stage":
        stage.symlink_to(outside)
    else:
        swapped = entry.parent if attack == "swapped-shard" else stage
        _swap_while_writing(monkeypatch, swapped, outside)
    before = snapshot(outside)
    chain = CacheChain([cache])
    publish(chain, tmp_path, "a")  # type: ignore[arg-type]
    assert snapshot(outside) == before
    assert not any(path.is_symlink() for path in outside.rglob("*"))
    assert (chain.notices != []) is (attack == "stage")  # its name taken: not published
    assert cache.fetch(key, tmp_path / "out.neff") is None  # a link where the entry is
