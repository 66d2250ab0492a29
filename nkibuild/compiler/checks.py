"""Is a NEFF the one a unit needs? Its container, checksum, I/O signature and cores."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.cache import file_sha256
from nkibuild.compiler.record import NEFF_FILE, CompiledNeff
from nkibuild.dtypes import compatible_in_neff
from nkibuild.frontends import HloArtifact
from nkibuild.manifest.model import TensorSpec
from nkibuild.plan import BuildUnit
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.formats.neff import NeffTensor


def neff_problem(unit: BuildUnit, artifact: HloArtifact, neff: Path) -> str | None:
    """Why `neff` is not a valid NEFF for the unit (container, checksum, I/O, cores), or None."""
    from nkibuild.formats.neff import NeffFormatError, read_neff

    try:
        info = read_neff(neff)
    except NeffFormatError as error:
        return f"an invalid NEFF: {error}"
    problems = _signature_problems(artifact, as_specs(info.inputs), as_specs(info.outputs))
    # The header's NeuronCore count, not the subgraph count: a real single-core NEFF can
    # hold two subgraphs (sg00, sg01).
    if info.num_tpb != unit.lnc:
        problems.append(f"it is for {info.num_tpb} NeuronCore(s) but the unit uses lnc={unit.lnc}")
    return "a NEFF that does not match the unit: " + "; ".join(problems) if problems else None


def as_specs(tensors: tuple[NeffTensor, ...]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, tuple(t.shape), t.dtype) for t in tensors)


def _signature_problems(
    artifact: HloArtifact, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
) -> list[str]:
    """Compare by position, dtype and shape: NEFF names may differ from the manifest's, and
    a NEFF stores some dtypes as others (fp8 as int8, bool as uint8)."""
    problems = []
    pairs = (("inputs", artifact.inputs, inputs), ("outputs", artifact.outputs, outputs))
    for kind, expected, found in pairs:
        if not _same_signature(expected, found):
            problems.append(
                f"{kind} are {', '.join(map(str, found)) or 'none'}; "
                f"expected {', '.join(map(str, expected)) or 'none'}"
            )
    return problems


def _same_signature(expected: tuple[TensorSpec, ...], found: tuple[TensorSpec, ...]) -> bool:
    return len(expected) == len(found) and all(
        want.shape == got.shape and compatible_in_neff(want.dtype, got.dtype)
        for want, got in zip(expected, found, strict=True)
    )


def verified_result(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    digest: str,
    origin: str,
    seconds: float,
) -> CompiledNeff:
    from nkibuild.formats.neff import read_neff

    neff = out_dir / NEFF_FILE
    info = read_neff(neff)
    return CompiledNeff(
        unit=unit.name,
        kernel=unit.kernel,
        variant=unit.variant,
        target=unit.target,
        lnc=unit.lnc,
        neff_path=neff,
        sha256=file_sha256(neff),
        cache_key=digest,
        compiler_version=info.compiler_version or toolchain.compiler_version,
        placeholder=info.placeholder,
        inputs=as_specs(info.inputs),
        outputs=as_specs(info.outputs),
        origin=origin,
        compile_seconds=round(seconds, 3),
    )
