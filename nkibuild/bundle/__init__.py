"""Bundle stage: manifest + compiled NEFFs -> a generated Python project directory.

The directory is a normal project (pyproject.toml + package) that users can
inspect or rebuild by hand; `bundle.json`, written last, lists every file with
its sha256 and is what the wheel stage reads.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild import __version__
from nkibuild.bundle import codegen
from nkibuild.bundle.buildinfo import (
    FILE_NAME,
    ArgumentInfo,
    BuildInfo,
    FunctionRef,
    KernelInfo,
    NeffInfo,
    ProvenanceInfo,
    TensorInfo,
    ToleranceInfo,
    VariantInfo,
    read_build_info,
)
from nkibuild.bundle.tree import CompiledCopy, Content, digest, update_tree
from nkibuild.compiler import CompiledNeff
from nkibuild.compiler.record import recorded_result
from nkibuild.errors import BuildError
from nkibuild.frontends import load_extracted
from nkibuild.manifest.model import Kernel, Manifest, Package, SourceRef

if TYPE_CHECKING:
    from nkibuild.context import BuildContext

STAMP_FILE = "bundle.json"
REFERENCE_PACKAGE = "reference"  # the manifest's reference implementations
SOURCES_PACKAGE = "_sources"  # kernels' own code, for simulate mode (nki) or as NumPy (nkipy)
SHIPPED_FRONTENDS = frozenset({"nki", "nkipy"})
RUNTIME_SOURCE = Path(__file__).with_name("runtime.py")


PARTS_DIR = "parts"  # per-target NEFF projects of a split bundle


@dataclass(frozen=True)
class BundleProject:
    directory: Path
    package: Package
    files: tuple[tuple[str, str], ...]  # (path relative to directory, sha256), sorted
    build_info: BuildInfo | None  # the package's _build.json; a target part has none
    parts: tuple[BundleProject, ...] = ()  # per-target NEFF projects (split-targets)
    target: str | None = None  # set on a part: the target whose NEFFs it carries
    # What the wheel's METADATA says, kept in bundle.json so that packing a bundle
    # needs no parse of its _build.json (megabytes for thousands of NEFFs)
    requirements: tuple[str, ...] = ()  # runtime requirements (pip specifiers)
    targets: tuple[str, ...] = ()  # the targets whose NEFFs the distribution carries


def target_package(package: Package, target: str) -> Package:
    """The distribution that carries one target's NEFFs of a split bundle."""
    return Package(
        name=f"{package.name}-{target}",
        version=package.version,
        import_name=f"{package.import_name}_{target}",
        description=f"{target} NEFFs of {package.name} (installed by its [{target}] extra)",
        license=package.license,
        requires_python=package.requires_python,
    )


def split_targets(manifest: Manifest) -> list[str]:
    """Targets that get a wheel of their own (none unless the manifest asks)."""
    if not manifest.package.split_targets:
        return []
    return sorted({t for k in manifest.kernels for t in (k.targets or manifest.default_targets)})


def distributions(manifest: Manifest) -> list[Package]:
    """Every distribution a build writes a wheel for: the bundle, then its target parts."""
    package = manifest.package
    return [package, *(target_package(package, t) for t in split_targets(manifest))]


def run(context: BuildContext) -> dict[str, str]:
    """The bundle stage of a build: the generated project of the manifest and every
    unit's compile record (and its extraction's, for the provenance summary)."""
    from nkibuild.bundle.provenance import summarize

    manifest, layout = context.manifest, context.layout
    compiled = [recorded_result(layout.compile_dir(u), u.name) for u in context.units]
    extractions = {layout.extract_dir(unit.extract): unit.name for unit in context.units}
    tools = {
        pair
        for directory, unit in extractions.items()
        for pair in load_extracted(directory, unit).toolchain
    }
    provenance = summarize(manifest, compiled, tools)
    return generate_bundle(manifest, compiled, layout.bundle_dir(manifest), provenance)


