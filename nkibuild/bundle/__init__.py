"""Bundle stage: manifest + compiled NEFFs -> a generated Python project directory.

The directory is a normal project (pyproject.toml + package) that users can
inspect or rebuild by hand; `bundle.json`, written last, lists every file with
its sha256 and is what the wheel stage reads.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nkibuild import __version__
from nkibuild.bundle import codegen
from nkibuild.compiler import CompiledNeff
from nkibuild.errors import BuildError
from nkibuild.fsutil import staging_dir
from nkibuild.manifest.model import Kernel, Manifest, Package, SourceRef

STAMP_FILE = "bundle.json"
RUNTIME_SOURCE = Path(__file__).with_name("runtime.py")


@dataclass(frozen=True)
class BundleProject:
    directory: Path
    package: Package
    files: tuple[tuple[str, str], ...]  # (path relative to directory, sha256), sorted
    build_info: dict

    @property
    def package_dir(self) -> Path:
        return self.directory / self.package.import_name


def generate_bundle(
    manifest: Manifest, compiled: Sequence[CompiledNeff], out_dir: Path
) -> BundleProject:
    info = build_info(manifest, compiled)
    package = manifest.package
    with staging_dir(out_dir) as stage:
        pkg = stage / package.import_name
        (pkg / "_kernels").mkdir(parents=True)
        (stage / "pyproject.toml").write_text(codegen.pyproject(package))
        (pkg / "__init__.py").write_text(codegen.package_init(package, manifest.kernels))
        (pkg / "_kernels" / "__init__.py").write_text('"""Generated kernel modules."""\n')
        shutil.copyfile(RUNTIME_SOURCE, pkg / "_runtime.py")
        (pkg / "_build.json").write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        for kernel in manifest.kernels:
            code = codegen.kernel_module(package.import_name, kernel)
            (pkg / "_kernels" / f"{kernel.name}.py").write_text(code)
        _copy_references(manifest, pkg)
        for neff in compiled:
            destination = pkg / _neff_path(neff)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(neff.neff_path, destination)
        files = _hash_tree(stage)
        stamp = {"package": vars(package), "files": dict(files), "nkibuild": __version__}
        (stage / STAMP_FILE).write_text(json.dumps(stamp, indent=2, sort_keys=True))
    return BundleProject(out_dir, package, files, info)


def load_bundle(directory: Path) -> BundleProject:
    stamp = json.loads((directory / STAMP_FILE).read_text())
    package = Package(**stamp["package"])
    info = json.loads((directory / package.import_name / "_build.json").read_text())
    return BundleProject(directory, package, tuple(sorted(stamp["files"].items())), info)


def build_info(manifest: Manifest, compiled: Sequence[CompiledNeff]) -> dict:
    """`_build.json`: everything the runtime needs, and provenance for humans."""
    neffs: dict[str, dict[str, dict[str, dict]]] = {}
    for neff in compiled:
        neffs.setdefault(neff.kernel, {}).setdefault(neff.target, {})[neff.variant] = {
            "path": _neff_path(neff),
            "sha256": neff.sha256,
            "lnc": neff.lnc,
            "placeholder": neff.placeholder,
            "compiler_version": neff.compiler_version,
            "cache_key": neff.cache_key,
            "input_names": [t.name for t in neff.inputs],
            "output_names": [t.name for t in neff.outputs],
        }
    versions = sorted({neff.compiler_version for neff in compiled})
    return {
        "package": manifest.package.name,
        "version": manifest.package.version,
        "nkibuild_version": __version__,
        "compiler_versions": versions,
        "placeholder": any(neff.placeholder for neff in compiled),
        "kernels": {
            kernel.name: _kernel_info(kernel, neffs.get(kernel.name, {}))
            for kernel in manifest.kernels
        },
    }


def _kernel_info(kernel: Kernel, neffs: dict) -> dict:
    return {
        "frontend": kernel.frontend,
        "inputs": [{"name": t.name, "dtype": t.dtype} for t in kernel.inputs],
        "constants": [[name, value] for name, value in kernel.constants],
        "variants": {v.name: {"inputs": [t.to_json() for t in v.inputs]} for v in kernel.variants},
        "reference": _reference_info(kernel.reference),
        "neffs": neffs,
    }


def reference_module(reference: SourceRef) -> str:
    """Module name a reference file gets inside the bundle (unique per source path)."""
    stem = Path(reference.path).with_suffix("").as_posix()
    return "".join(c if c.isalnum() else "_" for c in stem)


def _reference_info(reference: SourceRef | None) -> dict | None:
    if reference is None:
        return None
    return {"module": reference_module(reference), "function": reference.function}


def _copy_references(manifest: Manifest, pkg: Path) -> None:
    references = {k.reference.path: k.reference for k in manifest.kernels if k.reference}
    if not references:
        return
    modules: dict[str, str] = {}
    for path, reference in references.items():
        other = modules.setdefault(reference_module(reference), path)
        if other != path:
            raise BuildError(
                f"reference files {other!r} and {path!r} would both become module "
                f"{reference_module(reference)!r} in the bundle; rename one of them"
            )
    (pkg / "reference").mkdir()
    (pkg / "reference" / "__init__.py").write_text('"""Reference implementations (CPU)."""\n')
    for reference in references.values():
        target = pkg / "reference" / f"{reference_module(reference)}.py"
        shutil.copyfile(manifest.root / reference.path, target)


def _neff_path(neff: CompiledNeff) -> str:
    return f"neff/{neff.target}/{neff.kernel}/{neff.variant}.neff"


def _hash_tree(root: Path) -> tuple[tuple[str, str], ...]:
    return tuple(
        (path.relative_to(root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted(root.rglob("*"))
        if path.is_file()
    )
