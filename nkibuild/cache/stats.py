"""Hits, misses and errors of each cache tier: counted during a build, kept for the last builds.

`CacheCounters` lives on the build session; `CacheChain` counts every lookup and
upload at the tier boundary into it. At the end of a build its `TierCounts` are
appended to a bounded log in the local cache directory (`stats/builds.json`, the
last `MAX_BUILDS` builds of every project on this machine), which
`nkibuild cache stats` sums. Concurrent builds append under a lock and replace
the log atomically, so none loses another's record; a damaged log is set aside
with a notice and a new one started. As everything under the cache root, the log
is untrusted: read and written without following symlinks, bounded in size.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

from nkibuild.cache import safefs
from nkibuild.cache.store import CorruptEntry
from nkibuild.formats.jsonlimits import JsonLimits, load_json
from nkibuild.locks import lock_descriptor

TIERS = ("local", "remote")
LOG_DIR = "stats"
LOG_FILE = "builds.json"
LOG_FORMAT = 1
MAX_BUILDS = 100
LOCK_TIMEOUT_S = 10.0
MAX_LOG_BYTES = 4 << 20  # a full log is ~40 KB
_LOG_LIMITS = JsonLimits(MAX_LOG_BYTES, max_depth=8, max_int_digits=20, allow_nonfinite=False)

Event = Literal["hits", "misses", "errors", "write_errors", "failures"]


@dataclass(frozen=True)
class TierCounts:
    """One tier's counts. A lookup is a hit, a miss (including an entry found corrupt, or
    a NEFF that did not fit its unit) or an error (the tier could not be read: counted
    apart, though the build treats it as a miss). `write_errors`: uploads that failed.
    `failures`: known compile failures the tier reported (looked up after a miss)."""

    hits: int = 0
    misses: int = 0
    errors: int = 0
    write_errors: int = 0
    failures: int = 0

    @property
    def lookups(self) -> int:
        return self.hits + self.misses + self.errors

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.lookups if self.lookups else None

    def __add__(self, other: TierCounts) -> TierCounts:
        return TierCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def to_json(self) -> dict[str, Any]:
        counts: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**counts, "lookups": self.lookups, "hit_rate": self.hit_rate}

    @classmethod
    def from_json(cls, data: Any) -> TierCounts:
        """Counts from a log record; ValueError unless every count is a non-negative int."""
        if not isinstance(data, dict):
            raise ValueError("a tier's counts are not an object")
        values = [data.get(f.name, 0) for f in fields(cls)]
        if not all(type(v) is int and v >= 0 for v in values):
            raise ValueError("a count is not a non-negative integer")
        return cls(*values)


class CacheCounters:
    """A build's counts per tier kind ("local", "remote"); compiles count from many threads.

    `log_dir`: the writable local cache the counts were made with (set by the chain),
    whose build log records them; None when there was none (read-only, or no local tier).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, TierCounts] = {}
        self.log_dir: Path | None = None

    def count(self, tier: str, event: Event) -> None:
        with self._lock:
            counts = self._counts.get(tier, TierCounts())
            self._counts[tier] = replace(counts, **{event: getattr(counts, event) + 1})

    def rejected_hit(self, tier: str) -> None:
        """A hit whose NEFF was then found not to fit its unit: it served nothing, a miss."""
        with self._lock:
            counts = self._counts.get(tier, TierCounts())
            self._counts[tier] = replace(counts, hits=counts.hits - 1, misses=counts.misses + 1)

    def snapshot(self) -> dict[str, TierCounts]:
        with self._lock:
            return dict(self._counts)


@dataclass(frozen=True)
class BuildRecord:
    finished: float  # seconds since the epoch
    tiers: Mapping[str, TierCounts]

    def to_json(self) -> dict[str, Any]:
        tiers = {name: counts.to_json() for name, counts in self.tiers.items()}
        return {"finished": self.finished, "tiers": tiers}

    @classmethod
    def from_json(cls, data: Any) -> BuildRecord:
        if not isinstance(data, dict) or not isinstance(data.get("tiers"), dict):
            raise ValueError("a build record is not an object with tiers")
        finished = data.get("finished")
        if type(finished) not in (int, float):
            raise ValueError("a build record has no finishing time")
        recorded = data["tiers"]
        tiers = {name: TierCounts.from_json(recorded[name]) for name in TIERS if name in recorded}
        return cls(float(finished), tiers)


@dataclass(frozen=True)
class BuildLog:
    """The builds recorded in a cache directory, oldest first, and what was wrong with it."""

    builds: tuple[BuildRecord, ...]
    notices: tuple[str, ...] = ()

    def totals(self) -> dict[str, TierCounts]:
        return totals(record.tiers for record in self.builds)


def totals(per_build: Iterable[Mapping[str, TierCounts]]) -> dict[str, TierCounts]:
    summed = {tier: TierCounts() for tier in TIERS}
    for tiers in per_build:
        for tier, counts in tiers.items():
            summed[tier] = summed.get(tier, TierCounts()) + counts
    return summed


def log_path(cache_dir: Path) -> Path:
    return cache_dir / LOG_DIR / LOG_FILE


def read_log(cache_dir: Path) -> BuildLog:
    """The log of `cache_dir`; an absent one is empty, a damaged one empty with a notice."""
    path = log_path(cache_dir)
    try:
        return BuildLog(_parse(safefs.read_small(cache_dir, (LOG_DIR,), LOG_FILE, MAX_LOG_BYTES)))
    except FileNotFoundError:
        return BuildLog(())
    except OSError as error:
        return BuildLog((), (f"cannot read the cache's build log {path}: {error.strerror}",))
    except (CorruptEntry, ValueError) as error:  # ValueError: JsonLimitError too
        notice = f"the cache's build log {path} is damaged ({error}); its counts are ignored"
        return BuildLog((), (notice,))


def _parse(data: bytes) -> tuple[BuildRecord, ...]:
    document = load_json(data, _LOG_LIMITS)
    if not isinstance(document, dict) or document.get("format") != LOG_FORMAT:
        raise ValueError(f"not a format-{LOG_FORMAT} build log")
    builds = document.get("builds")
    if not isinstance(builds, list):
        raise ValueError("no list of builds")
    return tuple(BuildRecord.from_json(entry) for entry in builds)


def record_build(
    cache_dir: Path, tiers: Mapping[str, TierCounts], *, finished: float | None = None
) -> list[str]:
    """Append one build's counts to the log of `cache_dir`, keeping the last MAX_BUILDS;
    the notices to show (a damaged log replaced, a log that could not be written)."""
    path = log_path(cache_dir)
    record = BuildRecord(time.time() if finished is None else finished, dict(tiers))
    try:
        with safefs.opened_dir(cache_dir, (LOG_DIR,), make=True) as stats_dir:
            # Held through the descriptor that checked the directory, until it is closed;
            # each caller opens its own, so threads of one process exclude each other too.
            if not lock_descriptor(stats_dir, LOCK_TIMEOUT_S):
                raise TimeoutError
            log = read_log(cache_dir)
            builds = (*log.builds, record)[-MAX_BUILDS:]
            document = {"format": LOG_FORMAT, "builds": [b.to_json() for b in builds]}
            safefs.replace_file(stats_dir, LOG_FILE, json.dumps(document, indent=1).encode())
    except TimeoutError:
        return [f"the cache's build log {path} stayed locked; this build's counts are not in it"]
    except CorruptEntry as error:
        return [f"not recording this build's cache counts in {path}: {error}"]
    except OSError as error:
        return [f"could not record this build's cache counts in {path}: {error.strerror}"]
    return [f"{notice}; a new one was started" for notice in log.notices]
