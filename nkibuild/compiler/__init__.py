"""Compile stage: HloArtifact + BuildUnit -> CompiledNeff.

Order of lookup: this build dir (a rerun after a killed build), the shared
cache, then neuronx-cc. A NEFF is verified by the NEFF reader before it is
renamed into place; `result.json` is written last and marks completion.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.cache import CacheKey, NeffCache, file_sha256
from nkibuild.errors import BuildError, tail
from nkibuild.frontends import HloArtifact
from nkibuild.fsutil import atomic_copy, atomic_write_text
from nkibuild.manifest.model import TensorSpec
from nkibuild.plan import BuildUnit
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.formats.neff import NeffTensor

NEFF_FILE = "model.neff"
LOG_FILE = "compile.log"
HLO_INPUT = "model.hlo_module.pb"
RESULT_FILE = "result.json"
COMPILE_OUTPUTS = (NEFF_FILE, RESULT_FILE)


@dataclass(frozen=True)
class CompiledNeff:
    """A verified NEFF for one build unit and what the bundle needs to load it."""

    unit: str
    kernel: str
    variant: str
    target: str
    lnc: int
    neff_path: Path
    sha256: str
    cache_key: str
    compiler_version: str
    placeholder: bool
    inputs: tuple[TensorSpec, ...]  # the NEFF's own names, in parameter order
    outputs: tuple[TensorSpec, ...]
    origin: str  # "compiled", "cache" or "build-dir"
    compile_seconds: float

    def to_json(self) -> dict[str, object]:
        data = dict(vars(self))
        data["neff_path"] = NEFF_FILE
        data["inputs"] = [t.to_json() for t in self.inputs]
        data["outputs"] = [t.to_json() for t in self.outputs]
        return data


def cache_key(unit: BuildUnit, artifact: HloArtifact, toolchain: Toolchain) -> CacheKey:
    return CacheKey.of(
        hlo=artifact.content_hash,
        compile_args=unit.compile_args(),
        compiler_version=toolchain.compiler_version,
        target=unit.target,
        lnc=unit.lnc,
        neuron_cc_flags=toolchain.neuron_cc_flags,
    )


def compile_unit(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    cache: NeffCache | None,
    timeout: float | None = None,
) -> CompiledNeff:
    key = cache_key(unit, artifact, toolchain)
    previous = _reusable_result(out_dir, key.digest)
    if previous is not None:
        return replace(previous, origin="build-dir")
    (out_dir / RESULT_FILE).unlink(missing_ok=True)
    started = time.monotonic()
    hit = cache.get(key) if cache else None
    if hit is not None:
        atomic_copy(hit[0], out_dir / NEFF_FILE)
        origin, seconds = "cache", float(hit[1].get("compile_seconds", 0.0))
    else:
        _run_compiler(unit, artifact, toolchain, out_dir, timeout)
        origin, seconds = "compiled", time.monotonic() - started
    result = _verified_result(unit, artifact, toolchain, out_dir, key.digest, origin, seconds)
    if origin == "compiled" and cache is not None:
        cache.put(key, out_dir / NEFF_FILE, {"compile_seconds": seconds, "unit": unit.name})
    atomic_write_text(out_dir / RESULT_FILE, json.dumps(result.to_json(), indent=2))
    return result


def load_result(out_dir: Path) -> CompiledNeff:
    data = json.loads((out_dir / RESULT_FILE).read_text())
    data["neff_path"] = out_dir / NEFF_FILE
    data["inputs"] = tuple(TensorSpec.from_json(t) for t in data["inputs"])
    data["outputs"] = tuple(TensorSpec.from_json(t) for t in data["outputs"])
    return CompiledNeff(**data)


def compiler_command(
    unit: BuildUnit, toolchain: Toolchain, hlo: Path, output: Path, log: Path
) -> list[str]:
    """The exact neuronx-cc invocation; the user's compiler-args come last."""
    return [
        *toolchain.compiler_command,
        "compile", "--framework", "XLA", str(hlo),
        "--output", str(output),
        "--logfile", str(log),
        *unit.compile_args(),
    ]  # fmt: skip