def generate_bundle(
    manifest: Manifest,
    compiled: Sequence[CompiledNeff],
    out_dir: Path,
    provenance: ProvenanceInfo | None = None,
) -> dict[str, str]:
    """Bring `out_dir` to the bundle of `compiled` (nkibuild.bundle.tree), `bundle.json`
    last, listing every file with its sha256; a padding declaration is checked against
    its kernel's NEFFs (BuildError). Returns the sha256 of each file written, by POSIX
    path relative to `out_dir` (`bundle.json` included)."""
    info = _build_info(manifest, compiled, provenance)
    files: dict[str, Content] = dict(_project_files(manifest, info))
    files.update(
        (_neff_file(manifest, neff), CompiledCopy(neff.neff_path, neff.sha256, neff.unit))
        for neff in compiled
    )
    for target in split_targets(manifest):
        files.update(_part_files(manifest.package, target))
    digests = {name: digest(content) for name, content in files.items()}
    stamp = json.dumps(_stamp(manifest, info, digests), indent=2, sort_keys=True).encode()
    update_tree(out_dir, files, digests, _listed(out_dir), (STAMP_FILE, stamp))
    return {**digests, STAMP_FILE: digest(stamp)}


def _listed(directory: Path) -> dict[str, str] | None:
    """Every file the bundle.json in `directory` lists, by its path there, with its
    sha256 (None: there is none, or it is not one)."""
    try:
        project = load_bundle(directory, build_info=False)
        listed = dict(project.files)
        for part in project.parts:
            prefix = part.directory.relative_to(directory).as_posix()
            listed.update((f"{prefix}/{name}", sha256) for name, sha256 in part.files)
    except (OSError, ValueError, LookupError, TypeError, AttributeError, RecursionError):
        return None  # RecursionError: JSON nested past the stack
    texts = all(isinstance(text, str) for item in listed.items() for text in item)
    return listed if texts else None


def _build_info(
    manifest: Manifest, compiled: Sequence[CompiledNeff], provenance: ProvenanceInfo | None
) -> BuildInfo:
    by_kernel: dict[str, dict[str, dict[str, NeffInfo]]] = {}
    for neff in compiled:
        neffs = by_kernel.setdefault(neff.kernel, {}).setdefault(neff.target, {})
        neffs[neff.variant] = _neff_info(manifest, neff)
    kernels = {k.name: _kernel_info(k, by_kernel.get(k.name, {})) for k in manifest.kernels}
    return BuildInfo(
        package=manifest.package.name,
        version=manifest.package.version,
        nkibuild_version=__version__,
        compiler_versions=tuple(sorted({neff.compiler_version for neff in compiled})),
        placeholder=any(neff.placeholder for neff in compiled),
        neuron_sdk=manifest.package.neuron_sdk,
        requirements=tuple(_runtime_requirements(manifest, compiled)),
        split_targets=tuple(split_targets(manifest)),
        kernels=kernels,
        provenance=provenance,
    )


def _project_files(manifest: Manifest, info: BuildInfo) -> dict[str, bytes]:
    """The generated project, NEFFs aside: pyproject.toml, the package and its modules."""
    package = manifest.package
    pkg = package.import_name
    extras = {t: [target_package(package, t).name] for t in split_targets(manifest)}
    files = {
        "pyproject.toml": codegen.pyproject(package, list(info.requirements), extras=extras),
        f"{pkg}/__init__.py": codegen.package_init(package, manifest.kernels),
        f"{pkg}/_kernels/__init__.py": '"""Generated kernel modules."""\n',
        f"{pkg}/{FILE_NAME}": info.to_text(),
    }
    for kernel in manifest.kernels:
        loader = codegen.kernel_module(pkg, kernel, info.kernels[kernel.name])
        files[f"{pkg}/_kernels/{kernel.name}.py"] = loader
    return {
        **{name: text.encode() for name, text in files.items()},
        f"{pkg}/_runtime.py": RUNTIME_SOURCE.read_bytes(),
        **_modules(manifest, f"{pkg}/{REFERENCE_PACKAGE}", _references(manifest), alone=True),
        **_modules(manifest, f"{pkg}/{SOURCES_PACKAGE}", _shipped_sources(manifest)),
    }


def _neff_file(manifest: Manifest, neff: CompiledNeff) -> str:
    """Where a NEFF goes in the tree: its package, in a target part if split out."""
    home = _neff_home(manifest, neff.target)
    root = _part_dir(home) + "/" if home != manifest.package.import_name else ""
    return f"{root}{home}/{_neff_path(neff)}"


