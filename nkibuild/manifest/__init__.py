"""The nkibuild.yaml manifest: loading, validation and the typed model.

The model (model.py) is the one description of the manifest; the JSON Schema,
docs/manifest.md and the YAML converter are generated from it
(`python -m nkibuild.manifest.generate`).

Importing this package is cheap on purpose (the CLI's --help and the cached
no-op build import it): PyYAML, jsonschema and the validator are imported by
`load_manifest` only.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from nkibuild.manifest.model import Manifest


def load_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The manifest at `path`, validated; ManifestError carries every problem found."""
    from nkibuild.manifest.validate import validated
    from nkibuild.manifest.yamlsource import load_yaml

    absolute = Path(os.path.abspath(path))
    doc, raw = load_yaml(absolute, display=os.fspath(path))
    sha256 = hashlib.sha256(raw).hexdigest()
    return validated(doc, absolute, sha256)
