"""The nkibuild.yaml manifest: loading, validation and the typed model.

The model (model.py) is the one description of the manifest; the JSON Schema,
docs/manifest.md and the YAML converter are generated from it
(`python -m nkibuild.manifest.generate`).

Importing this package is cheap on purpose (the CLI's --help and the cached
no-op build import it): PyYAML, jsonschema and the validator are imported by
`load_manifest` only.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nkibuild.errors import ManifestError
from nkibuild.manifest.model import (
    AUTO_CAST,
    AUTO_CAST_TYPES,
    DEFAULT_SETTINGS,
    DEFAULT_TARGETS,
    DEFAULT_VARIANT,
    FRONTENDS,
    TARGETS,
    CacheSettings,
    CompileSettings,
    Constant,
    Kernel,
    Manifest,
    Package,
    SourceRef,
    TensorSpec,
    Tolerance,
    Variant,
)

__all__ = [
    "AUTO_CAST",
    "AUTO_CAST_TYPES",
    "DEFAULT_SETTINGS",
    "DEFAULT_TARGETS",
    "DEFAULT_VARIANT",
    "FRONTENDS",
    "TARGETS",
    "CacheSettings",
    "CompileSettings",
    "Constant",
    "Kernel",
    "Manifest",
    "ManifestError",
    "ManifestSource",
    "Package",
    "SourceRef",
    "TensorSpec",
    "Tolerance",
    "Variant",
    "load_manifest",
]

if TYPE_CHECKING:
    from nkibuild.manifest.yamlsource import YamlDocument


def load_manifest(
    path: str | os.PathLike[str], meanwhile: Callable[[], None] | None = None
) -> Manifest:
    """Read, validate and model the manifest at `path`; `meanwhile`: work that does not
    depend on the manifest, run while a forked child validates it where one can
    (validate.validated_beside).

    Raises ManifestError carrying every problem found (each with a location).
    """
    from nkibuild.manifest.filebytes import read_manifest_bytes

    absolute, display = Path(os.path.abspath(path)), os.fspath(path)
    source = ManifestSource(read_manifest_bytes(absolute, display), absolute, display)
    if meanwhile is not None:
        # Forked before YAML is imported and parsed: the child parses it too.
        from nkibuild.manifest.forkcheck import ForkedCheck

        check = ForkedCheck.start(source.is_valid)
        if check is not None:
            from nkibuild.manifest.validate import validated_beside

            return validated_beside(source, check, meanwhile)
    return source.validated()


@dataclass(frozen=True)
class ManifestSource:
    """The manifest file's bytes, where they were read and how errors name the file."""

    raw: bytes
    path: Path  # absolute
    display: str

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    def document(self) -> YamlDocument:
        """The parsed YAML; ManifestError for a file that is not a YAML mapping."""
        from nkibuild.manifest.yamlsource import parse_yaml

        return parse_yaml(self.raw, self.display)

    def validated(self) -> Manifest:
        from nkibuild.manifest.validate import validated

        return validated(self.document(), self.path, self.sha256)

    def is_valid(self) -> bool:
        """Whether it parses and validates without any problem (a forked child's check)."""
        from nkibuild.manifest.validate import checked

        try:
            manifest, problems = checked(self.document(), self.path, self.sha256)
        except ManifestError:
            return False
        return manifest is not None and not problems