def _stamp(manifest: Manifest, info: BuildInfo, digests: dict[str, str]) -> dict[str, Any]:
    """`bundle.json`: the package, every file of its project with its sha256, the parts,
    and what the wheel's METADATA needs from `_build.json`."""
    package = manifest.package
    parts_prefix = f"{PARTS_DIR}/"
    parts = []
    for target in split_targets(manifest):
        part = target_package(package, target)
        prefix = _part_dir(part.import_name) + "/"
        part_files = {n.removeprefix(prefix): d for n, d in digests.items() if n.startswith(prefix)}
        parts.append(
            {
                "directory": _part_dir(part.import_name),
                "package": vars(part),
                "part_of": package.name,
                "target": target,
                "files": part_files,
            }
        )
    files = (
        {n: d for n, d in digests.items() if not n.startswith(parts_prefix)} if parts else digests
    )
    return {
        "package": vars(package),
        "files": files,
        "parts": parts,
        "nkibuild": __version__,
        "requirements": list(info.requirements),
        "targets": info.targets(),
    }


def load_bundle(directory: Path, *, build_info: bool = True) -> BundleProject:
    """The generated project in `directory`, with its `_build.json` read and checked
    (`build_info=False`: not read; the wheel stage needs only bundle.json)."""
    stamp = json.loads((directory / STAMP_FILE).read_text())
    package = Package(**stamp["package"])
    info = read_build_info(directory / package.import_name / FILE_NAME) if build_info else None
    return BundleProject(
        directory,
        package,
        tuple(sorted(stamp["files"].items())),
        info,
        tuple(_load_part(directory, part) for part in stamp.get("parts", ())),
        requirements=tuple(stamp["requirements"]),
        targets=tuple(stamp["targets"]),
    )


def _load_part(directory: Path, part: dict) -> BundleProject:
    files, target = tuple(sorted(part["files"].items())), part["target"]
    package = Package(**part["package"])
    return BundleProject(
        directory / part["directory"], package, files, None, target=target, targets=(target,)
    )


def _neff_home(manifest: Manifest, target: str) -> str:
    package = manifest.package
    if target in split_targets(manifest):
        return target_package(package, target).import_name
    return package.import_name


def _part_dir(import_name: str) -> str:
    return f"{PARTS_DIR}/{import_name}"


def _part_files(package: Package, target: str) -> dict[str, Content]:
    """A per-target project: its package holds only `neff/`; its pyproject builds it alone."""
    part = target_package(package, target)
    root = _part_dir(part.import_name)
    return {
        f"{root}/{part.import_name}/__init__.py": f'"""{part.description}."""\n'.encode(),
        f"{root}/pyproject.toml": codegen.pyproject(part, [], entry_point=False).encode(),
    }


def _neff_info(manifest: Manifest, neff: CompiledNeff) -> NeffInfo:
    return NeffInfo(
        package=_neff_home(manifest, neff.target),
        path=_neff_path(neff),
        sha256=neff.sha256,
        lnc=neff.lnc,
        placeholder=neff.placeholder,
        compiler_version=neff.compiler_version,
        cache_key=neff.cache_key,
        input_names=tuple(t.name for t in neff.inputs),
        output_names=tuple(t.name for t in neff.outputs),
        outputs=tuple(TensorInfo(t.name, t.dtype, tuple(t.shape)) for t in neff.outputs),
        compile_args=tuple(neff.compile_args),
        neff_version=neff.neff_version or None,
    )


def _runtime_requirements(manifest: Manifest, compiled: Sequence[CompiledNeff]) -> list[str]:
    """What an installed bundle needs: NumPy, and ml_dtypes if a tensor is bfloat16.

    Never spike: the PyPI project of that name is an unrelated simulator, so the
    runtime finds the real one at run time and explains how to get it.
    """
    kernel_inputs = (spec for kernel in manifest.kernels for spec in kernel.inputs)
    neff_tensors = (spec for neff in compiled for spec in (*neff.inputs, *neff.outputs))
    dtypes = {spec.dtype for spec in chain(kernel_inputs, neff_tensors)}
    return ["numpy", *(["ml_dtypes"] if "bfloat16" in dtypes else [])]


def _kernel_info(kernel: Kernel, neffs: dict[str, dict[str, NeffInfo]]) -> KernelInfo:
    return KernelInfo(
        frontend=kernel.frontend,
        inputs=tuple(ArgumentInfo(t.name, t.dtype) for t in kernel.inputs),
        constants=tuple(kernel.constants),
        variants={
            v.name: VariantInfo(tuple(TensorInfo(t.name, t.dtype, t.shape) for t in v.inputs))
            for v in kernel.variants
        },
        reference=_module_info(REFERENCE_PACKAGE, kernel.reference),
        source=_module_info(SOURCES_PACKAGE, _shipped_source(kernel)),
        tolerance=ToleranceInfo(kernel.tolerance.rtol, kernel.tolerance.atol),
        neffs=neffs,
    )