def _reusable_result(out_dir: Path, digest: str) -> CompiledNeff | None:
    """A finished NEFF from an earlier run whose doit state was lost (e.g. killed)."""
    try:
        result = load_result(out_dir)
        if result.cache_key == digest and file_sha256(result.neff_path) == result.sha256:
            return result
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _run_compiler(
    unit: BuildUnit,
    artifact: HloArtifact,
    toolchain: Toolchain,
    out_dir: Path,
    timeout: float | None,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    # neuronx-cc has no work-dir flag: the cwd is its work dir, so each compile gets its own.
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=out_dir))
    try:
        output, log, hlo = work / NEFF_FILE, work / LOG_FILE, work / HLO_INPUT
        # The artifact may have been built elsewhere: point its references here first.
        hlo.write_bytes(artifact.compilable_hlo())
        command = compiler_command(unit, toolchain, hlo, output, log)
        returncode = _execute(command, work, timeout, unit.name)
        if log.exists():
            atomic_copy(log, out_dir / LOG_FILE)
        if returncode != 0:
            raise _failure(unit, command, out_dir, "neuronx-cc failed", returncode)
        if not output.exists() or output.stat().st_size == 0:
            raise _failure(unit, command, out_dir, "neuronx-cc exited 0 but wrote no NEFF")
        _check_neff(unit, artifact, output, command, out_dir)
        os.replace(output, out_dir / NEFF_FILE)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _execute(command: list[str], work: Path, timeout: float | None, unit: str) -> int:
    with open(work / "stdout.log", "wb") as stdout:
        try:
            proc = subprocess.run(
                command, cwd=work, stdout=stdout, stderr=subprocess.STDOUT, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise BuildError(
                f"neuronx-cc did not finish within {timeout:g} s", unit=unit, command=command
            ) from None
        except OSError as error:
            raise BuildError(
                f"could not start neuronx-cc: {error}", unit=unit, command=command
            ) from None
    _append(work / "stdout.log", work / LOG_FILE)
    return proc.returncode


def _append(source: Path, log: Path) -> None:
    """Keep what the compiler printed together with its log file."""
    text = source.read_bytes()
    if text:
        with open(log, "ab") as handle:
            handle.write(b"\n--- neuronx-cc stdout/stderr ---\n" + text)


def _failure(
    unit: BuildUnit,
    command: list[str],
    out_dir: Path,
    message: str,
    returncode: int | None = None,
) -> BuildError:
    log = out_dir / LOG_FILE
    text = log.read_text(errors="replace") if log.exists() else ""
    return BuildError(
        message,
        unit=unit.name,
        command=command,
        returncode=returncode,
        log_tail=tail(text) or "(the compiler wrote no log)",
        log_path=str(log) if log.exists() else None,
    )


def _check_neff(
    unit: BuildUnit, artifact: HloArtifact, neff: Path, command: list[str], out_dir: Path
) -> None:
    from nkibuild.formats.neff import NeffFormatError, read_neff

    try:
        info = read_neff(neff)
    except NeffFormatError as error:
        raise _failure(
            unit, command, out_dir, f"neuronx-cc wrote an invalid NEFF: {error}"
        ) from None
    problems = _signature_problems(artifact, _as_specs(info.inputs), _as_specs(info.outputs))
    if len(info.subgraphs) != unit.lnc:
        problems.append(f"it has {len(info.subgraphs)} subgraphs but the unit uses lnc={unit.lnc}")
    if problems:
        raise _failure(unit, command, out_dir, "the NEFF does not match: " + "; ".join(problems))


def _as_specs(tensors: tuple[NeffTensor, ...]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec(t.name, tuple(t.shape), t.dtype) for t in tensors)


def _signature_problems(
    artifact: HloArtifact, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...]
) -> list[str]:
    """Compare by position, dtype and shape: NEFF names may differ from the manifest's."""
    problems = []
    pairs = (("inputs", artifact.inputs, inputs), ("outputs", artifact.outputs, outputs))
    for kind, expected, found in pairs:
        if [(t.dtype, t.shape) for t in found] != [(t.dtype, t.shape) for t in expected]:
            problems.append(
                f"{kind} are {', '.join(map(str, found)) or 'none'}; "
                f"expected {', '.join(map(str, expected)) or 'none'}"
            )
    return problems


def _verified_result(
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
        inputs=_as_specs(info.inputs),
        outputs=_as_specs(info.outputs),
        origin=origin,
        compile_seconds=round(seconds, 3),
    )
