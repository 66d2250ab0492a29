"""A parsed manifest -> a validated Manifest: the JSON Schema, the model, then the
checks a schema cannot express.

Every problem becomes a Diagnostic with a location, and all problems of a stage are
reported together. The stages live in their own modules: schema.py (the JSON Schema
check and its messages), phrases.py (the words they share), semantic.py (the checks
on the model).
"""

from __future__ import annotations

from pathlib import Path

from nkibuild.errors import Diagnostic, ManifestError
from nkibuild.manifest.convert import InvalidValue, to_model
from nkibuild.manifest.model import Manifest
from nkibuild.manifest.schema import schema_diagnostics
from nkibuild.manifest.semantic import semantic_diagnostics
from nkibuild.manifest.yamlsource import YamlDocument, json_path


def validated(doc: YamlDocument, path: Path, sha256: str) -> Manifest:
    """The model of the document at `path` (absolute); ManifestError with every problem."""
    diagnostics = schema_diagnostics(doc)
    if diagnostics:
        raise ManifestError(diagnostics)
    # The converter and the semantic checks rely on the shapes the schema guarantees.
    try:
        manifest = to_model(doc.data, path, sha256, doc.location, doc.key_location)
    except InvalidValue as invalid:
        where = json_path(invalid.path)
        diagnostic = Diagnostic(invalid.message, doc.location(invalid.path), where)
        raise ManifestError([diagnostic]) from None
    diagnostics = semantic_diagnostics(manifest, doc)
    if diagnostics:
        raise ManifestError(diagnostics)
    return manifest
