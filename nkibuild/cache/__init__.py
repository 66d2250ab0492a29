"""Content-addressed NEFF cache shared by every project on the machine.

An entry lives at `<root>/neff/<key[:2]>/<key>/` with `model.neff` and
`entry.json`. It is assembled in a temp dir and renamed into place, so a
reader sees a whole entry or none; every read verifies the NEFF's sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY_SCHEMA_VERSION = 1
NEFF_FILE = "model.neff"
ENTRY_FILE = "entry.json"


@dataclass(frozen=True)
class CacheKey:
    """The inputs that determine a NEFF, and their digest.

    Only content enters: no paths, user names, hosts or timestamps, so the
    same kernel hits the same entry from any checkout on any machine.
    """

    inputs: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **inputs: Any) -> CacheKey:
        return cls(tuple(sorted({"key_schema": KEY_SCHEMA_VERSION, **inputs}.items())))

    @property
    def digest(self) -> str:
        canonical = json.dumps(dict(self.inputs), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return dict(self.inputs)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def default_cache_dir() -> Path:
    override = os.environ.get("NKIBUILD_CACHE_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("nkibuild"))


@dataclass(frozen=True)
class CacheEntry:
    directory: Path
    size: int
    last_used: float  # seconds since the epoch


class NeffCache:
    """A local directory of NEFF entries keyed by `CacheKey.digest`."""

    def __init__(self, root: Path, *, read_only: bool = False) -> None:
        self.root = root
        self.read_only = read_only

    def entry_dir(self, key: CacheKey) -> Path:
        digest = key.digest
        return self.root / "neff" / digest[:2] / digest

    def get(self, key: CacheKey) -> tuple[Path, dict[str, Any]] | None:
        """The cached NEFF and its metadata, or None; a corrupt entry is discarded."""
        entry = self.entry_dir(key)
        try:
            meta = json.loads((entry / ENTRY_FILE).read_text())
            if file_sha256(entry / NEFF_FILE) == meta["sha256"]:
                if not self.read_only:
                    os.utime(entry / ENTRY_FILE)  # last use, for `nkibuild cache prune`
                return entry / NEFF_FILE, meta
        except (OSError, ValueError, KeyError):
            if not entry.exists():
                return None
        self._discard(entry)
        return None

    def put(self, key: CacheKey, neff: Path, meta: dict[str, Any]) -> None:
        """Publish a NEFF; a concurrent writer of the same key wins harmlessly."""
        if self.read_only:
            return
        entry = self.entry_dir(key)
        if entry.exists():
            return
        entry.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
        try:
            shutil.copyfile(neff, stage / NEFF_FILE)
            record = {**meta, "key": key.to_json(), "sha256": file_sha256(stage / NEFF_FILE)}
            (stage / ENTRY_FILE).write_text(json.dumps(record, indent=2, sort_keys=True))
            os.rename(stage, entry)
        except OSError:
            if not entry.exists():
                raise
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def entries(self) -> list[CacheEntry]:
        """Every complete entry (a published entry.json), oldest use first."""
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

    def prune(
        self, *, max_bytes: int | None = None, max_age_s: float | None = None
    ) -> list[CacheEntry]:
        """Drop entries older than `max_age_s`, then the least recently used beyond `max_bytes`."""
        import time

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

    def _discard(self, entry: Path) -> None:
        if self.read_only:
            return
        # Rename first so a concurrent reader never sees a half-deleted entry.
        doomed = entry.with_name(f".{entry.name}.corrupt-{os.getpid()}")
        try:
            os.rename(entry, doomed)
        except OSError:
            return
        shutil.rmtree(doomed, ignore_errors=True)
