"""A parsed manifest -> a validated Manifest: the JSON Schema, the model, then the
checks a schema cannot express.

Every problem becomes a Diagnostic with a location, and all problems are reported
together, in one run: what the schema refuses is set aside (`_Salvage`) and the
model and the semantic checks run on every part that passed.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

from nkibuild.errors import ManifestError
from nkibuild.manifest.convert import InvalidValue, to_model
from nkibuild.manifest.model import Manifest
from nkibuild.manifest.phrases import position
from nkibuild.manifest.schema import schema_problems
from nkibuild.manifest.semantic import semantic_diagnostics
from nkibuild.manifest.yamlsource import MAX_DEPTH, JsonPath, YamlDocument

# Top-level keys the model cannot do without: a broken one is replaced by a value that
# passes (and is then not checked), so that the kernels can still be checked.
_STAND_INS: dict[str, Any] = {
    "format-version": 1,
    "package": {"name": "stand-in", "version": "0"},
    "kernels": {},
}
# Each round sets aside at least one more level of a broken part; a document nests at
# most MAX_DEPTH levels, so this many rounds always end in a schema-valid rest.
_ROUNDS = MAX_DEPTH + 2


def validated(doc: YamlDocument, path: Path, sha256: str) -> Manifest:
    """The model of the document at `path` (absolute), or ManifestError with every
    problem found, in document order."""
    salvage = _Salvage(doc)
    problems = schema_problems(doc)
    reported = [problem.diagnostic for problem in problems]
    broken = [problem.path for problem in problems]
    manifest = None
    for _ in range(_ROUNDS):
        if broken:
            if not salvage.set_aside(broken):
                break
            # What setting aside broke (a kernel now lacks its `inputs`) is no news.
            broken = salvage.broken_rest()
            continue
        # The converter and the semantic checks rely on the shapes the schema guarantees.
        try:
            manifest = to_model(salvage.data, path, sha256, doc)
        except InvalidValue as invalid:
            reported.append(doc.at(invalid.message, invalid.path))
            broken = [invalid.path]
            continue
        reported += semantic_diagnostics(manifest, salvage.document())
        break
    if reported or manifest is None:
        raise ManifestError(sorted(reported, key=position))
    return manifest


class _Salvage:
    """The document without its broken parts: a broken value is removed (a list as a
    whole: a shape missing a dimension would be another shape), and if removing it breaks
    its mapping (a required key), the mapping goes in the next round."""

    def __init__(self, doc: YamlDocument) -> None:
        self.doc = doc
        self.data: Any = doc.data
        self.stand_ins: set[JsonPath] = set()

    def document(self) -> YamlDocument:
        return self.doc if self.data is self.doc.data else replace(self.doc, data=self.data)

    def set_aside(self, paths: list[JsonPath]) -> bool:
        """Remove what is at `paths`; False if the document itself is broken."""
        if self.data is self.doc.data:
            self.data = copy.deepcopy(self.data)  # the document keeps what was written
        return all(self._remove(_whole_value(path)) for path in paths)

    def broken_rest(self) -> list[JsonPath]:
        return [
            problem.path
            for problem in schema_problems(self.document())
            if problem.path[:1] not in self.stand_ins
        ]

    def _remove(self, path: JsonPath) -> bool:
        if not isinstance(self.data, dict):
            return False
        if path[:1] in self.stand_ins:  # replaced whole, e.g. by a sibling's problem
            return True
        if len(path) <= 1:  # a top-level key, or the root missing one
            keys = [path[0]] if path else [k for k in _STAND_INS if k not in self.data]
            for key in keys:
                if key in _STAND_INS:
                    self.data[key] = copy.deepcopy(_STAND_INS[key])
                    self.stand_ins.add((key,))
                else:
                    self.data.pop(key, None)
            return True
        parent = self.data
        for part in path[:-1]:
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                return True  # already removed with an ancestor
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
            # A kernel whose frontend is invalid (reported) gets one that takes its source's
            # form, instead of being set aside whole: its other problems are still found.
            source = parent.get("source")
            if path[0] == "kernels" and path[2:] == ("frontend",) and isinstance(source, str):
                parent["frontend"] = "jax" if ":" in source else "hlo"
        return True


def _whole_value(path: JsonPath) -> JsonPath:
    """A list is one value: a problem with an item removes the list."""
    while path and isinstance(path[-1], int):
        path = path[:-1]
    return path
