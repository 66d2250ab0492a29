"""Bundle stage: manifest + compiled NEFFs -> a generated Python project directory.

The directory is a normal project (pyproject.toml + package) that users can
inspect or rebuild by hand; `bundle.json`, written last, lists every file with
its sha256 and is what the wheel stage reads.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import json
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
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
    document_json,
    encode,
    read_build_info,
)
from nkibuild.bundle.tree import (
    NEFF_FIELDS,
    CompiledCopy,
    Content,
    Record,
    digest,
    neff_fields,
    packed_neffs,
    update_tree,
)
from nkibuild.compiler import CompiledNeff
from nkibuild.errors import BuildError
from nkibuild.fsutil import SeenStats
from nkibuild.manifest.model import Kernel, Manifest, Package, SourceRef

if TYPE_CHECKING:
    from nkibuild.bundle.parts import KernelPart
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

    @property
    def package_dir(self) -> Path:
        return self.directory / self.package.import_name


@dataclass(frozen=True)
class WrittenBundle:
    """A bundle tree brought up to date, and every file's fingerprint as recorded there."""

    directory: Path
    record: Record


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


def run(
    context: BuildContext, seen: SeenStats | None = None, definition: str = ""
) -> WrittenBundle:
    """The bundle stage of a build: every unit's finished compile -> the generated project.
    A kernel whose inputs are as at the last bundle lends its part from that bundle's
    memo (nkibuild.bundle.parts). `seen`: the stamps of the compile records and of the
    tree's files as the build saw them, where they are still those (else stat'ed);
    `definition`: the bundle task's fingerprint, if known (graph/uptodate.py)."""
    from nkibuild.bundle.parts import PartsMemo
    from nkibuild.bundle.provenance import summarize

    manifest = context.manifest
    memo = PartsMemo(context, seen, definition)
    parts = memo.kernel_parts(functools.partial(kernel_part, manifest))
    provenance = summarize(context, parts, memo.file_sha256)
    out_dir = context.layout.bundle_dir(manifest)
    written = write_bundle(manifest, parts, out_dir, provenance, seen)
    memo.save()
    return written


def generate_bundle(
    manifest: Manifest,
    compiled: Sequence[CompiledNeff],
    out_dir: Path,
    provenance: ProvenanceInfo | None = None,
) -> WrittenBundle:
    """The bundle of `compiled` in `out_dir`, every kernel's part computed anew."""
    by_kernel: dict[str, list[CompiledNeff]] = {}
    for neff in compiled:
        by_kernel.setdefault(neff.kernel, []).append(neff)
    parts = [
        kernel_part(manifest, kernel, by_kernel.get(kernel.name, []), frozenset())
        for kernel in manifest.kernels
    ]
    return write_bundle(manifest, parts, out_dir, provenance)


def write_bundle(
    manifest: Manifest,
    parts: Sequence[KernelPart],
    out_dir: Path,
    provenance: ProvenanceInfo | None,
    seen: SeenStats | None = None,
) -> WrittenBundle:
    """Bring `out_dir` up to date with the manifest and the kernels' parts, writing only
    the files whose content changed (nkibuild.bundle.tree); `bundle.json` is written last."""
    info = _header(manifest, parts, provenance)
    files, digests = _project_files(manifest, info, parts)
    # A NEFF's sha256 is its compile record's, as its part keeps it: not hashed here.
    # (Passes in C over the parts' columns: 10,000 NEFFs at 10,000 units.)
    neffs = _Neffs(neff_fields(map(attrgetter("neffs"), parts)))
    digests.update(zip(neffs.fields[0::NEFF_FIELDS], neffs.fields[2::NEFF_FIELDS], strict=True))
    for target in split_targets(manifest):
        _add_hashed(files, digests, _part_files(manifest.package, target))
    targets = sorted(every_value(parts, "targets"))
    stamp = _stamp_json(_stamp(manifest, info, digests, targets))
    wanted = collections.ChainMap(files, neffs)
    record = update_tree(out_dir, wanted, STAMP_FILE, stamp, digests=digests, seen=seen)
    return WrittenBundle(out_dir, record)


