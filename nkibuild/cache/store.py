"""What every NEFF cache tier offers the compile stage (local directory, remote URL)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from nkibuild.cache.key import CacheKey, file_sha256

if TYPE_CHECKING:
    from nkibuild.cache.trust import CacheTrust

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
    trust: CacheTrust  # what its entries must prove, and whether it signs what it stores
    kind: str  # "local" (this machine's directory) or "remote" (shared)
    read_only: bool
    notices: list[str]

    def contains(self, key: CacheKey) -> bool:
        """Whether a complete entry exists (unverified: for reports, not for use)."""
        ...

    def fetch(self, key: CacheKey, destination: Path | None) -> dict[str, Any] | None:
        """Copy the entry's NEFF to `destination` (atomically); its metadata, or None.
        A record without a NEFF (a failed compile's, under `key.failure`) copies nothing."""
        ...

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
        """Store a NEFF (None: a record alone) with its metadata (and compile log); a no-op
        when read-only. `sha256`: the NEFF's, where the caller has just computed it.
        `vouched`: this build vouches for it (see `CacheTrust.sign`)."""
        ...

    def discard(self, key: CacheKey) -> None:
        """Remove an entry found wrong by its user; a no-op when read-only."""
        ...


def entry_record(
    key: CacheKey, meta: dict[str, Any], neff: Path | None, sha256: str | None = None
) -> dict[str, Any]:
    """entry.json: the caller's metadata plus what makes the entry self-describing (its
    signature is the tier's `CacheTrust.sign`, which drops one `meta` carries)."""
    record = {**meta, "key": key.to_json(), "digest": key.digest}
    if neff is not None:
        record.update(sha256=sha256 or file_sha256(neff), size=neff.stat().st_size)
    return record


def entry_parts(digest: str) -> tuple[str, str, str]:
    """An entry's directory under a tier's root: `neff/<key[:2]>/<key>`."""
    return ("neff", digest[:2], digest)


def check_sha256(found: str, record: dict[str, Any]) -> None:
    if found != record["sha256"]:
        raise CorruptEntry(
            f"NEFF sha256 {found[:16]}... differs from the recorded {record['sha256']}"
        )


def corrupt_notice(location: str, key: CacheKey, why: str, discarded: bool) -> str:
    action = "discarded; it will be rebuilt" if discarded else "ignored (read-only cache)"
    return f"corrupt cache entry {key.digest[:16]} in {location}: {why}; {action}"
