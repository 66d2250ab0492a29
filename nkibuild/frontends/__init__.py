"""Extract stage: ExtractSpec -> HloArtifact (a relocatable directory holding one HLO module).

The artifact directory is the stage's public output: `model.hlo_module.pb`
plus `artifact.json` (frontend, toolchain versions, signature, content hash),
written metadata-last so a present `artifact.json` means a complete artifact.

Both are written atomically (a killed build leaves none or all of each) but not
fsync'd: nothing trusts them without checking. The compile stage hashes the module it
hands to the compiler against the recorded content hash (`compilable_hlo`), and an
`artifact.json` that does not parse is refused the same way; either is then forgotten
(`forget_artifact`), so the next build extracts it again. What a power loss could
leave torn is thus redone, never compiled under the hash of what it was meant to be.
A cache hit needs no module at all: its key is the recorded hash.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.errors import BuildError, tail
from nkibuild.fsutil import atomic_output, atomic_write_text
from nkibuild.manifest.model import TensorSpec
from nkibuild.plan import ExtractSpec
from nkibuild.text import printable
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.context import BuildContext
    from nkibuild.formats.hlo import HloModuleInfo
    from nkibuild.frontends.failures import TraceFailures
    from nkibuild.toolchain.worker_pool import WorkerPool

HLO_FILE = "model.hlo_module.pb"
METADATA_FILE = "artifact.json"
ARTIFACT_FILES = (HLO_FILE, METADATA_FILE)
SIDECAR_DIR = "sidecars"  # files the module refers to (NKI's BIR), copied in
DEFAULT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class HloArtifact:
    directory: Path
    frontend: str
    content_hash: str
    module_name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    toolchain: tuple[tuple[str, str], ...]
    sidecars: tuple[str, ...] = ()  # files the module refers to, relative to `directory`

    @property
    def hlo_path(self) -> Path:
        return self.directory / HLO_FILE

    def portable_hlo(self) -> bytes:
        """The module as stored: references to sidecars are artifact-relative."""
        return self.hlo_path.read_bytes()

    def compilable_hlo(self, unit: str | None = None) -> bytes:
        """The module with sidecar references pointing at this artifact's absolute paths,
        once it (with its sidecars) is found to be what `content_hash` names.

        DamagedArtifact (and the artifact forgotten) if it is not: the files are not
        fsync'd, so after a power loss they may be torn under an intact artifact.json."""
        from nkibuild.frontends.relocation import materialize, normalized_hash

        try:
            data = self.portable_hlo()
            intact = normalized_hash(data, self.directory, self.sidecars) == self.content_hash
        except FileNotFoundError:
            intact = False
        if not intact:
            forget_artifact(self.directory)
            raise DamagedArtifact(
                self.directory, "its HLO module is not the one it recorded", unit=unit
            )
        return materialize(data, self.directory)


class DamagedArtifact(BuildError):
    """An extracted artifact that is not what its extraction wrote (e.g. torn by a power
    loss); it was forgotten, so the next build extracts it again."""

    def __init__(self, directory: Path, why: str, *, unit: str | None = None) -> None:
        super().__init__(
            f"the extracted artifact in {directory} is damaged ({why}); it was removed "
            "and the next build extracts it again",
            unit=unit,
        )


def forget_artifact(directory: Path) -> None:
    """Remove the metadata that marks an artifact complete: the extract task's outputs
    check then fails, and the next build extracts it again."""
    (directory / METADATA_FILE).unlink(missing_ok=True)


def run(context: BuildContext, spec: ExtractSpec) -> HloArtifact:
    """The extract stage of a build: one kernel variant (and target, where it matters)."""
    return extract(
        spec,
        context.manifest.root,
        context.layout.extract_dir(spec),
        context.toolchain,
        Tracing(context.session.workers, context.session.trace_failures),
    )


@dataclass(frozen=True)
class Tracing:
    """The build's means to run user code: its worker pool, and the failures it showed."""

    workers: WorkerPool
    failures: TraceFailures


