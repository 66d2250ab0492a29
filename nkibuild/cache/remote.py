"""The remote NEFF cache: a shared tier at any fsspec URL (s3://bucket/prefix, file://...).

An entry lives at `<root>/neff/<key[:2]>/<key>/`: the NEFF and its compile log
are stored under their own sha256 (`<sha256>.neff`, `<sha256>.log`) and
`entry.json` names them. Object stores have no atomic rename, so a publish
uploads the content-addressed objects first and writes `entry.json` last, in
one atomic step: a reader sees a whole entry or none, and two machines
publishing the same key each write their own complete objects, never into
each other's. A killed upload leaves objects without an `entry.json`, which
is a miss, not an error.

Network and auth errors propagate: `CacheChain` turns them into notices.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem

from nkibuild.cache import safefs
from nkibuild.cache.key import CacheKey
from nkibuild.cache.store import (
    ENTRY_FILE,
    CorruptEntry,
    check_sha256,
    corrupt_notice,
    entry_parts,
    entry_record,
)
from nkibuild.cache.trust import (
    MAX_NEFF_BYTES,
    MAX_RECORD_BYTES,
    NO_SIGNING,
    CacheConfigError,
    CacheTrust,
    caller_meta,
    check_size,
    parse_record,
)
from nkibuild.fsutil import atomic_output

# The object names nkibuild writes in an entry (content-addressed, and their temp
# names on a local filesystem): a discard removes these and nothing else.
_OBJECT = re.compile(r"[0-9a-f]{64}\.(?:neff|log)")
_OWN_NAME = re.compile(r"entry\.json|[0-9a-f]{64}\.(?:neff|log)|\..+\.[0-9a-f]{32}\.tmp")


class RemoteCache:
    """NEFF entries under an fsspec URL, keyed by `CacheKey.digest`."""

    kind = "remote"

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        storage_options: dict[str, Any] | None = None,
        trust: CacheTrust = NO_SIGNING,
    ) -> None:
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        except (ValueError, ImportError) as error:  # an unknown protocol, a missing backend
            raise CacheConfigError(
                f"the remote cache {public_url(url)} cannot be opened: {error}"
            ) from None
        self.read_only = read_only
        self.trust = trust
        self.location = public_url(url)
        self.notices: list[str] = []
        # Local filesystems can rename atomically but need directories created.
        self._local = isinstance(self.fs, LocalFileSystem)

    def entry_dir(self, key: CacheKey | str) -> str:
        digest = key if isinstance(key, str) else key.digest
        return posixpath.join(self.root, *entry_parts(digest))

    def contains(self, key: CacheKey) -> bool:
        path = posixpath.join(self.entry_dir(key), ENTRY_FILE)
        # fsspec filesystems answer `exists` from cached listings, which would
        # hide what other machines published since.
        self.fs.invalidate_cache(posixpath.dirname(path))
        return bool(self.fs.exists(path))

    def fetch(self, key: CacheKey, destination: Path | None) -> dict[str, Any] | None:
        try:
            record = parse_record(self._read_record(key.digest), key.digest, self.trust)
            if "failure" not in record:  # a failed compile's record names no objects
                assert destination is not None
                _check_object_names(record)
                self._verified_download(key.digest, record, destination)
        except FileNotFoundError:
            return None
        except CorruptEntry as error:
            self.notices.append(corrupt_notice(self.location, key, str(error), not self.read_only))
            self.discard(key)
            return None
        return caller_meta(record)

    def _read_record(self, digest: str) -> bytes:
        """entry.json's bytes, at most MAX_RECORD_BYTES of them; FileNotFoundError: a miss."""
        if self._local:
            try:
                return safefs.read_small(
                    self.root, entry_parts(digest), ENTRY_FILE, MAX_RECORD_BYTES
                )
            except (FileNotFoundError, CorruptEntry):
                raise
            except OSError as error:
                raise CorruptEntry(f"unreadable {ENTRY_FILE} ({error.strerror})") from None
        path = posixpath.join(self.entry_dir(digest), ENTRY_FILE)
        raw = self.fs.cat_file(path, start=0, end=MAX_RECORD_BYTES + 1)
        if len(raw) > MAX_RECORD_BYTES:
            raise CorruptEntry(f"{ENTRY_FILE} is more than {MAX_RECORD_BYTES} bytes")
        return bytes(raw)

    def publish(
        self,
        key: CacheKey,
        neff: Path | None,
        meta: dict[str, Any],
        log: Path | None = None,
        sha256: str | None = None,
        *,
        vouched: bool,
    ) -> None:
        if self.read_only:
            return
        if self.contains(key):
            return
        entry = self.entry_dir(key)
        record = entry_record(key, meta, neff, sha256)
        objects: dict[str, Path] = {}
        if neff is not None:  # content-addressed: two publishers never write into each other's
            record["neff"], record["log"] = f"{record['sha256']}.neff", None
            objects[record["neff"]] = neff
            if log is not None and log.exists():
                record["log"] = f"{record['sha256']}.log"
                objects[record["log"]] = log
        data = json.dumps(self.trust.sign(record, vouched), indent=2, sort_keys=True).encode()
        if not self._local:
            for name, source in objects.items():
                self.fs.put_file(str(source), posixpath.join(entry, name))  # one PUT: atomic
            # Last: from this moment readers see the entry, and everything it names is there.
            self.fs.pipe_file(posixpath.join(entry, ENTRY_FILE), data)
            return
        # On a local filesystem, each object and then entry.json are written and renamed
        # relative to the entry directory, opened (or made) one component at a time: no
        # symlink planted in the cache, before or during the publish, sends a write elsewhere.
        try:
            with safefs.opened_dir(self.root, entry_parts(key.digest), make=True) as entry_fd:
                for name, source in objects.items():
                    safefs.replace_file(entry_fd, name, source)
                safefs.replace_file(entry_fd, ENTRY_FILE, data)
        except CorruptEntry as error:
            self.notices.append(f"not publishing to {self.location}: {error}")

    def discard(self, key: CacheKey) -> None:
        """entry.json first, so readers stop seeing the entry before its objects go;
        then only the objects nkibuild names (never another writer's foreign files)."""
        if self.read_only:
            return
        if not self._local:
            entry = self.entry_dir(key)
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(posixpath.join(entry, ENTRY_FILE))
            with contextlib.suppress(FileNotFoundError):
                for path in self.fs.ls(entry, detail=False):
                    if _OWN_NAME.fullmatch(posixpath.basename(path.rstrip("/"))):
                        with contextlib.suppress(FileNotFoundError):
                            self.fs.rm_file(path)
            return
        try:
            with safefs.opened_dir(self.root, entry_parts(key.digest)[:-1]) as shard_fd:
                with (
                    contextlib.suppress(FileNotFoundError),
                    safefs.opened_dir(shard_fd, (key.digest,)) as entry_fd,
                ):
                    os.unlink(ENTRY_FILE, dir_fd=entry_fd)
                safefs.remove_owned_dir(shard_fd, key.digest, _OWN_NAME.fullmatch)
        except FileNotFoundError:
            return
        except CorruptEntry as error:
            self.notices.append(f"{self.entry_dir(key)}: {error}; not removed, left in place")

    def entries(self) -> list[str]:
        """Digests of the complete entries (those with an entry.json)."""
        self.fs.invalidate_cache()  # a listing: it must include other machines' entries
        pattern = posixpath.join(self.root, "neff", "*", "*", ENTRY_FILE)
        return sorted(posixpath.basename(posixpath.dirname(p)) for p in self.fs.glob(pattern))

    def usage(self) -> tuple[int, int]:
        """(complete entries, bytes of every object under the prefix's neff/): a listing."""
        self.fs.invalidate_cache()
        found = self.fs.find(posixpath.join(self.root, "neff"), detail=True)
        entries = sum(posixpath.basename(path) == ENTRY_FILE for path in found)
        return entries, sum(int(info.get("size") or 0) for info in found.values())

    def _verified_download(self, digest: str, record: dict[str, Any], destination: Path) -> None:
        """Download, hashing what is written: what the build uses is exactly what was
        verified. The object must be a regular file (on a local filesystem) of the
        recorded size, and never more than MAX_NEFF_BYTES are read."""
        copy_from = self._copy_local if self._local else self._copy_remote
        with atomic_output(destination) as copy:
            try:
                check_sha256(copy_from(digest, record, copy), record)
            except FileNotFoundError:
                raise CorruptEntry(f"its NEFF object {record['neff']} is missing") from None

    def _copy_local(self, digest: str, record: dict[str, Any], copy: Path) -> str:
        try:
            with (
                safefs.opened_dir(self.root, entry_parts(digest)) as entry_fd,
                safefs.opened_file(entry_fd, record["neff"], MAX_NEFF_BYTES) as (read, size),
            ):
                check_size(size, record)
                return safefs.copy_hashed(read, copy, MAX_NEFF_BYTES)
        except (FileNotFoundError, CorruptEntry):
            raise
        except OSError as error:
            if error.filename == str(copy):
                raise  # the build dir's disk, not the entry
            raise CorruptEntry(f"unreadable NEFF object ({error.strerror})") from None

    def _copy_remote(self, digest: str, record: dict[str, Any], copy: Path) -> str:
        source = posixpath.join(self.entry_dir(digest), record["neff"])
        size = self.fs.info(source).get("size")
        if not isinstance(size, int) or size > MAX_NEFF_BYTES:
            raise CorruptEntry(f"its NEFF object is {size} bytes (at most {MAX_NEFF_BYTES})")
        check_size(size, record)
        with self.fs.open(source, "rb") as remote:
            return safefs.copy_hashed(remote.read, copy, MAX_NEFF_BYTES)


def _check_object_names(record: dict[str, Any]) -> None:
    """Plain content-addressed names inside the entry: a bad record must not send a
    fetch elsewhere (`../../x`, an absolute path, another scheme)."""
    neff, log = record.get("neff"), record.get("log")
    if not isinstance(neff, str) or not _OBJECT.fullmatch(neff) or not neff.endswith(".neff"):
        raise CorruptEntry(f"{ENTRY_FILE} names no valid NEFF object ({neff!r:.60})")
    if log is not None and not (isinstance(log, str) and _OBJECT.fullmatch(log)):
        raise CorruptEntry(f"{ENTRY_FILE} names an invalid log object ({log!r:.60})")


def public_url(url: str) -> str:
    """`url` without credentials (user:password@ or a query string), for messages."""
    # fsspec chains URLs with "::" (simplecache::s3://...): clean every link.
    return "::".join(_public_link(link) for link in url.split("::"))


def _public_link(url: str) -> str:
    parts = urlsplit(url)
    if not parts.scheme or (not parts.query and "@" not in parts.netloc):
        return url
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, "", parts.fragment))