class _Neffs(Mapping[str, CompiledCopy]):
    """The tree's NEFFs by name, kept as the fields of their parts' rows; each looked up
    as the NEFF to copy. The tree reads the content of the files it writes only: no
    `CompiledCopy` is made for each of the 10,000 NEFFs a bundle keeps."""

    def __init__(self, fields: list[str]) -> None:
        self.fields = fields  # the rows' fields, row after row (tree.neff_fields)
        rows = range(0, len(fields), NEFF_FIELDS)
        self.rows = dict(zip(fields[0::NEFF_FIELDS], rows, strict=True))  # name -> first field

    def __getitem__(self, name: str) -> CompiledCopy:
        at = self.rows[name]
        _, source, sha256, unit = self.fields[at : at + NEFF_FIELDS]
        return CompiledCopy(source, sha256, unit)

    def __iter__(self) -> Iterator[str]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _project_files(
    manifest: Manifest, info: BuildInfo, parts: Sequence[KernelPart]
) -> tuple[collections.ChainMap[str, Content], dict[str, str]]:
    """The generated project, NEFFs aside (pyproject.toml, the package and its modules),
    and each file's sha256."""
    package = manifest.package
    pkg = package.import_name
    extras = {t: [target_package(package, t).name] for t in split_targets(manifest)}
    names = list(map(attrgetter("name"), parts))
    kernels = dict(zip(names, map(attrgetter("info_json"), parts), strict=True))
    modules = LoaderModules(manifest, parts, f"{pkg}/_kernels/{{}}.py")
    generated = {
        "pyproject.toml": codegen.pyproject(package, list(info.requirements), extras=extras),
        f"{pkg}/__init__.py": codegen.package_init(package, manifest.kernels),
        f"{pkg}/_kernels/__init__.py": '"""Generated kernel modules."""\n',
        f"{pkg}/_runtime.py": RUNTIME_SOURCE.read_bytes(),
        f"{pkg}/{FILE_NAME}": document_json(info.header_json(), kernels),
    }
    files: collections.ChainMap[str, Content] = collections.ChainMap({}, modules)
    digests: dict[str, str] = {}
    _add_hashed(files, digests, {name: _encoded(text) for name, text in generated.items()})
    digests.update(zip(modules.names, map(attrgetter("module_sha256"), parts), strict=True))
    shipped = {
        **_modules(manifest, f"{pkg}/{REFERENCE_PACKAGE}", _references(manifest)),
        **_modules(manifest, f"{pkg}/{SOURCES_PACKAGE}", _shipped_sources(manifest)),
    }
    _add_hashed(files, digests, shipped)
    return files, digests


class LoaderModules(Mapping[str, Content]):
    """The kernels' loader modules by their names in the tree (`pattern` of a kernel's
    name), parts in manifest order. A part the memo lent keeps its module's sha256 only:
    its module is made again when the tree lacks the file (removed or changed there)."""

    def __init__(self, manifest: Manifest, parts: Sequence[KernelPart], pattern: str) -> None:
        self.manifest = manifest
        self.parts = parts
        self.names = list(map(pattern.format, map(attrgetter("name"), parts)))

    @functools.cached_property
    def _at(self) -> dict[str, int]:  # made only if a module is looked up
        return dict(zip(self.names, range(len(self.names)), strict=True))

    def __getitem__(self, name: str) -> bytes:
        index = self._at[name]
        part = self.parts[index]
        if part.module is not None:
            return part.module
        kernel = self.manifest.kernels[index]
        # Its padding was checked against its NEFFs when the part was made.
        module = codegen.kernel_module(self.manifest.package.import_name, kernel).encode()
        if kernel.name != part.name or digest(module) != part.module_sha256:
            raise BuildError(
                f"kernel {part.name!r}: its loader made again is not the one the bundle's "
                "parts memo recorded; run `nkibuild clean` and build again"
            )
        return module

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _add_hashed(
    files: MutableMapping[str, Content], digests: dict[str, str], added: Mapping[str, Content]
) -> None:
    """Add files to the tree's `files`, with their sha256 to its `digests`."""
    files.update(added)
    digests.update((name, digest(content)) for name, content in added.items())


def _encoded(content: str | Content) -> Content:
    return content.encode() if isinstance(content, str) else content


def _neff_file(manifest: Manifest, neff: CompiledNeff) -> str:
    """Where a NEFF goes in the tree: its package, in a target part if split out."""
    home = _neff_home(manifest, neff.target)
    root = _part_dir(home) + "/" if home != manifest.package.import_name else ""
    return f"{root}{home}/{_neff_path(neff)}"