def extract(
    spec: ExtractSpec, root: Path, out_dir: Path, toolchain: Toolchain, tracing: Tracing
) -> HloArtifact:
    """Produce the HLO artifact for one kernel variant in `out_dir`; user code runs in
    one of the build's workers that serves this project (`root`) only."""
    from nkibuild.formats.hlo import HloFormatError, canonical_module, read_hlo
    from nkibuild.frontends.relocation import normalized_hash, relocate

    out_dir.mkdir(parents=True, exist_ok=True)
    forget_artifact(out_dir)
    # Not durable (see the module docstring): a torn module is found before it is compiled.
    with atomic_output(out_dir / HLO_FILE, durable=False) as tmp_hlo:
        versions, allowed = _produce_hlo(spec, root, tmp_hlo, toolchain, tracing)
        traced = tmp_hlo.read_bytes()
        try:  # validates before anything else parses it
            module = read_hlo(traced)
        except HloFormatError as error:
            problem = f"the HLO module is not valid: {printable(str(error))}"
            raise BuildError(problem, unit=spec.name) from None
        # As every checkout and machine would trace it: no module id, and source paths
        # relative to the project (nkipy records absolute ones).
        canonical = canonical_module(traced, str(root.resolve()))
        # Files the module names by absolute path (NKI's BIR) are copied in, from
        # `allowed` dirs only; no stale sidecars stay.
        shutil.rmtree(out_dir / SIDECAR_DIR, ignore_errors=True)
        try:
            data, sidecars = relocate(canonical, out_dir, allowed)
        except BuildError as error:
            raise BuildError(error.message, unit=spec.name, log_tail=error.log_tail) from None
        tmp_hlo.write_bytes(data)
    _refuse_aliased_outputs(spec, module)
    inputs = _check_signature(spec, module)
    artifact = HloArtifact(
        directory=out_dir,
        frontend=spec.frontend,
        content_hash=normalized_hash(data, out_dir, sidecars),
        module_name=module.name,
        inputs=inputs,
        outputs=tuple(
            TensorSpec(f"output{index}", shape.dims, shape.dtype)
            for index, shape in enumerate(module.outputs())
        ),
        toolchain=tuple(sorted(versions.items())),
        sidecars=tuple(sidecars),
    )
    atomic_write_text(out_dir / METADATA_FILE, json.dumps(_to_json(artifact)), durable=False)
    return artifact


def load_artifact(directory: Path) -> HloArtifact:
    """The artifact `directory` holds; OSError, ValueError, KeyError or TypeError if it
    holds none or a damaged one (see `load_extracted`)."""
    data = json.loads((directory / METADATA_FILE).read_text())
    return HloArtifact(
        directory=directory,
        frontend=data["frontend"],
        content_hash=data["content_hash"],
        module_name=data["module_name"],
        inputs=tuple(map(TensorSpec.from_json, data["inputs"])),
        outputs=tuple(map(TensorSpec.from_json, data["outputs"])),
        toolchain=tuple(data["toolchain"].items()),
        sidecars=tuple(data.get("sidecars", ())),
    )


def load_extracted(directory: Path, unit: str) -> HloArtifact:
    """The artifact an extraction left in `directory`, for compiling `unit`; a missing
    or damaged one (an artifact.json a power loss tore, one forgotten as damaged by
    another unit's compile) is a DamagedArtifact, and forgotten."""
    try:
        return load_artifact(directory)
    except FileNotFoundError:
        why = "it has no artifact.json"
    except (ValueError, KeyError, TypeError, AttributeError):
        why = "its artifact.json is not readable"
    forget_artifact(directory)
    raise DamagedArtifact(directory, why, unit=unit)


def frontend_versions(frontend: str) -> dict[str, str]:
    """Installed versions of a frontend's packages, without importing them."""
    packages = {
        "jax": ("jax", "jaxlib"),
        "nki": ("nki", "torch-xla", "torch-neuronx", "nkipy"),
        "nkipy": ("nkipy",),
    }.get(frontend, ())  # hlo: no package
    from importlib import metadata

    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    return versions


