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
import posixpath
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import fsspec
from fsspec.implementations.local import LocalFileSystem

from nkibuild.cache.key import CacheKey, file_sha256
from nkibuild.cache.store import ENTRY_FILE, CorruptEntry, corrupt_notice, entry_record
from nkibuild.fsutil import atomic_output

# entry.json fields that describe the remote layout, not the NEFF: kept out of
# the metadata `fetch` returns, so a hit backfilled into the local tier does
# not carry object names that mean nothing there.
STORAGE_FIELDS = ("neff", "log")


class RemoteCache:
    """NEFF entries under an fsspec URL, keyed by `CacheKey.digest`."""

    kind = "remote"

    def __init__(
        self,
        url: str,
        *,
        read_only: bool = False,
        storage_options: dict[str, Any] | None = None,
    ) -> None:
        self.fs, self.root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        self.read_only = read_only
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
        entry = self.entry_dir(key)
        try:
            raw = self.fs.cat_file(posixpath.join(entry, ENTRY_FILE))
        except FileNotFoundError:
            return None
        try:
            record = _parse_record(raw)
            self._verified_download(posixpath.join(entry, record["neff"]), destination, record)
        except CorruptEntry as error:
            self._corrupt(key, str(error))
            return None
        return {k: v for k, v in record.items() if k not in STORAGE_FIELDS}

    def publish(
        self, key: CacheKey, neff: Path, meta: dict[str, Any], log: Path | None = None
    ) -> None:
        if self.read_only:
            return
        entry = self.entry_dir(key)
        entry_file = posixpath.join(entry, ENTRY_FILE)
        if self._exists(entry_file):
            return
        if self._local:
            self.fs.makedirs(entry, exist_ok=True)
        sha256 = file_sha256(neff)
        record = entry_record(key, sha256, meta)
        record["neff"] = self._upload(neff, entry, f"{sha256}.neff")
        record["log"] = None
        if log is not None and log.exists():
            record["log"] = self._upload(log, entry, f"{sha256}.log")
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

    def _verified_download(self, source: str, destination: Path, record: dict[str, Any]) -> None:
        """Download, then check the copy: what the build uses is exactly what was verified."""
        with atomic_output(destination) as copy:
            try:
                self.fs.get_file(source, str(copy))
            except FileNotFoundError:
                raise CorruptEntry(f"its NEFF object {record['neff']} is missing") from None
            found = file_sha256(copy)
            if found != record["sha256"]:
                raise CorruptEntry(
                    f"NEFF sha256 {found[:16]}... differs from the recorded {record['sha256']}"
                )

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
        # entry.json first, so readers stop seeing the entry before its objects go.
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(posixpath.join(entry, ENTRY_FILE))
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(entry, recursive=True)


def _parse_record(raw: bytes) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError as error:  # includes undecodable bytes
        raise CorruptEntry(f"unreadable {ENTRY_FILE} ({error})") from None
    if not isinstance(record, dict):
        raise CorruptEntry(f"{ENTRY_FILE} is not an object")
    neff, sha256 = record.get("neff"), record.get("sha256")
    if not isinstance(sha256, str):
        raise CorruptEntry(f"{ENTRY_FILE} records no sha256")
    # A plain name inside the entry: a bad record must not send a fetch elsewhere.
    if not isinstance(neff, str) or not neff or "/" in neff or neff.startswith("."):
        raise CorruptEntry(f"{ENTRY_FILE} names no valid NEFF object ({neff!r})")
    return record


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
