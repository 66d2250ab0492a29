"""The manifest's JSON Schema, generated from the typed model (model.py): types from the
fields' annotations (bool, int, str, Literal, tuples, nested model classes), everything
else from their metadata (keys.py). The validator uses it as generated, in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, is_dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from nkibuild.manifest.keys import (
    UNDOCUMENTED,
    Key,
    Section,
    documented_default,
    mapping_info,
    members,
    ref,
    without_none,
)
from nkibuild.manifest.model import VALUE_TYPES, Manifest

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID = "https://raw.githubusercontent.com/nkibuild/nkibuild/main/schemas/nkibuild.schema.json"
# Keywords that say what a value is: an override with one of them replaces the
# schema the annotation gives instead of refining it.
_TYPE_KEYWORDS = frozenset({"$ref", "type", "anyOf", "oneOf", "const", "enum"})
_SCALARS: dict[type, str] = {bool: "boolean", int: "integer", float: "number", str: "string"}
_SCALARS[Path] = "string"

Members = list[tuple[Field[Any], Key, Any]]  # field, its key, its resolved type


@cache
def manifest_schema() -> dict[str, Any]:
    """The whole schema (treat as read-only: it is shared)."""
    generator = _Generator()
    root = generator.mapping(Manifest)
    return {"$schema": SCHEMA_DIALECT, "$id": SCHEMA_ID, **root, "$defs": generator.defs}


# ---------------------------------------------------- reading the schema


def properties_of(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Keys an object schema declares, then those of the schemas it $refs, in order."""
    properties = dict(schema.get("properties", {}))
    ref = schema.get("$ref")
    if isinstance(ref, str):
        for key, value in properties_of(resolve_ref(ref)).items():
            properties.setdefault(key, value)
    return properties


def resolve_ref(ref: str) -> Mapping[str, Any]:
    """A local reference (#/$defs/name) into the manifest schema."""
    node: Any = manifest_schema()
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def inline_ref(schema: Mapping[str, Any] | bool) -> Mapping[str, Any]:
    """The schema with its $ref inlined; the referencing site's own keywords win (they
    replace, not merge: enough for describing a value)."""
    if not isinstance(schema, Mapping):
        return {}
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    merged = dict(inline_ref(resolve_ref(ref)))
    merged.update((k, v) for k, v in schema.items() if k != "$ref")
    return merged


# ------------------------------------------------------ generating it


class _Generator:
    def __init__(self) -> None:
        self.defs: dict[str, Any] = {name: dict(schema) for name, schema in VALUE_TYPES.items()}

    def mapping(self, cls: type) -> dict[str, Any]:
        """A model class as an object schema, with its own title and description."""
        info = mapping_info(cls)
        assert info is not None, cls
        head = {"title": info.title, "description": info.description} if info.title else {}
        return {**head, **self._object(members(cls), info.closed), **info.schema}

    def _object(self, fields: Members, closed: bool, section: bool = False) -> dict[str, Any]:
        """An object of these fields; `section`: they are a section's (so stay in it)."""
        properties: dict[str, Any] = {}
        required: list[str] = []
        sections: dict[str, tuple[Section, Members]] = {}
        mixin: type | None = None
        for model_field, info, hint in fields:
            if info.section is not None and not section:
                name = info.section.key
                properties.setdefault(name, None)  # keeps the section's place
                sections.setdefault(name, (info.section, []))[1].append((model_field, info, hint))
            elif info.inline:
                mixin = hint
            else:
                properties[info.name] = self._property(model_field, info, hint)
                if info.required:
                    required.append(info.name)
        for name, (section, section_fields) in sections.items():
            properties[name] = self._section(section, section_fields)
        node: dict[str, Any] = {"type": "object"}
        if required:
            node["required"] = required
        if mixin is not None:
            # The mixin's keys sit beside ours; unevaluatedProperties sees both.
            node.update(self._class_ref(mixin), unevaluatedProperties=False)
        elif closed:
            node["additionalProperties"] = False
        node["properties"] = properties
        return node

    def _section(self, section: Section, fields: Members) -> dict[str, Any]:
        head = {"title": section.title, "description": section.description}
        body = self._object(fields, closed=True, section=True)
        if section.definition is None:
            return {**head, **body}
        self.defs[section.definition] = {
            "title": section.definition_title,
            "description": section.definition_description,
            **body,
        }
        return {**head, **ref(section.definition)}

    def _property(self, model_field: Field[Any], info: Key, hint: Any) -> dict[str, Any]:
        node = {"title": info.title, "description": info.description}
        node.update(self._refined(hint, info.schema, info))
        default = documented_default(model_field, info)
        if default is not UNDOCUMENTED:
            node["default"] = default
        return node

    def _refined(self, hint: Any, extra: Mapping[str, Any], info: Key | None) -> dict[str, Any]:
        if not _TYPE_KEYWORDS.isdisjoint(extra):
            return dict(extra)
        return {**self._value(without_none(hint), info), **extra}

    def _value(self, hint: Any, info: Key | None) -> dict[str, Any]:
        origin = get_origin(hint)
        if origin is tuple:
            return self._tuple(get_args(hint), info)
        if origin is Literal:
            return _literal(get_args(hint))
        if mapping_info(hint) is not None:
            return self._class_ref(hint)
        if hint in _SCALARS:
            return {"type": _SCALARS[hint]}
        raise TypeError(f"no JSON Schema for {hint!r}: give the field a schema")

    def _tuple(self, args: tuple[Any, ...], info: Key | None) -> dict[str, Any]:
        item = args[0]
        pairs = get_origin(item) is tuple  # (name, value) pairs
        item_info = mapping_info(item)
        if not pairs and (item_info is None or item_info.keyed_by is None):
            return {"type": "array", "items": self._refined(item, {}, None)}
        # A mapping by name: its field says what the names are.
        assert info is not None and info.names is not None, item
        value = self._refined(get_args(item)[1] if pairs else item, info.values, None)
        return {"type": "object", "propertyNames": dict(info.names), "additionalProperties": value}

    def _class_ref(self, cls: type) -> dict[str, Any]:
        """A shared class is a $ref to its definition, others are inlined."""
        info = mapping_info(cls)
        assert info is not None and is_dataclass(cls), cls
        if info.definition is None:
            return self.mapping(cls)
        if info.definition not in self.defs:
            self.defs[info.definition] = {}  # claims the name before recursing
            self.defs[info.definition] = self.mapping(cls)
        return ref(info.definition)


def _literal(values: tuple[Any, ...]) -> dict[str, Any]:
    kinds = sorted({_SCALARS[type(value)] for value in values})
    choices = {"const": values[0]} if len(values) == 1 else {"enum": list(values)}
    return {"type": kinds[0] if len(kinds) == 1 else kinds, **choices}
