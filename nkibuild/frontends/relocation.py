"""Make HLO modules relocatable: files they name by absolute path travel with the artifact.

An NKI kernel's module holds a custom-call (`AwsNeuronCustomNativeKernel`) whose
backend_config is base64 JSON naming the kernel's compiled BIR file by absolute
local path. Such a module compiles only on the machine, and in the directory,
where it was extracted. `relocate` copies every referenced file into the artifact
(content-addressed names) and rewrites the reference to an artifact-relative
marker; `materialize` turns markers back into absolute paths just before
compiling, wherever the artifact now lives.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

from nkibuild.confine import OutsideProject, read_confined
from nkibuild.errors import BuildError
from nkibuild.formats.backend_config import rewrite_paths
from nkibuild.frontends import SIDECAR_DIR
from nkibuild.text import printable

MARKER = "nkibuild-artifact:"


def relocate(data: bytes, artifact_dir: Path, allowed: Sequence[Path]) -> tuple[bytes, list[str]]:
    """Copy referenced files into `artifact_dir/sidecars/`; return the rewritten module.

    Only regular files under `allowed` are carried: the project for a prebuilt module
    (whose custom-calls are plain data anyone could have written, naming
    `/proc/self/environ` or `~/.aws/credentials`), plus the frontend worker's own
    scratch dir (its dump and temp dirs, where NKI leaves compiled kernels) for a
    traced one."""
    sidecars: set[str] = set()

    def to_marker(path: str) -> str:
        try:
            content = read_confined(path, allowed)
        except OutsideProject as refused:
            raise BuildError(
                f"the HLO module's NKI kernel custom-call refers to {printable(path)}, which "
                f"{refused.reason}: only files inside the project are carried along"
            ) from None
        name = printable(Path(path).name)
        relative = f"{SIDECAR_DIR}/{hashlib.sha256(content).hexdigest()[:16]}-{name}"
        target = artifact_dir / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        sidecars.add(relative)
        return MARKER + relative

    rewritten = rewrite_paths(data, os.path.isabs, to_marker)
    return rewritten, sorted(sidecars)


def materialize(data: bytes, artifact_dir: Path) -> bytes:
    """Markers back to absolute paths under `artifact_dir` (for the compiler)."""
    return rewrite_paths(
        data,
        lambda value: value.startswith(MARKER),
        # Resolved only for a marker found (a module with sidecars): once per compile.
        lambda value: str(artifact_dir.resolve() / value[len(MARKER) :]),
    )


def normalized_hash(data: bytes, artifact_dir: Path, sidecars: Sequence[str]) -> str:
    """Hash of the relocated module and its sidecars: equal for equal kernels anywhere."""
    digest = hashlib.sha256(data)
    for relative in sorted(sidecars):
        digest.update(b"\0" + relative.encode() + b"\0")
        digest.update((artifact_dir / relative).read_bytes())
    return digest.hexdigest()