def module_name(source: SourceRef) -> str:
    """Module name a shipped file gets inside the bundle (unique per source path)."""
    stem = Path(source.path).with_suffix("").as_posix()
    return "".join(c if c.isalnum() else "_" for c in stem)


def _module_info(package: str, source: SourceRef | None) -> FunctionRef | None:
    if source is None or source.function is None:
        return None
    return FunctionRef(package, module_name(source), source.function)


def _shipped_source(kernel: Kernel) -> SourceRef | None:
    return kernel.source if kernel.frontend in SHIPPED_FRONTENDS else None


def shipped_files(manifest: Manifest) -> list[str]:
    """Files of the project that the bundle carries (references, nki/nkipy sources)."""
    return [source.path for source in (*_references(manifest), *_shipped_sources(manifest))]


def _references(manifest: Manifest) -> list[SourceRef]:
    return [kernel.reference for kernel in manifest.kernels if kernel.reference]


def _shipped_sources(manifest: Manifest) -> list[SourceRef]:
    return [source for k in manifest.kernels if (source := _shipped_source(k))]


def _modules(
    manifest: Manifest, subpackage: str, sources: Sequence[SourceRef], *, alone: bool = False
) -> dict[str, Content]:
    """Each distinct file as an importable module of `subpackage` (a path in the tree);
    `alone`: each must import without the project's other files (`importable_alone`)."""
    paths = {source.path: source for source in sources}
    if not paths:
        return {}
    init = f'"""Shipped {subpackage.rpartition("/")[2]} modules."""\n'.encode()
    files: dict[str, Content] = {f"{subpackage}/__init__.py": init}
    modules: dict[str, str] = {}
    for path, source in paths.items():
        name = module_name(source)
        other = modules.setdefault(name, path)
        if other != path:
            raise BuildError(
                f"files {other!r} and {path!r} would both become module "
                f"{name!r} in the bundle; rename one of them"
            )
        code = _project_file(manifest.root, path)
        if alone:
            importable_alone(manifest.root, path, code)
        files[f"{subpackage}/{name}.py"] = code
    return files


def importable_alone(root: Path, path: str, code: bytes) -> None:
    """BuildError unless `code` (the project's file `path`) can import in a bundle, which
    ships it without the rest of the project: where verify and the frontends run it,
    its own directory and the project root are on sys.path, so `import helpers` finds
    a sibling that no installed bundle has. Found by reading the code, not running it."""
    try:
        tree = ast.parse(code, path)
    except (SyntaxError, ValueError) as error:
        raise BuildError(f"{path}: not Python ({error}); the bundle could not import it") from None
    for node in ast.walk(tree):
        found = _project_import(root, path, node)
        if found:
            raise BuildError(
                f"{path}:{getattr(node, 'lineno', 0)}: the reference imports {found}, which the "
                "bundle does not ship with it: it could not import there; import installed "
                "packages only"
            )


def _project_import(root: Path, path: str, node: ast.AST) -> str | None:
    """What `node` imports from the project, if it is an import that does."""
    if isinstance(node, ast.ImportFrom) and node.level:
        return f"a module by a relative import (from {'.' * node.level}{node.module or ''})"
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        names = [str(node.module)]
    else:
        return None
    for top in sorted({name.partition(".")[0] for name in names}):
        for place in ((root / path).parent, root):
            for candidate in (place / f"{top}.py", place / top):
                if candidate.exists():
                    return f"{candidate.relative_to(root)}, a file of the project"
    return None


def _project_file(root: Path, path: str) -> bytes:
    """A file the manifest names, if it is still a regular file inside the project (it
    may have become a symlink out of it since it was checked)."""
    from nkibuild.confine import OutsideProject, read_confined

    try:
        return read_confined(root / path, (root,))
    except OutsideProject as refused:
        raise BuildError(f"{path}: {refused.reason}; it is not shipped") from None


def _neff_path(neff: CompiledNeff) -> str:
    return f"neff/{neff.target}/{neff.kernel}/{neff.variant}.neff"
