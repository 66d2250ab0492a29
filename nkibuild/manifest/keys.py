"""How the typed model appears in nkibuild.yaml: the vocabulary of its field metadata.

Each model field with a YAML key carries a `Key`, each class that is a YAML mapping a
`MappingInfo`; the JSON Schema (schemagen.py), docs/manifest.md (docgen.py) and the
YAML-to-model converter (convert.py) are derived from them. Only the standard library
here: the model is imported on every build.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, Union, get_args, get_origin, get_type_hints

if TYPE_CHECKING:
    from nkibuild.errors import Location

    JsonPath = tuple[str | int, ...]

METADATA = "nkibuild.yaml"
_MAPPING = "__nkibuild_yaml__"
T = TypeVar("T")


UNDOCUMENTED: Any = object()  # no documented default: the JSON Schema gets no "default"
FROM_FIELD: Any = object()  # the documented default is the field's own default


@dataclass(frozen=True)
class Converting:
    """What a conversion hook may look at besides the value."""

    path: JsonPath  # of the value in the document
    values: Mapping[str, Any]  # the fields of the same object converted so far
    root: Path  # the manifest's directory
    key_location: Callable[[JsonPath], Location]  # where a mapping key is


@dataclass(frozen=True)
class Section:
    """A sub-mapping of the YAML that is not a class of its own: it groups fields of
    its parent (`defaults:` holds `Manifest.default_targets` and `Manifest.defaults`)."""

    key: str
    title: str
    description: str
    # Shared under $defs with this name, title and description, or inline when None.
    definition: str | None = None
    definition_title: str = ""
    definition_description: str = ""


@dataclass(frozen=True)
class Key:
    """A model field's YAML key and everything derived from it."""

    name: str
    title: str = ""
    description: str = ""
    required: bool = False
    # JSON Schema keywords of the value: they replace what the field's type gives
    # when they name a type ($ref, type, anyOf, oneOf), else they are added to it.
    schema: Mapping[str, Any] = field(default_factory=dict)
    # For mappings by name (tuples of keyed classes or of (name, value) pairs): the
    # schema of the names, and keywords added to the schema of each value.
    names: Mapping[str, Any] | None = None
    values: Mapping[str, Any] = field(default_factory=dict)
    # What an absent key means, as YAML spells it; by default the field's own default
    # when that is a plain value.
    documented: Any = FROM_FIELD
    section: Section | None = None
    inline: bool = False  # a mixin: the value's keys sit in the parent's mapping
    parse: Callable[[Any], Any] | None = None  # applied to the converted value
    # Replaces the generic conversion: the schema-valid YAML value (None for an absent key
    # if hook_absent) -> the model's value.
    hook: Callable[[Any, Converting], Any] | None = None
    hook_absent: bool = False  # call the hook for an absent key too (with None)


@dataclass(frozen=True)
class MappingInfo:
    """How a model class that is a YAML mapping appears in the schema."""

    title: str = ""
    description: str = ""
    definition: str | None = None  # its name under $defs; None: inline at its one use
    closed: bool = True  # additionalProperties: false (a mixin is closed where it is used)
    keyed_by: str | None = None  # in a mapping by name, the field the name fills
    schema: Mapping[str, Any] = field(default_factory=dict)  # further keywords


def ref(name: str) -> dict[str, str]:
    """The JSON Schema of a value described under `$defs` by `name`."""
    return {"$ref": f"#/$defs/{name}"}


def key(name: str, title: str, description: str, *, default: Any = MISSING, **options: Any) -> Any:
    """A dataclass field (with this `default`) that has a YAML key: its metadata is a Key."""
    return field(default=default, metadata={METADATA: Key(name, title, description, **options)})


def mixin(*, default: Any, **options: Any) -> Any:
    """A field whose class's keys sit in the parent's mapping (compile settings in a
    kernel): the parent's schema takes the class's definition as a `$ref`."""
    return key("", "", "", default=default, inline=True, **options)


def mapping(title: str = "", description: str = "", **options: Any) -> Callable[[type[T]], type[T]]:
    """Class decorator: the class is a YAML mapping (see MappingInfo)."""

    def decorate(cls: type[T]) -> type[T]:
        setattr(cls, _MAPPING, MappingInfo(title, description, **options))
        return cls

    return decorate


def mapping_info(cls: object) -> MappingInfo | None:
    return getattr(cls, _MAPPING, None) if isinstance(cls, type) else None


def keyed_fields(cls: type) -> list[tuple[Field[Any], Key]]:
    """The fields of `cls` that appear in YAML, in declaration order."""
    return [(f, f.metadata[METADATA]) for f in fields(cls) if METADATA in f.metadata]


@cache
def members(cls: type) -> list[tuple[Field[Any], Key, Any]]:
    """The YAML fields of a model class with their resolved annotations, in order."""
    hints = get_type_hints(cls)
    return [(f, info, hints[f.name]) for f, info in keyed_fields(cls)]


def without_none(hint: Any) -> Any:
    """`X | None` -> X: the manifest has no null; None in the model means "absent"."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [arg for arg in get_args(hint) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def documented_default(model_field: Field[Any], info: Key) -> Any:
    """The default a field's docs and schema state, in YAML spelling, or UNDOCUMENTED."""
    if info.documented is not FROM_FIELD:
        return info.documented
    if info.names is not None or info.schema.get("type") == "object":
        return UNDOCUMENTED  # a mapping by name: absent means empty, nothing to say
    value = model_field.default
    if value is MISSING or value is None or hasattr(value, "__dataclass_fields__"):
        return UNDOCUMENTED
    return list(value) if isinstance(value, tuple) else value


def effective_defaults(cls: type[T]) -> T:
    """An instance of a layer class with every documented default filled in (compile
    settings default to None, "inherit": what the bottom layer means is documented)."""
    values: dict[str, Any] = {}
    for model_field, info in keyed_fields(cls):
        value = documented_default(model_field, info)
        if value is UNDOCUMENTED:
            continue
        value = tuple(value) if isinstance(value, list) else value
        values[model_field.name] = info.parse(value) if info.parse else value
    return cls(**values)
