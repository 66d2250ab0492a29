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
    from nkibuild.compiler.job import Produced
    from nkibuild.formats.neff import NeffInfo, NeffTensor


def checked_neff(
    unit: BuildUnit, artifact: HloArtifact, neff: Path
) -> tuple[NeffInfo | None, str | None]:
    """`neff` parsed (None if it is not a NEFF at all) and why it is not a valid NEFF for
    the unit (container, checksum, I/O, cores), or None. The parse is handed on, so a
    NEFF is read once however many stages look at it."""
    from nkibuild.formats.neff import NeffFormatError, read_neff

    try:
        info = read_neff(neff)
    except NeffFormatError as error:
        return None, f"an invalid NEFF: {error}"
    problems = _signature_problems(artifact, as_specs(info.inputs), as_specs(info.outputs))
    # The header's NeuronCore count, not the subgraph count: a real single-core NEFF can
    # hold two subgraphs (sg00, sg01).
    if info.num_tpb != unit.lnc:
        problems.append(f"it is for {info.num_tpb} NeuronCore(s) but the unit uses lnc={unit.lnc}")
    if problems:
        return info, "a NEFF that does not match the unit: " + "; ".join(problems)
    return info, None


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
        same = len(expected) == len(found) and all(
            want.shape == got.shape and compatible_in_neff(want.dtype, got.dtype)
            for want, got in zip(expected, found, strict=True)
        )
        if not same:
            problems.append(
                f"{kind} are {', '.join(map(str, found)) or 'none'}; "
                f"expected {', '.join(map(str, expected)) or 'none'}"
            )
    return problems


def verified_result(
    unit: BuildUnit,
    toolchain: Toolchain,
    out_dir: Path,
    digest: str,
    produced: Produced,
) -> CompiledNeff:
    """The record of the NEFF in `out_dir`, which `produced.neff` (its parse) checked."""
    neff, info = out_dir / NEFF_FILE, produced.neff
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
        origin=produced.origin,
        compile_seconds=round(produced.seconds, 3),
        peak_memory=produced.peak_memory,
        compile_args=tuple(unit.compile_args()),
        neff_version="{}.{}".format(*info.format_version),
    )