def _produce_hlo(
    spec: ExtractSpec, root: Path, output: Path, toolchain: Toolchain, tracing: Tracing
) -> tuple[dict[str, str], tuple[Path, ...]]:
    """Write the module to `output`; return the frontend's versions and the dirs its
    custom-calls may name files in: the project for a prebuilt module, and also the
    worker's own scratch dir (dump and temp dirs) for a traced one."""
    if spec.frontend == "hlo":
        from nkibuild.confine import OutsideProject, read_confined

        # Read only if still a regular file inside the project: it may have been replaced
        # by a symlink since the manifest was checked.
        try:
            output.write_bytes(read_confined(root / spec.source.path, (root,)))
        except OutsideProject as refused:
            raise BuildError(f"{spec.source.path}: {refused.reason}", unit=spec.name) from None
        return {}, (root,)
    from nkibuild.toolchain.worker_pool import WorkerKey

    if spec.frontend == "nki" and toolchain.nki.route is None:
        from nkibuild.toolchain.nki import NO_ROUTE

        raise BuildError(NO_ROUTE, unit=spec.name)
    key = WorkerKey(str(root), toolchain.python, spec.frontend, spec.target, toolchain.worker_path)
    job = {
        "frontend": spec.frontend,
        "root": str(root),
        "path": spec.source.path,
        "function": spec.source.function,
        "inputs": [t.to_json() for t in spec.inputs],
        "constants": [[name, value] for name, value in spec.constants],
        "lnc": spec.lnc,
        "nki_route": toolchain.nki.route,
        "lnc_grid": toolchain.nki.launch_grid,
        "output": str(output),
        "own_modules": list(toolchain.worker_path),
    }
    result = tracing.workers.run(key, job, timeout=DEFAULT_TIMEOUT_S, unit=spec.name)
    if "os_error" in result:
        raise OSError(*result["os_error"])
    if not result["ok"]:
        raise _trace_failed(spec, root, result, tracing.failures)
    return result["versions"], (root, Path(result["scratch"]))


def _trace_failed(
    spec: ExtractSpec, root: Path, result: dict, failures: TraceFailures
) -> BuildError:
    """The user's frames of the failure, shown once per kernel and cause."""
    message = f"tracing {spec.source} failed: {printable(result['error'])}"
    where = result.get("where", "")
    if where:
        cause = f"{result['error'].partition(':')[0]} at {where}"
        first = failures.already_reported(str(root), spec.kernel, cause, spec.name)
        if first is not None:
            return BuildError(
                f"{message}\n(the same {cause} as {first}: its traceback is shown there)",
                unit=spec.name,
            )
    return BuildError(message, unit=spec.name, log_tail=tail(result["log"] + result["traceback"]))


def _refuse_aliased_outputs(spec: ExtractSpec, module: HloModuleInfo) -> None:
    """A kernel that writes into an input (nkipy: `acc[...] += x`) gets an extra output
    aliased to that input's buffer. A bundle could not hand it back to the caller's
    array, and returning it silently as one more output would break the kernel's
    signature, so such a kernel is refused with what to write instead."""
    if not module.aliases:
        return
    written = sorted(
        {spec.inputs[a.parameter].name for a in module.aliases if a.parameter < len(spec.inputs)}
    )
    raise BuildError(
        f"{spec.source} writes into its input(s) {', '.join(written)}: the traced module "
        "returns them as extra outputs aliased to those inputs, which a bundle cannot hand "
        "back to your arrays; return new arrays instead (e.g. `return acc + x`, not "
        "`acc[...] += x`)",
        unit=spec.name,
    )


def _check_signature(spec: ExtractSpec, module: HloModuleInfo) -> tuple[TensorSpec, ...]:
    """The HLO's parameters must be the manifest's inputs, in order, shape and dtype."""
    parameters = module.parameters
    problems = []
    if len(parameters) != len(spec.inputs):
        problems.append(
            f"the HLO module takes {len(parameters)} parameters but the manifest declares "
            f"{len(spec.inputs)} inputs ({', '.join(t.name for t in spec.inputs)})"
        )
    for declared, parameter in zip(spec.inputs, parameters, strict=False):
        found = (parameter.shape.dtype, tuple(parameter.shape.dims))
        if found != (declared.dtype, declared.shape):
            problems.append(
                f"input {declared.name!r} is declared {_format(declared.dtype, declared.shape)} "
                f"but HLO parameter {parameter.index} ({printable(parameter.name)}) is "
                f"{_format(*found)}"
            )
    if problems:
        raise BuildError("signature mismatch: " + "; ".join(problems), unit=spec.name)
    return spec.inputs


def _format(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


def _to_json(artifact: HloArtifact) -> dict[str, object]:
    return {
        "frontend": artifact.frontend,
        "content_hash": artifact.content_hash,
        "module_name": artifact.module_name,
        "inputs": [t.to_json() for t in artifact.inputs],
        "outputs": [t.to_json() for t in artifact.outputs],
        "toolchain": dict(artifact.toolchain),
        "sidecars": list(artifact.sidecars),
    }
