"""The JSON Schema check of a manifest: one Diagnostic per problem, with the position,
JSON path, what is expected and a hint. jsonschema is imported on first use only.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from nkibuild.errors import Diagnostic
from nkibuild.manifest.phrases import (
    describe,
    did_you_mean,
    kind,
    kind_name,
    position,
    show,
    types_of,
)
from nkibuild.manifest.schemagen import inline_ref, manifest_schema, properties_of
from nkibuild.manifest.yamlsource import JsonPath, YamlDocument

if TYPE_CHECKING:
    from jsonschema import ValidationError
    from jsonschema.protocols import Validator


@cache
def _strict() -> type[Validator]:
    from jsonschema import Draft202012Validator, validators

    # JSON Schema counts 2.0 as an integer; a shape or optlevel written 2.0 is a typo.
    def is_integer(_checker: object, instance: object) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer)
    return validators.extend(Draft202012Validator, type_checker=checker)


def schema_problems(doc: YamlDocument) -> list[SchemaProblem]:
    """One problem per mistake the schema finds, in document order, each with the path
    of what is wrong (for a missing key: the mapping that lacks it)."""
    errors = _strict()(manifest_schema()).iter_errors(doc.data)
    return _unique_sorted(item for error in errors for item in _diagnose(error, doc))


@dataclass(frozen=True)
class SchemaProblem:
    diagnostic: Diagnostic
    path: JsonPath
    # Several keywords may reject one value (type and enum, say): one diagnostic
    # per value is kept, the lowest rank: an enum's choices say more than its type.
    rank: int | None = None  # None: not about a value (missing or unknown keys)


def _problem(
    doc: YamlDocument, message: str, path: JsonPath, rank: int | None = None, **details: Any
) -> SchemaProblem:
    return SchemaProblem(doc.at(message, path, **details), path, rank)


def _unique_sorted(found: Iterable[SchemaProblem]) -> list[SchemaProblem]:
    best: dict[tuple[str | None, str | None], SchemaProblem] = {}
    for item in found:
        d = item.diagnostic
        key = (d.json_path, None if item.rank is not None else d.message)
        if key not in best or (item.rank or 0) < (best[key].rank or 0):
            best[key] = item
    return sorted(best.values(), key=lambda item: position(item.diagnostic))


def _diagnose(error: ValidationError, doc: YamlDocument) -> list[SchemaProblem]:
    if "propertyNames" in error.relative_schema_path:
        return [_bad_name(error, doc)]
    handler = _HANDLERS.get(str(error.validator))
    return handler(error, doc) if handler else [_value_found(str(error.validator), error, doc)]


def _missing(error: ValidationError, doc: YamlDocument) -> list[SchemaProblem]:
    path = tuple(error.absolute_path)
    properties = properties_of(error.schema)
    return [
        _problem(
            doc, f"missing required key {name!r}", path, expected=describe(properties.get(name, {}))
        )
        for name in error.validator_value
        if name not in error.instance
    ]


def _unknown_keys(error: ValidationError, doc: YamlDocument) -> list[SchemaProblem]:
    path = tuple(error.absolute_path)
    allowed = list(properties_of(error.schema))
    return [
        _problem(
            doc,
            f"unknown key {show(key)}",
            (*path, key),
            key=True,
            expected="one of " + ", ".join(allowed) if allowed else "no keys",
            hint=did_you_mean(key, allowed),
        )
        for key in error.instance
        if key not in allowed
    ]


def _alternatives(error: ValidationError, doc: YamlDocument) -> list[SchemaProblem]:
    """anyOf/oneOf: report the branch the value was evidently meant for, the one whose
    type it has (a list is a shape, a mapping a {shape, dtype}), else the choices."""
    branches: dict[int, list[ValidationError]] = defaultdict(list)
    for sub in error.context or ():
        branches[int(sub.relative_schema_path[0])].append(sub)
    for _, errors in sorted(branches.items()):
        if not any(sub.validator == "type" and not sub.relative_path for sub in errors):
            return [found for sub in errors for found in _diagnose(sub, doc)]
    return [_value_found("type", error, doc)]


def _bad_name(error: ValidationError, doc: YamlDocument) -> SchemaProblem:
    # propertyNames errors sit on the mapping; the offending key is the instance.
    key = error.instance
    path = (*error.absolute_path, key)
    choices = error.schema.get("enum") if isinstance(error.schema, dict) else None
    return _problem(
        doc,
        f"invalid name {show(key)}",
        path,
        key=True,
        expected=describe(error.schema),
        hint=did_you_mean(key, [str(c) for c in choices]) if choices else None,
    )


def _value_found(validator: str, error: ValidationError, doc: YamlDocument) -> SchemaProblem:
    path = tuple(error.absolute_path)
    instance = error.instance
    message = _VALUE_MESSAGES.get(validator, lambda _value, e: e.message)(instance, error)
    return _problem(
        doc,
        message,
        path,
        rank={"enum": 0, "const": 0, "type": 1}.get(validator, 2),
        expected=describe(error.schema),
        hint=_value_hint(validator, instance, error.schema),
    )


def _duplicate_item(instance: Sequence[object], _error: ValidationError) -> str:
    again = [item for index, item in enumerate(instance) if item in instance[:index]]
    return f"{show(again[0])} is listed twice" if again else "items are not unique"


_VALUE_MESSAGES: dict[str, Callable[[Any, ValidationError], str]] = {
    "type": lambda value, _e: f"wrong type: {kind(value)}",
    "enum": lambda value, _e: f"invalid value {show(value)}",
    "const": lambda value, _e: f"unsupported value {show(value)}",
    "pattern": lambda value, _e: f"invalid value {show(value)}",
    "minimum": lambda value, _e: f"{show(value)} is too small",
    "maximum": lambda value, _e: f"{show(value)} is too large",
    "minLength": lambda value, _e: "empty string" if not value else f"{show(value)} is too short",
    "maxLength": lambda value, _e: f"too long ({len(value)} characters)",
    "minItems": lambda value, _e: "empty list" if not value else "too few items",
    "maxItems": lambda value, _e: "too many items",
    "minProperties": lambda value, _e: "empty mapping" if not value else "too few entries",
    "uniqueItems": _duplicate_item,
}

_HANDLERS: dict[str, Callable[[ValidationError, YamlDocument], list[SchemaProblem]]] = {
    "required": _missing,
    "additionalProperties": _unknown_keys,
    "unevaluatedProperties": _unknown_keys,
    "anyOf": _alternatives,
    "oneOf": _alternatives,
}


def _value_hint(validator: str, instance: object, schema: Mapping[str, Any]) -> str | None:
    schema = inline_ref(schema)
    if validator == "type" and "string" in types_of(schema) and isinstance(instance, int | float):
        return f"quote it: unquoted, YAML reads {show(instance)} as a {kind_name(instance)}"
    if validator == "enum":
        choices = schema.get("enum", [])
        if any(isinstance(c, int) and str(c) == instance for c in choices):
            return "write the number without quotes"
        return did_you_mean(str(instance), [str(c) for c in choices])
    return None
