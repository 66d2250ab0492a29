"""Schema-valid YAML data -> the typed model, driven by the model's own field metadata.

Nothing here knows a manifest key: each model class says (keys.py) which key fills
which field, and the annotations say what the value becomes (tuples from lists,
mappings by name into tuples of named objects or pairs, nested classes); the few
values that need more are hooks next to their field in model.py. The data must have
passed the JSON Schema: shapes are not checked again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

from nkibuild.manifest.keys import Converting, Key, mapping_info, members, without_none
from nkibuild.manifest.model import Manifest
from nkibuild.manifest.yamlsource import JsonPath, YamlDocument

T = TypeVar("T")


def to_model(data: Mapping[str, Any], path: Path, sha256: str, doc: YamlDocument) -> Manifest:
    """The manifest at `path` (absolute) as a model of `data` (what of `doc` passed the
    schema), with locations from `doc`."""
    converter = _Converter(path.parent, doc)
    return converter.mapping(Manifest, data, (), {"path": path, "sha256": sha256})


class _Converter:
    def __init__(self, root: Path, doc: YamlDocument) -> None:
        self.root = root
        self.doc = doc

    def mapping(
        self, cls: type[T], data: Mapping[str, Any], path: JsonPath, preset: dict[str, Any]
    ) -> T:
        """An instance of `cls` from its mapping; `preset` fills fields YAML has no key for."""
        values = dict(preset)
        for model_field, info, hint in members(cls):
            container, base = data, path
            if info.section is not None:
                container, base = data.get(info.section.key, {}), (*path, info.section.key)
            found = self._field(hint, info, container, base, values)
            if found is not _ABSENT:
                values[model_field.name] = found
        return cls(**values)

    def _field(
        self,
        hint: Any,
        info: Key,
        data: Mapping[str, Any],
        path: JsonPath,
        values: dict[str, Any],
    ) -> Any:
        where = (*path, info.name)
        if info.inline:  # a mixin reads the keys of the same mapping
            value = self.mapping(without_none(hint), data, path, {})
        elif info.hook is not None and (info.name in data or info.hook_absent):
            converting = Converting(where, values, self.root, self.doc.key_location)
            with _invalid_at(where):
                return info.hook(data.get(info.name), converting)
        elif info.name in data:
            value = self.value(hint, data[info.name], where)
        else:
            return _ABSENT  # the dataclass default
        with _invalid_at(where):
            return info.parse(value) if info.parse else value

    def value(self, hint: Any, raw: Any, path: JsonPath) -> Any:
        hint = without_none(hint)
        if get_origin(hint) is tuple:
            return self._tuple(get_args(hint)[0], raw, path)
        if mapping_info(hint) is not None:
            return self.mapping(hint, raw, path, {})
        from_yaml = getattr(hint, "from_yaml", None)
        if from_yaml is not None:  # a class written as a scalar (a source reference)
            return from_yaml(raw, self.doc.location(path))
        return raw  # a scalar, or a union the field's parse takes apart

    def _tuple(self, item: Any, raw: Any, path: JsonPath) -> tuple[Any, ...]:
        if get_origin(item) is tuple:  # (name, value) pairs from a mapping by name
            value_hint = get_args(item)[1]
            return tuple(
                (name, self.value(value_hint, v, (*path, name))) for name, v in raw.items()
            )
        item_info = mapping_info(item)
        if item_info is not None and item_info.keyed_by:  # named objects from a mapping
            return tuple(
                self._named(item, item_info.keyed_by, name, v, (*path, name))
                for name, v in raw.items()
            )
        return tuple(self.value(item, v, (*path, index)) for index, v in enumerate(raw))

    def _named(self, cls: type, keyed_by: str, name: str, raw: Any, path: JsonPath) -> Any:
        preset: dict[str, Any] = {keyed_by: name}
        if "location" in cls.__dataclass_fields__:  # type: ignore[attr-defined]
            preset["location"] = self.doc.key_location(path)
        return self.mapping(cls, raw, path, preset)


_ABSENT = object()


@dataclass(eq=False)  # hashable, as exceptions are
class InvalidValue(Exception):
    """A schema-valid value that its field's parse or hook refuses (a 400-digit size,
    NaN as a timeout, `~nosuchuser/` in a path): reported at `path` like any problem."""

    path: JsonPath
    message: str


@contextlib.contextmanager
def _invalid_at(path: JsonPath) -> Iterator[None]:
    try:
        yield
    except ValueError as error:
        raise InvalidValue(path, str(error)) from None
