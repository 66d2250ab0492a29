"""The local NEFF cache: a directory shared by every project of the user.

An entry lives at `<root>/neff/<key[:2]>/<key>/` with `model.neff`, `compile.log`
and `entry.json`. It is assembled in a temp dir and renamed into place, so a
reader sees a whole entry or none. No locks are needed: renames are atomic and
a concurrent writer of the same key loses harmlessly, so a killed build can
never leave anything that blocks the next one.

Nothing is fsync'd: every entry proves itself when it is fetched (its record must
name its key, its NEFF must match the record's size and sha256), so an entry a power
loss left torn is found corrupt, discarded and rebuilt, never used. The NEFF and log
of a publish are hard links to the build's files where the filesystem allows (the
build replaces them, never writes into them), else copies.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import stat
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nkibuild.cache import safefs
from nkibuild.cache.key import CacheKey
from nkibuild.cache.store import (
    ENTRY_FILE,
    LOG_FILE,
    NEFF_FILE,
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
    CacheTrust,
    caller_meta,
    check_size,
    parse_record,
)
from nkibuild.fsutil import atomic_output

UNFINISHED_AFTER_S = 3600.0  # far longer than any publish takes

# The only names nkibuild writes in a local cache. Nothing else is ever removed.
OWN_FILES = frozenset({NEFF_FILE, LOG_FILE, ENTRY_FILE})
_SHARD = re.compile(r"[0-9a-f]{2}")
_DIGEST = re.compile(r"[0-9a-f]{64}")
# A publish's staging dir (8 random characters, as mkdtemp made them too) and a discard's.
_UNFINISHED = re.compile(r"\.[0-9a-f]{64}\.(?:[a-z0-9_]{8}\.new|discard-\d+(?:-[0-9a-f]{8})?)")


@dataclass(frozen=True)
class CacheEntry:
    directory: Path
    size: int
    last_used: float  # seconds since the epoch


class LocalCache:
    """A directory of NEFF entries keyed by `CacheKey.digest`; nothing under it is trusted
    (it is walked, read and cleaned through `safefs`)."""

    kind = "local"

    def __init__(
        self, root: Path, *, read_only: bool = False, trust: CacheTrust = NO_SIGNING
    ) -> None:
        self.root = root
        self.read_only = read_only
        self.trust = trust
        self.location = str(root)
        self.notices: list[str] = []
        self.failures: list[str] = []  # removals the filesystem refused (for `cache clear`)

    def entry_dir(self, key: CacheKey | str) -> Path:
        digest = key if isinstance(key, str) else key.digest
        return self.root.joinpath(*entry_parts(digest))

    def contains(self, key: CacheKey) -> bool:
        try:
            with (
                safefs.opened_dir(self.root, entry_parts(key.digest)) as fd,
                safefs.opened_file(fd, ENTRY_FILE, MAX_RECORD_BYTES),
            ):
                return True
        except (OSError, CorruptEntry):
            return False

    def fetch(self, key: CacheKey, destination: Path | None) -> dict[str, Any] | None:
        try:
            record = self._checked_copy(key.digest, destination, touch=not self.read_only)
        except FileNotFoundError:
            return None
        except CorruptEntry as error:
            self.notices.append(corrupt_notice(self.location, key, str(error), not self.read_only))
            self.discard(key)
            self.notices += self.failures  # a removal the filesystem refused is news here too
            self.failures.clear()
            return None
        return caller_meta(record)

    def _checked_copy(
        self, digest: str, destination: Path | None, *, touch: bool = False
    ) -> dict[str, Any]:
        """The entry's record, once its NEFF (if it has one) is at `destination` and
        matches it; `touch` marks the use (for `nkibuild cache prune`).

        FileNotFoundError: no entry. CorruptEntry: an entry that proves nothing (or
        cannot be read). Other OSErrors are `destination`'s (the build dir's disk)."""
        with contextlib.ExitStack() as stack:
            try:
                entry_fd = stack.enter_context(safefs.opened_dir(self.root, entry_parts(digest)))
                raw = safefs.read_small(entry_fd, (), ENTRY_FILE, MAX_RECORD_BYTES)
            except FileNotFoundError:
                raise
            except OSError as error:
                raise CorruptEntry(f"unreadable {ENTRY_FILE} ({error.strerror or error})") from None
            record = parse_record(raw, digest, self.trust)
            if "failure" not in record:  # a failed compile's record has no NEFF
                assert destination is not None
                try:
                    read, size = stack.enter_context(
                        safefs.opened_file(entry_fd, NEFF_FILE, MAX_NEFF_BYTES)
                    )
                except OSError as error:
                    raise CorruptEntry(
                        f"unreadable {NEFF_FILE} ({error.strerror or error})"
                    ) from None
                check_size(size, record)
                # What the build uses is exactly what was hashed; not fsync'd: the build
                # checks it again before use.
                with atomic_output(destination, durable=False) as copy:
                    check_sha256(safefs.copy_hashed(read, copy, MAX_NEFF_BYTES), record)
            if touch:  # a cache on a read-only mount still serves hits
                with contextlib.suppress(OSError):
                    os.utime(ENTRY_FILE, dir_fd=entry_fd, follow_symlinks=False)
        return record

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
        files = {NEFF_FILE: neff, LOG_FILE: log if log is not None and log.exists() else None}
        try:
            # Every directory opened (or made) one component at a time, and every file made
            # relative to one: a symlinked neff/, shard or entry dir, planted before or
            # during the publish, never takes a write outside the cache.
            with safefs.opened_dir(self.root, entry_parts(key.digest)[:-1], make=True) as shard_fd:
                if key.digest in os.listdir(shard_fd):
                    return
                record = self.trust.sign(entry_record(key, meta, neff, sha256), vouched)
                _assemble(shard_fd, key.digest, record, files)
        except CorruptEntry as error:
            self.notices.append(f"not publishing to {self.location}: {error}")

    def discard(self, key: CacheKey) -> None:
        self._discard(self.entry_dir(key))

    def entries(self) -> list[CacheEntry]:
        """Every complete entry (a published entry.json), least recently used first."""
        return sorted(self._scan()[0], key=lambda e: e.last_used)

    def _scan(self) -> tuple[list[CacheEntry], list[str]]:
        """(entries, things in the layout's place that are not entries: symlinks, ...)."""
        found: list[CacheEntry] = []
        strays: list[str] = []
        try:
            with safefs.opened_dir(self.root, ("neff",)) as neff_fd:
                shards, odd = safefs.child_dirs(neff_fd, _SHARD.fullmatch)
                strays += [f"neff/{name}" for name in odd]
                for shard in shards:
                    with safefs.opened_dir(neff_fd, (shard,)) as shard_fd:
                        names, odd = safefs.child_dirs(shard_fd, partial(_is_entry, shard))
                        strays += [f"neff/{shard}/{name}" for name in odd]
                        found += filter(None, (self._entry(shard_fd, name) for name in names))
        except FileNotFoundError:
            pass
        except CorruptEntry as error:
            strays.append(f"neff: {error}")
        except OSError as error:
            strays.append(f"neff: {error.strerror or error}")
        return found, strays

    def _entry(self, shard_fd: int, name: str) -> CacheEntry | None:
        try:
            with safefs.opened_dir(shard_fd, (name,)) as fd:
                files = safefs.regular_files(fd)
        except (OSError, CorruptEntry):
            return None
        record = files.get(ENTRY_FILE)
        if record is None:
            return None  # not complete: not an entry
        size = sum(
            status.st_size
            for file, status in files.items()
            if file in OWN_FILES and stat.S_ISREG(status.st_mode)
        )
        return CacheEntry(self.entry_dir(name), size, record.st_mtime)

    def verify(self) -> list[str]:
        """Check every entry as a fetch would (key, record, signature, NEFF file and
        sha256); discard and report the bad ones, and report what is not nkibuild's."""
        entries, strays = self._scan()
        problems = [
            f"{self.root / stray}: not an entry (not followed, left in place)" for stray in strays
        ]
        for entry in entries:
            try:
                with tempfile.TemporaryDirectory(prefix="nkibuild-verify-") as scratch:
                    self._checked_copy(entry.directory.name, Path(scratch) / NEFF_FILE)
            except CorruptEntry as error:
                problems.append(f"{entry.directory}: {error}")
                self._discard(entry.directory)
            except OSError as error:
                problems.append(f"{entry.directory}: unreadable entry ({error.strerror or error})")
                self._discard(entry.directory)
        problems += self.notices
        self.notices.clear()
        return problems

    def prune(
        self, *, max_bytes: int | None = None, max_age_s: float | None = None
    ) -> list[CacheEntry]:
        """Drop entries older than `max_age_s`, then the least recently used beyond
        `max_bytes`; the entries actually removed (refusals are in `failures`)."""
        entries = self.entries()
        now = time.time()
        doomed = [e for e in entries if max_age_s is not None and now - e.last_used > max_age_s]
        kept = [e for e in entries if e not in doomed]
        total = sum(e.size for e in kept)
        for entry in kept:
            if max_bytes is None or total <= max_bytes:
                break
            doomed.append(entry)
            total -= entry.size
        return [entry for entry in doomed if self._discard(entry.directory)]

    def clear(self) -> list[CacheEntry]:
        return self.prune(max_bytes=0)

    def remove_unfinished(self, *, older_than_s: float) -> int:
        """Remove publishes and discards a killed build left (hidden entry dirs of the
        names nkibuild gives them); only old ones, since another build may be
        publishing into a shared cache right now."""
        before = time.time() - older_than_s
        removed = 0
        try:
            with safefs.opened_dir(self.root, ("neff",)) as neff_fd:
                for shard in safefs.child_dirs(neff_fd, _SHARD.fullmatch)[0]:
                    with safefs.opened_dir(neff_fd, (shard,)) as shard_fd:
                        for name in safefs.child_dirs(shard_fd, _UNFINISHED.fullmatch)[0]:
                            removed += self._remove_unfinished(shard_fd, shard, name, before)
        except (OSError, CorruptEntry):
            pass  # no neff/ (or not a real one): nothing of nkibuild's to remove
        return removed

    def _remove_unfinished(self, shard_fd: int, shard: str, name: str, before: float) -> int:
        """1 if `name` in the shard was older than `before`, and removed; else 0."""
        try:
            if os.stat(name, dir_fd=shard_fd, follow_symlinks=False).st_mtime > before:
                return 0
            safefs.remove_owned_dir(shard_fd, name, OWN_FILES.__contains__)
            return 1
        except CorruptEntry as error:
            self.notices.append(f"{self.root / 'neff' / shard / name}: {error}; left in place")
        except OSError as error:
            self.failures.append(
                f"could not remove {self.root / 'neff' / shard / name}: {error.strerror or error}"
            )
        return 0

    def _discard(self, entry: Path) -> bool:
        """Remove an entry directory of nkibuild's layout holding only nkibuild's files.

        It is renamed aside first, so a concurrent reader never sees it half-deleted.
        Anything that is not nkibuild's (a symlink, a foreign file) is left in place
        and reported; a refusal of the filesystem is recorded in `failures`."""
        if self.read_only:
            return False
        parts = entry_parts(entry.name)
        try:
            with safefs.opened_dir(self.root, parts[:-1]) as shard_fd:
                with safefs.opened_dir(shard_fd, parts[-1:]) as entry_fd:
                    safefs.check_owned(entry_fd, OWN_FILES.__contains__)
                doomed = f".{entry.name}.discard-{os.getpid()}-{secrets.token_hex(4)}"
                os.rename(entry.name, doomed, src_dir_fd=shard_fd, dst_dir_fd=shard_fd)
                safefs.remove_owned_dir(shard_fd, doomed, OWN_FILES.__contains__)
        except FileNotFoundError:
            return False
        except CorruptEntry as error:
            self.notices.append(f"{entry}: {error}; not removed, left in place")
            return False
        except OSError as error:
            self.failures.append(f"could not remove {entry}: {error.strerror or error}")
            return False
        return True


def _assemble(
    shard_fd: int, digest: str, record: dict[str, Any], files: dict[str, Path | None]
) -> None:
    """Assemble an entry in a staging directory beside it and rename it into place: a
    reader sees a whole entry or none. A concurrent writer that won is no failure."""
    stage = f".{digest}.{secrets.token_hex(4)}.new"
    os.mkdir(stage, dir_fd=shard_fd)  # the mode mkdir() gives: it becomes the entry
    try:
        with safefs.opened_dir(shard_fd, (stage,)) as stage_fd:
            for name, source in files.items():
                if source is None:
                    continue
                try:  # a hard link: the build replaces its files, never writes into them
                    os.link(source, name, dst_dir_fd=stage_fd, follow_symlinks=False)
                except OSError:  # another filesystem (EXDEV), or one without hard links
                    safefs.replace_file(stage_fd, name, source)
            # One line (json's C encoder): entries are read by nkibuild, and fetched often.
            safefs.replace_file(stage_fd, ENTRY_FILE, json.dumps(record, sort_keys=True).encode())
        os.rename(stage, digest, src_dir_fd=shard_fd, dst_dir_fd=shard_fd)
    except BaseException as error:
        with contextlib.suppress(OSError, CorruptEntry):  # a foreign file in it: left
            safefs.remove_owned_dir(shard_fd, stage, OWN_FILES.__contains__)
        if not (isinstance(error, OSError) and digest in os.listdir(shard_fd)):
            raise


def _is_entry(shard: str, name: str) -> bool:
    return _DIGEST.fullmatch(name) is not None and name[:2] == shard
