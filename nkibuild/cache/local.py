"""The local NEFF cache: a directory shared by every project of the user.

An entry lives at `<root>/neff/<key[:2]>/<key>/` with `model.neff`, `compile.log`
and `entry.json`. It is assembled in a temp dir and renamed into place, so a
reader sees a whole entry or none. No locks are needed: renames are atomic and
a concurrent writer of the same key loses harmlessly, so a killed build can
never leave anything that blocks the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nkibuild.cache.key import CacheKey, file_sha256
from nkibuild.cache.store import (
    ENTRY_FILE,
    LOG_FILE,
    NEFF_FILE,
    CorruptEntry,
    corrupt_notice,
    entry_record,
)
from nkibuild.fsutil import atomic_output

UNFINISHED_AFTER_S = 3600.0  # far longer than any publish takes


@dataclass(frozen=True)
class CacheEntry:
    directory: Path
    size: int
    last_used: float  # seconds since the epoch


class LocalCache:
    """A directory of NEFF entries keyed by `CacheKey.digest`."""

    kind = "local"

    def __init__(self, root: Path, *, read_only: bool = False) -> None:
        self.root = root
        self.read_only = read_only
        self.location = str(root)
        self.notices: list[str] = []

    def entry_dir(self, key: CacheKey | str) -> Path:
        digest = key if isinstance(key, str) else key.digest
        return self.root / "neff" / digest[:2] / digest

    def contains(self, key: CacheKey) -> bool:
        return (self.entry_dir(key) / ENTRY_FILE).is_file()

    def fetch(self, key: CacheKey, destination: Path) -> dict[str, Any] | None:
        entry = self.entry_dir(key)
        try:
            meta = json.loads((entry / ENTRY_FILE).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            self._corrupt(key, f"unreadable {ENTRY_FILE} ({error})")
            return None
        try:
            _verified_copy(entry / NEFF_FILE, destination, meta.get("sha256"))
        except CorruptEntry as error:
            self._corrupt(key, str(error))
            return None
        if not self.read_only:
            _touch(entry / ENTRY_FILE)  # last use, for `nkibuild cache prune`
        return meta

    def publish(
        self, key: CacheKey, neff: Path, meta: dict[str, Any], log: Path | None = None
    ) -> None:
        if self.read_only:
            return
        entry = self.entry_dir(key)
        if entry.exists():
            return
        entry.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".new", dir=entry.parent))
        try:
            shutil.copyfile(neff, stage / NEFF_FILE)
            if log is not None and log.exists():
                shutil.copyfile(log, stage / LOG_FILE)
            record = entry_record(key, file_sha256(stage / NEFF_FILE), meta)
            (stage / ENTRY_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
            os.rename(stage, entry)
        except OSError:
            if not entry.exists():
                raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def discard(self, key: CacheKey) -> None:
        self._discard(self.entry_dir(key))

    def entries(self) -> list[CacheEntry]:
        """Every complete entry (a published entry.json), least recently used first."""
        found = []
        for meta_file in self.root.glob(f"neff/??/*/{ENTRY_FILE}"):
            entry = meta_file.parent
            if entry.name.startswith("."):
                continue  # a publish or discard in progress
            try:
                size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
                used = meta_file.stat().st_mtime  # touched on every hit
            except OSError:
                continue
            found.append(CacheEntry(entry, size, used))
        return sorted(found, key=lambda e: e.last_used)

    def verify(self) -> list[str]:
        """Check every entry's NEFF against its recorded sha256; discard and report the bad."""
        problems = []
        for entry in self.entries():
            try:
                meta = json.loads((entry.directory / ENTRY_FILE).read_text())
                ok = file_sha256(entry.directory / NEFF_FILE) == meta["sha256"]
                why = "NEFF does not match its recorded sha256"
            except (OSError, ValueError, KeyError) as error:
                ok, why = False, f"unreadable entry ({error})"
            if not ok:
                problems.append(f"{entry.directory}: {why}")
                self._discard(entry.directory)
        return problems

    def prune(
        self, *, max_bytes: int | None = None, max_age_s: float | None = None
    ) -> list[CacheEntry]:
        """Drop entries older than `max_age_s`, then the least recently used beyond `max_bytes`."""
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
        for entry in doomed:
            self._discard(entry.directory)
        return doomed

    def clear(self) -> list[CacheEntry]:
        return self.prune(max_bytes=0)

    def remove_unfinished(self, *, older_than_s: float) -> int:
        """Remove publishes and discards a killed build left (hidden entry dirs); only
        old ones, since another build may be publishing into a shared cache right now."""
        now = time.time()
        removed = 0
        for stale in self.root.glob("neff/??/.*"):
            with contextlib.suppress(OSError):
                if now - stale.stat().st_mtime > older_than_s:
                    shutil.rmtree(stale)
                    removed += 1
        return removed

    def _corrupt(self, key: CacheKey, why: str) -> None:
        self.notices.append(corrupt_notice(self.location, key, why, not self.read_only))
        self._discard(self.entry_dir(key))

    def _discard(self, entry: Path) -> None:
        if self.read_only:
            return
        # Rename first so a concurrent reader never sees a half-deleted entry.
        doomed = entry.with_name(f".{entry.name}.discard-{os.getpid()}")
        try:
            os.rename(entry, doomed)
        except OSError:
            return
        shutil.rmtree(doomed, ignore_errors=True)


def _verified_copy(source: Path, destination: Path, sha256: object) -> None:
    """Copy, then check the copy: what the build uses is exactly what was verified."""
    with atomic_output(destination) as copy:
        try:
            shutil.copyfile(source, copy)
        except OSError as error:
            raise CorruptEntry(f"unreadable NEFF ({error})") from None
        found = file_sha256(copy)
        if found != sha256:
            raise CorruptEntry(f"NEFF sha256 {found[:16]}... differs from the recorded {sha256}")


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):  # a cache on a read-only mount still serves hits
        os.utime(path)
