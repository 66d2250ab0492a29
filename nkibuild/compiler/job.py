"""What an executor is given (a `CompileJob`) and what it answers (`Produced`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nkibuild.cache import CacheKey
from nkibuild.frontends import HloArtifact
from nkibuild.plan import BuildUnit
from nkibuild.toolchain import Toolchain


@dataclass(frozen=True)
class CompileJob:
    """One unit to compile: what, from which artifact, with which compiler, into where."""

    unit: BuildUnit
    artifact: HloArtifact
    toolchain: Toolchain
    out_dir: Path  # the unit's compile directory; the NEFF goes to out_dir/model.neff
    key: CacheKey


@dataclass(frozen=True)
class Produced:
    """How a unit's NEFF got into its directory."""

    origin: str  # "compiled" here, "ray", or "cache-local"/"cache-remote" for a hit
    seconds: float
    peak_memory: int  # bytes (0: unknown)

    @classmethod
    def from_cache(cls, origin: str, meta: Mapping[str, Any]) -> Produced:
        """A NEFF taken from a cache entry: its compile's figures are in the entry."""
        return cls(origin, float(meta.get("compile_seconds", 0.0)), int(meta.get("peak_memory", 0)))