def _stamp(
    manifest: Manifest, info: BuildInfo, digests: dict[str, str], targets: list[str]
) -> dict[str, Any]:
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
        "targets": targets,
    }


def _stamp_json(stamp: dict[str, Any]) -> bytes:
    """`json.dumps(stamp, indent=2, sort_keys=True)`, encoded, its file lists (15,000
    entries at 10,000 units) written by json's C encoder: `indent` makes json encode in
    Python. Joined once as bytes: each copy of a text of megabytes costs a page fault for
    each of its pages, fresh memory in a build's process."""
    lists = [stamp["files"], *(part["files"] for part in stamp["parts"])]
    marked = {**stamp, "files": "\0files 0"}
    marked["parts"] = [
        {**part, "files": f"\0files {i}"} for i, part in enumerate(stamp["parts"], 1)
    ]
    text = json.dumps(marked, indent=2, sort_keys=True)
    markers = [f'"\\u0000files {number}"' for number in range(len(lists))]
    if any(text.count(marker) != 1 for marker in markers):  # a manifest's value spells one
        return json.dumps(stamp, indent=2, sort_keys=True).encode()
    pieces: list[bytes | memoryview] = []
    end = 0
    for at, number in sorted((text.index(marker), number) for number, marker in enumerate(markers)):
        depth = 2 if number == 0 else 6  # the top level's member, or a part's in a list
        pieces += [text[end:at].encode(), *_flat_object(lists[number], " " * depth)]
        end = at + len(markers[number])
    pieces.append(text[end:].encode())
    return b"".join(pieces)


def _flat_object(members: Mapping[str, str], indent: str) -> list[bytes | memoryview]:
    """A JSON object of string members as `json.dumps(indent=2, sort_keys=True)` writes
    it at `indent`, encoded, as pieces to join: the same separators, given to the C
    encoder."""
    inner = indent + "  "
    separators = (",\n" + inner, ": ")  # strings only: no cycle to look for
    text = json.dumps(members, sort_keys=True, separators=separators, check_circular=False)
    if not members:
        return [text.encode()]
    return [f"{{\n{inner}".encode(), memoryview(text.encode())[1:-1], f"\n{indent}}}".encode()]


def load_bundle(directory: Path, *, build_info: bool = True) -> BundleProject:
    """The generated project in `directory`, with its `_build.json` read and checked
    (`build_info=False`: not read; the wheel stage needs only bundle.json)."""
    stamp = json.loads((directory / STAMP_FILE).read_text())
    info_file = directory / stamp["package"]["import_name"] / FILE_NAME
    return _project(directory, stamp, read_build_info(info_file) if build_info else None)


def _project(directory: Path, stamp: dict[str, Any], info: BuildInfo | None) -> BundleProject:
    package = Package(**stamp["package"])
    parts = tuple(_load_part(directory, part) for part in stamp.get("parts", ()))
    files = tuple(sorted(stamp["files"].items()))
    requirements, targets = tuple(stamp["requirements"]), tuple(stamp["targets"])
    return BundleProject(
        directory, package, files, info, parts, requirements=requirements, targets=targets
    )


def _load_part(directory: Path, part: dict) -> BundleProject:
    package = Package(**part["package"])
    files = tuple(sorted(part["files"].items()))
    target = part["target"]
    root = directory / part["directory"]
    return BundleProject(root, package, files, None, target=target, targets=(target,))


def _neff_home(manifest: Manifest, target: str) -> str:
    """The import package a target's NEFFs live in."""
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


def _header(
    manifest: Manifest, parts: Sequence[KernelPart], provenance: ProvenanceInfo | None
) -> BuildInfo:
    """`_build.json` but its kernels (each part has its own entry, encoded)."""
    return BuildInfo(
        package=manifest.package.name,
        version=manifest.package.version,
        nkibuild_version=__version__,
        compiler_versions=tuple(sorted(every_value(parts, "compiler_versions"))),
        placeholder=any(map(attrgetter("placeholder"), parts)),
        neuron_sdk=manifest.package.neuron_sdk,
        requirements=tuple(runtime_requirements(manifest, parts)),
        split_targets=tuple(split_targets(manifest)),
        kernels={},
        provenance=provenance,
    )


