"""The bundle's provenance summary: the files and tools its build used, hashed as read.

`material_files` is also the bundle task's dependency list (besides the NEFFs), so
an edit to any of these files regenerates the bundle and its recorded digests can
never be older than the files.
"""

from __future__ import annotations

import os
from collections.abc import Sequence, Set
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.bundle.buildinfo import MaterialInfo, ProvenanceInfo, ToolInfo
from nkibuild.cache.key import file_sha256

if TYPE_CHECKING:
    from nkibuild.compiler import CompiledNeff
    from nkibuild.manifest.model import Manifest

COMPILER = "neuronx-cc"


def material_files(manifest: Manifest) -> list[Path]:
    """The project files a bundle is built from, besides the manifest: every kernel's
    source, the files its `deps` match, and its reference, each once, sorted."""
    from nkibuild.confine import glob_files

    root, kernels = manifest.root, manifest.kernels
    # Each distinct name once: kernels share files and patterns.
    named = {k.source.path for k in kernels} | {k.reference.path for k in kernels if k.reference}
    patterns = {pattern for kernel in kernels for pattern in kernel.deps}
    found = {root / name for name in named}
    found.update(Path(match) for pattern in patterns for match in glob_files(root, pattern))
    return sorted(found)


def summarize(
    manifest: Manifest, compiled: Sequence[CompiledNeff], frontends: Set[tuple[str, str]]
) -> ProvenanceInfo:
    """The provenance summary of the bundle of `compiled`; `frontends`: the frontend
    packages and versions its extractions recorded."""
    compilers = {(COMPILER, neff.compiler_version) for neff in compiled}
    root = manifest.root
    return ProvenanceInfo(
        # The bytes the build parsed (hashed as they were read), not the file as it is now.
        manifest=MaterialInfo(_relative(manifest.path, root), manifest.sha256),
        sources=tuple(
            MaterialInfo(_relative(path, root), file_sha256(path))
            for path in material_files(manifest)
        ),
        tools=tuple(ToolInfo(name, version) for name, version in sorted(frontends | compilers)),
    )


def _relative(path: Path, root: Path) -> str:
    return Path(os.path.relpath(path, root)).as_posix()
