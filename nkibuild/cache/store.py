"""What every NEFF cache tier offers the compile stage (local directory, remote URL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from nkibuild.cache.key import CacheKey

NEFF_FILE = "model.neff"
ENTRY_FILE = "entry.json"
LOG_FILE = "compile.log"


class CorruptEntry(Exception):
    """An entry whose files do not match its record; raised inside a tier, never out of it."""


class NeffStore(Protocol):
    """One tier of the cache. Entries are immutable and published whole.

    `fetch` verifies the NEFF's sha256 before returning; an entry that fails is
    discarded (unless read-only) and described in `notices`, never returned.
    """

    location: str  # a directory or URL, for messages
    kind: str  # "local" (this machine's directory) or "remote" (shared)
    read_only: bool
    notices: list[str]

    def contains(self, key: CacheKey) -> bool:
        """Whether a complete entry exists (unverified: for reports, not for use)."""
        ...

    def fetch(self, key: CacheKey, destination: Path) -> dict[str, Any] | None:
        """Copy the entry's NEFF to `destination` (atomically); its metadata, or None."""
        ...

    def publish(
        self,
        key: CacheKey,
        neff: Path,
        meta: dict[str, Any],
        log: Path | None = None,
        sha256: str | None = None,
    ) -> None:
        """Store a NEFF with its metadata (and compile log); a no-op when read-only.
        `sha256`: the NEFF's, where the caller has just computed it."""
        ...

    def discard(self, key: CacheKey) -> None:
        """Remove an entry found wrong by its user; a no-op when read-only."""
        ...


def entry_record(key: CacheKey, sha256: str, meta: dict[str, Any], size: int) -> dict[str, Any]:
    """entry.json: the caller's metadata plus what makes the entry self-describing (a
    signature, if any, is added by the tier's `CacheTrust`)."""
    meta = {k: v for k, v in meta.items() if k != "signature"}
    return {**meta, "key": key.to_json(), "digest": key.digest, "sha256": sha256, "size": size}


def corrupt_notice(location: str, key: CacheKey, why: str, discarded: bool) -> str:
    action = "discarded; it will be rebuilt" if discarded else "ignored (read-only cache)"
    return f"corrupt cache entry {key.digest[:16]} in {location}: {why}; {action}"
