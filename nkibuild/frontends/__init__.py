"""Extract stage: ExtractSpec -> HloArtifact (a relocatable directory holding one HLO module).

The artifact directory is the stage's public output: `model.hlo_module.pb`
plus `artifact.json` (frontend, toolchain versions, signature, content hash),
written metadata-last so a present `artifact.json` means a complete artifact.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.errors import BuildError, tail
from nkibuild.fsutil import atomic_output, atomic_write_text
from nkibuild.manifest.model import TensorSpec
from nkibuild.plan import ExtractSpec
from nkibuild.toolchain import Toolchain

if TYPE_CHECKING:
    from nkibuild.formats.hlo import HloModuleInfo

HLO_FILE = "model.hlo_module.pb"
METADATA_FILE = "artifact.json"
ARTIFACT_FILES = (HLO_FILE, METADATA_FILE)
WORKER_FRONTENDS = frozenset({"jax"})
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

    @property
    def hlo_path(self) -> Path:
        return self.directory / HLO_FILE


def extract(spec: ExtractSpec, root: Path, out_dir: Path, toolchain: Toolchain) -> HloArtifact:
    """Produce the HLO artifact for one kernel variant (and target, where it matters)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / METADATA_FILE).unlink(missing_ok=True)
    with atomic_output(out_dir / HLO_FILE) as tmp_hlo:
        versions = _produce_hlo(spec, root, tmp_hlo, toolchain)
        from nkibuild.formats.hlo import HloFormatError, read_hlo

        data = tmp_hlo.read_bytes()
        try:
            module = read_hlo(data)
        except HloFormatError as error:
            raise BuildError(f"the HLO module is not valid: {error}", unit=spec.name) from None
    inputs = _check_signature(spec, module)
    artifact = HloArtifact(
        directory=out_dir,
        frontend=spec.frontend,
        content_hash=hashlib.sha256(data).hexdigest(),
        module_name=module.name,
        inputs=inputs,
        outputs=tuple(
            TensorSpec(f"output{index}", shape.dims, shape.dtype)
            for index, shape in enumerate(module.outputs())
        ),
        toolchain=tuple(sorted(versions.items())),
    )
    atomic_write_text(out_dir / METADATA_FILE, json.dumps(_to_json(artifact), indent=2))
    return artifact


def load_artifact(directory: Path) -> HloArtifact:
    data = json.loads((directory / METADATA_FILE).read_text())
    return HloArtifact(
        directory=directory,
        frontend=data["frontend"],
        content_hash=data["content_hash"],
        module_name=data["module_name"],
        inputs=_specs(data["inputs"]),
        outputs=_specs(data["outputs"]),
        toolchain=tuple((name, version) for name, version in data["toolchain"].items()),
    )


def frontend_versions(frontend: str) -> dict[str, str]:
    """Installed versions of a frontend's packages, without importing them."""
    from importlib import metadata

    packages = {"jax": ("jax", "jaxlib"), "hlo": ()}.get(frontend, ())
    versions = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "missing"
    return versions


def _produce_hlo(
    spec: ExtractSpec, root: Path, output: Path, toolchain: Toolchain
) -> dict[str, str]:
    source = root / spec.source.path
    if spec.frontend == "hlo":
        shutil.copyfile(source, output)
        return {}
    if spec.frontend not in WORKER_FRONTENDS:
        raise BuildError(f"the {spec.frontend!r} frontend is not available yet", unit=spec.name)
    from nkibuild.toolchain.worker_pool import POOL, WorkerKey

    key = WorkerKey(toolchain.python, spec.frontend, spec.target, toolchain.is_fake)
    job = {
        "frontend": spec.frontend,
        "root": str(root),
        "path": spec.source.path,
        "function": spec.source.function,
        "inputs": [t.to_json() for t in spec.inputs],
        "constants": [[name, value] for name, value in spec.constants],
        "output": str(output),
    }
    result = POOL.run(key, job, timeout=DEFAULT_TIMEOUT_S, unit=spec.name)
    if not result["ok"]:
        raise BuildError(
            f"tracing {spec.source} failed: {result['error']}",
            unit=spec.name,
            log_tail=tail(result["log"] + result["traceback"]),
        )
    return result["versions"]


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
                f"but HLO parameter {parameter.index} ({parameter.name}) is "
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
    }


def _specs(items: list[dict]) -> tuple[TensorSpec, ...]:
    return tuple(TensorSpec.from_json(item) for item in items)