def kernel_part(
    manifest: Manifest,
    kernel: Kernel,
    compiled: Sequence[CompiledNeff],
    tools: frozenset[tuple[str, str]],
) -> KernelPart:
    """What the bundle takes from `kernel` and its units' NEFFs; `tools`: the frontend
    packages its extractions recorded (for the provenance summary)."""
    from nkibuild.bundle.parts import KernelPart  # not on a no-op build's path

    neffs: dict[str, dict[str, NeffInfo]] = {}
    for neff in compiled:
        neffs.setdefault(neff.target, {})[neff.variant] = _neff_info(manifest, neff)
    info = _kernel_info(kernel, neffs)
    module = codegen.kernel_module(manifest.package.import_name, kernel, info).encode()
    return KernelPart(
        name=kernel.name,
        info_json=encode(info.to_json()).encode(),
        module=module,
        module_sha256=hashlib.sha256(module).hexdigest(),
        neffs=packed_neffs(
            (_neff_file(manifest, neff), str(neff.neff_path), neff.sha256, neff.unit)
            for neff in compiled
        ),
        targets=tuple(sorted(neffs)),
        dtypes=tuple(sorted({t.dtype for neff in compiled for t in (*neff.inputs, *neff.outputs)})),
        compiler_versions=tuple(sorted({neff.compiler_version for neff in compiled})),
        tools=tuple(sorted(tools)),
        placeholder=any(neff.placeholder for neff in compiled),
    )


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
    )


def runtime_requirements(manifest: Manifest, parts: Sequence[KernelPart]) -> list[str]:
    """What an installed bundle needs: NumPy, and ml_dtypes if a tensor is bfloat16.

    Never spike: the PyPI project of that name is an unrelated simulator, so the
    runtime finds the real one at run time and explains how to get it.
    """
    inputs = chain.from_iterable(map(attrgetter("inputs"), manifest.kernels))
    dtypes = set(map(attrgetter("dtype"), inputs)) | every_value(parts, "dtypes")
    return ["numpy", *(["ml_dtypes"] if "bfloat16" in dtypes else [])]


def every_value(parts: Sequence[KernelPart], field: str) -> set[Any]:
    """Every value of one tuple field of the parts, each once: a pass in C over the
    parts (5,000 at 10,000 units), most of which share one of a few tuples."""
    return set(chain.from_iterable(set(map(attrgetter(field), parts))))


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


@functools.cache
def generator_digest() -> str:
    """Hash of the code that writes bundles: a bundle is stale when it changes, even
    within one nkibuild version (a development checkout, a patched install). Besides
    this package: the model whose values the generated code spells (padding, tensor
    specs), the padding checks run on the compiled outputs, and the resolver and the
    layout that name the units and extractions whose records the bundle reads and where
    (its parts memo relies on the bundle task's definition, which holds this digest, to
    name the same records)."""
    digest = hashlib.sha256()
    package = Path(__file__).parent.parent
    manifest = package / "manifest"
    sources = [
        *Path(__file__).parent.glob("*.py"),
        manifest / "model.py",
        manifest / "buckets.py",
        package / "plan.py",
        package / "context.py",
    ]
    for source in sorted(sources):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def shipped_files(manifest: Manifest) -> list[str]:
    """Files of the project that the bundle carries (references, nki/nkipy sources)."""
    return [source.path for source in (*_references(manifest), *_shipped_sources(manifest))]


def _references(manifest: Manifest) -> list[SourceRef]:
    return list(filter(None, map(attrgetter("reference"), manifest.kernels)))


def _shipped_sources(manifest: Manifest) -> list[SourceRef]:
    return [source for k in manifest.kernels if (source := _shipped_source(k))]


def _modules(
    manifest: Manifest, subpackage: str, sources: Sequence[SourceRef]
) -> dict[str, Content]:
    """Each distinct file as an importable module of `subpackage` (a path in the tree)."""
    paths = {source.path: source for source in sources}
    if not paths:
        return {}
    modules: dict[str, str] = {}
    for path, source in paths.items():
        other = modules.setdefault(module_name(source), path)
        if other != path:
            raise BuildError(
                f"files {other!r} and {path!r} would both become module "
                f"{module_name(source)!r} in the bundle; rename one of them"
            )
    name = subpackage.rpartition("/")[2]
    init = f'"""Shipped {name} modules."""\n'.encode()
    files: dict[str, Content] = {f"{subpackage}/__init__.py": init}
    for source in paths.values():
        files[f"{subpackage}/{module_name(source)}.py"] = _project_file(manifest.root, source.path)
    return files


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
