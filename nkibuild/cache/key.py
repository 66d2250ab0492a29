"""The cache key: the inputs that determine a NEFF, and their digest."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from nkibuild.confine import open_regular

KEY_SCHEMA_VERSION = 1
# What nkibuild hashes (NEFFs, wheels, outputs, sources) stays far below this; the bound
# only keeps a planted /dev/zero or huge sparse file from reading on forever.
MAX_HASHED_BYTES = 16 << 30
FAILURE_INPUT = "record"  # the input that marks a key as a failed compile's (`failure`)


@dataclass(frozen=True)
class CacheKey:
    """Only content enters: no paths, user names, hosts or timestamps, so the
    same kernel hits the same entry from any checkout on any machine."""

    inputs: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, **inputs: Any) -> CacheKey:
        return cls(tuple(sorted({"key_schema": KEY_SCHEMA_VERSION, **inputs}.items())))

    @cached_property  # asked for several times per compile; the key is immutable
    def digest(self) -> str:
        canonical = json.dumps(dict(self.inputs), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    @cached_property
    def failure(self) -> CacheKey:
        """The key a failed compile of this one is recorded under: an entry of its own,
        so a NEFF entry and a failure record never meet, and a NEFF found anywhere wins."""
        return CacheKey(tuple(sorted({**dict(self.inputs), FAILURE_INPUT: "failure"}.items())))

    def to_json(self) -> dict[str, Any]:
        return dict(self.inputs)


def file_sha256(path: str | os.PathLike[str], max_bytes: int = MAX_HASHED_BYTES) -> str:
    """The sha256 of a regular file, read through the bounded reader (a FIFO or a
    device raises `confine.UnreadableFile`, an OSError, instead of blocking)."""
    digest = hashlib.sha256()
    with open_regular(path, max_bytes) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
