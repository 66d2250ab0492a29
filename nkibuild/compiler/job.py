"""What an executor is given (a `CompileJob`, keyed by `cache_key`) and what it answers
(`Produced`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild.cache import CacheKey
from nkibuild.frontends import HloArtifact
from nkibuild.plan import BuildUnit
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.formats.neff import NeffInfo


@dataclass(frozen=True)
class CompileJob:
    """One unit to compile: what, from which artifact, with which compiler, into where."""

    unit: BuildUnit
    artifact: HloArtifact
    toolchain: Toolchain
    out_dir: Path  # the unit's compile directory; the NEFF goes to out_dir/model.neff
    key: CacheKey
    last_peak: int = 0  # bytes, of the unit's last finished compile (0: unknown)


@dataclass(frozen=True)
class Produced:
    """How a unit's NEFF got into its directory, and the NEFF as parsed when it was checked
    against the unit (handed on as data: a NEFF is parsed once per build)."""

    origin: str  # "compiled" here, "ray", or "cache-local"/"cache-remote" for a hit
    seconds: float
    peak_memory: int  # bytes (0: unknown)
    neff: NeffInfo

    @classmethod
    def from_cache(cls, origin: str, meta: Mapping[str, Any], neff: NeffInfo) -> Produced:
        """A NEFF taken from a cache entry: its compile's figures are in the entry."""
        seconds, peak = float(meta.get("compile_seconds", 0.0)), int(meta.get("peak_memory", 0))
        return cls(origin, seconds, peak, neff)


def cache_key(unit: BuildUnit, hlo_hash: str, toolchain: Toolchain) -> CacheKey:
    """Everything that determines the NEFF: the normalized HLO (with its sidecars) and how
    it is compiled. Nothing about where or when enters."""
    return CacheKey.of(
        hlo=hlo_hash,
        compile_args=unit.compile_args(),
        compiler_version=toolchain.compiler_version,
        target=unit.target,
        lnc=unit.lnc,
        neuron_cc_flags=toolchain.neuron_cc_flags,
    )
