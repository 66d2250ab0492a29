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
import hashlib
import json
import os
import posixpath
import re
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem

from nkibuild.cache import safefs
from nkibuild.cache.key import CacheKey, file_sha256
from nkibuild.cache.store import ENTRY_FILE, CorruptEntry, corrupt_notice, entry_record
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
_CHUNK = 1 << 20


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
        return posixpath.join(self.root, "neff", digest[:2], digest)

    def contains(self, key: CacheKey) -> bool:
        return self._exists(posixpath.join(self.entry_dir(key), ENTRY_FILE))

    def fetch(self, key: CacheKey, destination: Path) -> dict[str, Any] | None:
        try:
            raw = self._read_record(key.digest)
        except FileNotFoundError:
            return None
        except CorruptEntry as error:
            self._corrupt(key, str(error))
            return None
        try:
            record = parse_record(raw, key.digest, self.trust)
            _check_object_names(record)
            self._verified_download(key.digest, record, destination)
        except CorruptEntry as error:
            self._corrupt(key, str(error))
            return None
        return caller_meta(record)

    def _read_record(self, digest: str) -> bytes:
        """entry.json's bytes, at most MAX_RECORD_BYTES of them; FileNotFoundError: a miss."""
        if self._local:
            try:
                return safefs.read_small(self.root, _parts(digest), ENTRY_FILE, MAX_RECORD_BYTES)
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
        neff: Path,
        meta: dict[str, Any],
        log: Path | None = None,
        sha256: str | None = None,
    ) -> None:
        if self.read_only:
            return
        entry = self.entry_dir(key)
        entry_file = posixpath.join(entry, ENTRY_FILE)
        if self._exists(entry_file):
            return
        if self._local:
            try:  # never through a symlinked neff/, shard or entry dir
                safefs.make_dirs(self.root, _parts(key.digest))
            except CorruptEntry as error:
                self.notices.append(f"not publishing to {self.location}: {error}")
                return
        sha256 = sha256 or file_sha256(neff)
        record = entry_record(key, sha256, meta, neff.stat().st_size)
        record["neff"] = self._upload(neff, entry, f"{sha256}.neff")
        record["log"] = None
        if log is not None and log.exists():
            record["log"] = self._upload(log, entry, f"{sha256}.log")
        record = self.trust.sign(record)
        # Last: from this moment readers see the entry, and everything it names is there.
        data = json.dumps(record, indent=2, sort_keys=True).encode()
        self._write_atomically(entry_file, lambda path: self.fs.pipe_file(path, data))

    def discard(self, key: CacheKey) -> None:
        if not self.read_only:
            self._discard(self.entry_dir(key))

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
        name = record["neff"]
        with atomic_output(destination) as copy:
            try:
                if self._local:
                    found = self._copy_local(digest, record, copy)
                else:
                    found = self._copy_remote(
                        posixpath.join(self.entry_dir(digest), name), record, copy
                    )
            except FileNotFoundError:
                raise CorruptEntry(f"its NEFF object {name} is missing") from None
            if found != record["sha256"]:
                raise CorruptEntry(
                    f"NEFF sha256 {found[:16]}... differs from the recorded {record['sha256']}"
                )

    def _copy_local(self, digest: str, record: dict[str, Any], copy: Path) -> str:
        try:
            with (
                safefs.opened_dir(self.root, _parts(digest)) as entry_fd,
                safefs.opened_file(entry_fd, record["neff"], MAX_NEFF_BYTES) as (fd, size),
            ):
                check_size(size, record)
                return safefs.copy_hashed(fd, copy, MAX_NEFF_BYTES)[0]
        except (FileNotFoundError, CorruptEntry):
            raise
        except OSError as error:
            if error.filename == str(copy):
                raise  # the build dir's disk, not the entry
            raise CorruptEntry(f"unreadable NEFF object ({error.strerror})") from None

    def _copy_remote(self, source: str, record: dict[str, Any], copy: Path) -> str:
        size = self.fs.info(source).get("size")
        if not isinstance(size, int) or size > MAX_NEFF_BYTES:
            raise CorruptEntry(f"its NEFF object is {size} bytes (at most {MAX_NEFF_BYTES})")
        check_size(size, record)
        digest, total = hashlib.sha256(), 0
        with self.fs.open(source, "rb") as remote, open(copy, "wb") as out:
            while block := remote.read(_CHUNK):
                total += len(block)
                if total > MAX_NEFF_BYTES:
                    raise CorruptEntry(f"its NEFF object is more than {MAX_NEFF_BYTES} bytes")
                digest.update(block)
                out.write(block)
        return digest.hexdigest()

    def _upload(self, source: Path, entry: str, name: str) -> str:
        self._write_atomically(
            posixpath.join(entry, name), lambda path: self.fs.put_file(str(source), path)
        )
        return name

    def _write_atomically(self, path: str, write: Callable[[str], object]) -> None:
        """A single PUT to an object store is atomic; a local file is written then renamed.

        Content-addressed objects go through here too: on a local filesystem two
        writers of the same sha256 would otherwise truncate each other's copy.
        """
        if not self._local:
            write(path)
            return
        directory, name = posixpath.split(path)
        temp = posixpath.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            write(temp)
            self.fs.mv(temp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(temp)

    def _exists(self, path: str) -> bool:
        # fsspec filesystems answer `exists` from cached listings, which would
        # hide what other machines published since.
        self.fs.invalidate_cache(posixpath.dirname(path))
        return bool(self.fs.exists(path))

    def _corrupt(self, key: CacheKey, why: str) -> None:
        self.notices.append(corrupt_notice(self.location, key, why, discarded=not self.read_only))
        if not self.read_only:
            self._discard(self.entry_dir(key))

    def _discard(self, entry: str) -> None:
        """entry.json first, so readers stop seeing the entry before its objects go;
        then only the objects nkibuild names (never another writer's foreign files)."""
        if self._local:
            self._discard_local(posixpath.basename(entry))
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(posixpath.join(entry, ENTRY_FILE))
        with contextlib.suppress(FileNotFoundError):
            for path in self.fs.ls(entry, detail=False):
                if _OWN_NAME.fullmatch(posixpath.basename(path.rstrip("/"))):
                    with contextlib.suppress(FileNotFoundError):
                        self.fs.rm_file(path)

    def _discard_local(self, digest: str) -> None:
        try:
            with safefs.opened_dir(self.root, _parts(digest)[:-1]) as shard_fd:
                with (
                    contextlib.suppress(FileNotFoundError),
                    safefs.opened_dir(shard_fd, (digest,)) as entry_fd,
                ):
                    if safefs.regular_files(entry_fd).get(ENTRY_FILE) is not None:
                        os.unlink(ENTRY_FILE, dir_fd=entry_fd)
                safefs.remove_owned_dir(shard_fd, digest, _is_own_name)
        except FileNotFoundError:
            return
        except CorruptEntry as error:
            self.notices.append(f"{self.entry_dir(digest)}: {error}; not removed, left in place")


def _is_own_name(name: str) -> bool:
    return _OWN_NAME.fullmatch(name) is not None


def _parts(digest: str) -> tuple[str, str, str]:
    return ("neff", digest[:2], digest)


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
