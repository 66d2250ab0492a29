"""Cache tiers in lookup order: the machine's directory first, then the shared remote."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nkibuild.cache.key import CacheKey
from nkibuild.cache.store import NeffStore
from nkibuild.cache.trust import CacheTrust, trust_from_environment


@dataclass(frozen=True)
class CacheHit:
    meta: dict[str, Any]
    location: str  # which tier served it
    kind: str  # "local" or "remote": summaries count them apart


class CacheChain:
    """Fetch from the first tier that has the entry; publish to every writable tier.

    A hit in a later tier is copied into the earlier ones, so the next build on
    this machine does not download it again. A remote that fails (network, auth)
    degrades to a miss or a skipped upload with a notice: a cache never fails a build.
    """

    def __init__(self, tiers: Sequence[NeffStore]) -> None:
        self.tiers = tuple(tiers)
        self._errors: list[str] = []

    @property
    def notices(self) -> list[str]:
        return [*self._errors, *(n for tier in self.tiers for n in tier.notices)]

    def fetch(self, key: CacheKey, destination: Path) -> CacheHit | None:
        for index, tier in enumerate(self.tiers):
            meta = self._guard(tier, "read from", lambda t=tier: t.fetch(key, destination))
            if meta is not None:
                self._backfill(self.tiers[:index], key, destination, meta)
                return CacheHit(meta, tier.location, tier.kind)
        return None

    def locate(self, key: CacheKey) -> str | None:
        """The first tier holding an entry for `key`, without fetching it."""
        for tier in self.tiers:
            if self._guard(tier, "read from", lambda t=tier: t.contains(key)):
                return tier.location
        return None

    def discard(self, key: CacheKey, location: str) -> None:
        """Drop the entry a hit came from (it was found wrong after fetching)."""
        for tier in self.tiers:
            if tier.location == location:
                self._guard(tier, "discard from", lambda t=tier: t.discard(key))

    def publish(
        self, key: CacheKey, neff: Path, meta: dict[str, Any], log: Path | None = None
    ) -> None:
        for tier in self.tiers:
            self._guard(tier, "publish to", lambda t=tier: t.publish(key, neff, meta, log))

    def _backfill(
        self, tiers: Sequence[NeffStore], key: CacheKey, neff: Path, meta: dict[str, Any]
    ) -> None:
        for tier in tiers:
            self._guard(tier, "publish to", lambda t=tier: t.publish(key, neff, meta))

    def _guard(self, tier: NeffStore, doing: str, call: Any) -> Any:
        try:
            return call()
        # Remote filesystems raise their own exception types (botocore, aiohttp, ...).
        except Exception as error:
            why = error.strerror if isinstance(error, OSError) and error.strerror else error
            self._errors.append(
                f"could not {doing} the cache at {tier.location}: {why}; "
                "the build goes on without it"
            )
            return None


def open_cache_chain(
    local_dir: Path | None,
    remote_url: str | None,
    *,
    read_only: bool = False,
    trust: CacheTrust | None = None,
) -> CacheChain | None:
    """The configured tiers, or None when caching is off.

    `trust` (entry signing) defaults to the environment's NKIBUILD_CACHE_HMAC_KEY /
    _KEY_FILE and NKIBUILD_REQUIRE_SIGNED_CACHE, which `--cache-key-file` and
    `--require-signed-cache` set: so every opener (compile, explain, Ray workers on
    this machine) applies the same policy. Raises CacheConfigError for unusable settings.
    """
    if local_dir is None and not remote_url:
        return None
    trust = trust_from_environment() if trust is None else trust
    tiers: list[NeffStore] = []
    if local_dir is not None:
        from nkibuild.cache.local import LocalCache

        tiers.append(LocalCache(local_dir, read_only=read_only, trust=trust))
    if remote_url:
        from nkibuild.cache.remote import RemoteCache

        tiers.append(RemoteCache(remote_url, read_only=read_only, trust=trust))
    return CacheChain(tiers)
