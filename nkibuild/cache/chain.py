"""Cache tiers in lookup order: the machine's directory first, then the shared remote."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from nkibuild.cache.key import CacheKey
from nkibuild.cache.stats import CacheCounters, Event
from nkibuild.cache.store import NeffStore
from nkibuild.cache.trust import trust_from_environment


@dataclass(frozen=True)
class CacheHit:
    meta: dict[str, Any]
    location: str  # which tier served it
    kind: str  # "local" or "remote": summaries count them apart
    vouched: bool = False  # signed under this build's key: it may be signed again


class CacheChain:
    """Fetch from the first tier that has the entry; publish to every writable tier.

    A hit in a later tier is copied into the earlier ones, so the next build on
    this machine does not download it again. A remote that fails (network, auth)
    degrades to a miss or a skipped upload with a notice: a cache never fails a build.

    Every lookup and upload is counted per tier kind into `stats` (the build session's
    counters): a hit, a miss, or an error (read failed); an upload that failed.
    """

    def __init__(self, tiers: Sequence[NeffStore], stats: CacheCounters | None = None) -> None:
        self.tiers = tuple(tiers)
        self.stats = stats if stats is not None else CacheCounters()
        self._errors: list[str] = []
        for tier in self.tiers:  # the counts go to the build log of a cache we may write
            if tier.kind == "local" and not tier.read_only:
                self.stats.log_dir = Path(tier.location)

    @property
    def notices(self) -> list[str]:
        notices = [*self._errors, *(n for tier in self.tiers for n in tier.notices)]
        return list(dict.fromkeys(notices))  # a tier down says so once, not per lookup

    def fetch(self, key: CacheKey, destination: Path) -> CacheHit | None:
        for index, tier in enumerate(self.tiers):
            meta, failed = self._attempt(tier, "read from", partial(tier.fetch, key, destination))
            outcome: Event = "hits" if meta is not None else "errors" if failed else "misses"
            self.stats.count(tier.kind, outcome)
            if meta is not None:
                return self._hit(index, key, destination, meta)
        return None

    def known_failure(self, key: CacheKey) -> CacheHit | None:
        """The failed compile recorded for `key` (under `key.failure`) in the first tier
        holding one, copied into the earlier tiers as a NEFF is, and counted as that
        tier's `failures`. Asked only after `fetch` missed: a NEFF anywhere wins."""
        for index, tier in enumerate(self.tiers):
            meta = self._attempt(tier, "read from", partial(tier.fetch, key.failure, None))[0]
            if meta is not None:
                self.stats.count(tier.kind, "failures")
                return self._hit(index, key.failure, None, meta)
        return None

    def _hit(self, index: int, key: CacheKey, neff: Path | None, meta: dict[str, Any]) -> CacheHit:
        """Tier `index`'s hit, copied into the tiers before it with the trust it arrived
        with: signed there only if its signature verified here (`CacheTrust.sign`)."""
        tier = self.tiers[index]
        vouched = tier.trust.vouches(meta)
        sha256 = meta.get("sha256")  # the NEFF was hashed against it as it was copied
        self._publish_to(self.tiers[:index], key, neff, meta, None, sha256, vouched=vouched)
        return CacheHit(meta, tier.location, tier.kind, vouched)

    def locate(self, key: CacheKey) -> str | None:
        """The first tier holding an entry for `key`, without fetching it."""
        found = (
            t for t in self.tiers if self._attempt(t, "read from", partial(t.contains, key))[0]
        )
        return next((tier.location for tier in found), None)

    def discard(self, key: CacheKey, location: str) -> None:
        """Drop the entry a hit came from (it was found wrong after fetching)."""
        for tier in self.tiers:
            if tier.location == location:
                self.stats.rejected_hit(tier.kind)
                self._attempt(tier, "discard from", partial(tier.discard, key))

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
        """To every tier (see `NeffStore.publish`)."""
        self._publish_to(self.tiers, key, neff, meta, log, sha256, vouched=vouched)

    def _publish_to(self, tiers: Sequence[NeffStore], *args: Any, vouched: bool) -> None:
        for tier in tiers:
            if self._attempt(tier, "publish to", partial(tier.publish, *args, vouched=vouched))[1]:
                self.stats.count(tier.kind, "write_errors")

    def _attempt(self, tier: NeffStore, doing: str, call: Any) -> tuple[Any, bool]:
        """(what `call` returned, False), or (None, True) with a notice when it raised."""
        try:
            return call(), False
        # Remote filesystems raise their own exception types (botocore, aiohttp, ...).
        except Exception as error:
            why = error.strerror if isinstance(error, OSError) and error.strerror else error
            self._errors.append(
                f"could not {doing} the cache at {tier.location}: {why}; "
                "the build goes on without it"
            )
            return None, True


def open_cache_chain(
    local_dir: Path | None,
    remote_url: str | None,
    *,
    read_only: bool = False,
    stats: CacheCounters | None = None,
) -> CacheChain | None:
    """The configured tiers, or None when caching is off.

    Entries are signed and checked as the environment says (NKIBUILD_CACHE_HMAC_KEY /
    _KEY_FILE and NKIBUILD_REQUIRE_SIGNED_CACHE, which `--cache-key-file` and
    `--require-signed-cache` set): so every opener (compile, explain, Ray workers on
    this machine) applies the same policy. `stats`: where lookups are counted (a build
    session's counters). Raises CacheConfigError for unusable settings.
    """
    if local_dir is None and not remote_url:
        return None
    trust = trust_from_environment()
    tiers: list[NeffStore] = []
    if local_dir is not None:
        from nkibuild.cache.local import LocalCache

        tiers.append(LocalCache(local_dir, read_only=read_only, trust=trust))
    if remote_url:
        from nkibuild.cache.remote import RemoteCache

        tiers.append(RemoteCache(remote_url, read_only=read_only, trust=trust))
    return CacheChain(tiers, stats)
