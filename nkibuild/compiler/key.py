"""The cache key of a unit's NEFF."""

from __future__ import annotations

from nkibuild.cache import CacheKey
from nkibuild.plan import BuildUnit
from nkibuild.toolchain import Toolchain


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
