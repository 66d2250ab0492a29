"""Validate a parsed manifest: the JSON Schema first, then checks a schema cannot express.

Every problem becomes a Diagnostic with a location, and all of them are
reported together. jsonschema is imported on first use only.
"""

from __future__ import annotations

import difflib
import json
import keyword
import posixpath
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import TYPE_CHECKING, Any

from nkibuild.errors import Diagnostic, ManifestError
from nkibuild.manifest import DEFAULT_TARGETS
from nkibuild.manifest.yamlsource import JsonPath, YamlDocument, json_path

if TYPE_CHECKING:
    from jsonschema import ValidationError
    from jsonschema.protocols import Validator

SCHEMA_FILE = "nkibuild.schema.json"
PYTHON_FRONTENDS = frozenset({"nki", "nkipy", "jax"})
MAX_SHOWN = 60  # characters of a user's value quoted back in a message


def validate(doc: YamlDocument, root: Path) -> None:
    """Raise ManifestError with every problem of the document, or return."""
    diagnostics = schema_diagnostics(doc)
    if not diagnostics:
        # The semantic checks rely on the shapes the schema guarantees.
        diagnostics = semantic_diagnostics(doc, root)
    if diagnostics:
        raise ManifestError(diagnostics)


# --------------------------------------------------------------------- schema


@cache
def load_schema() -> dict[str, Any]:
    """The manifest's JSON Schema (shipped inside the package)."""
    text = resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@cache
def _validator() -> Validator:
    from jsonschema import Draft202012Validator, validators

    # JSON Schema counts 2.0 as an integer; a shape or optlevel written 2.0 is a typo.
    def is_integer(_checker: object, instance: object) -> bool:
        return isinstance(instance, int) and not isinstance(instance, bool)

    checker = Draft202012Validator.TYPE_CHECKER.redefine("integer", is_integer)
    strict = validators.extend(Draft202012Validator, type_checker=checker)
    return strict(load_schema())


def schema_diagnostics(doc: YamlDocument) -> list[Diagnostic]:
    """One diagnostic per problem the schema finds, in document order."""
    found = [item for error in _validator().iter_errors(doc.data) for item in _diagnose(error, doc)]
    return _unique_sorted(found)


@dataclass(frozen=True)
class _Found:
    diagnostic: Diagnostic
    # Several keywords may reject one value (type and enum, say): one diagnostic
    # per value is kept, the lowest rank: an enum's choices say more than its type.
    rank: int | None = None  # None: not about a value (missing or unknown keys)


def _unique_sorted(found: Iterable[_Found]) -> list[Diagnostic]:
    best: dict[tuple[str | None, str | None], _Found] = {}
    for item in found:
        d = item.diagnostic
        key = (d.json_path, None if item.rank is not None else d.message)
        if key not in best or (item.rank or 0) < (best[key].rank or 0):
            best[key] = item
    diagnostics = [item.diagnostic for item in best.values()]
    return sorted(diagnostics, key=_position)


def _position(d: Diagnostic) -> tuple[int, int]:
    return (d.location.line, d.location.column) if d.location else (0, 0)


def _diagnose(error: ValidationError, doc: YamlDocument) -> list[_Found]:
    if "propertyNames" in error.relative_schema_path:
        return [_bad_name(error, doc)]
    handler = _HANDLERS.get(str(error.validator), _bad_value)
    return handler(error, doc)


def _missing(error: ValidationError, doc: YamlDocument) -> list[_Found]:
    path = tuple(error.absolute_path)
    properties = properties_of(error.schema)
    return [
        _Found(
            Diagnostic(
                f"missing required key {name!r}",
                doc.location(path),
                json_path(path),
                expected=describe(properties.get(name, {})),
            )
        )
        for name in error.validator_value
        if name not in error.instance
    ]


def _unknown_keys(error: ValidationError, doc: YamlDocument) -> list[_Found]:
    path = tuple(error.absolute_path)
    allowed = list(properties_of(error.schema))
    return [
        _Found(
            Diagnostic(
                f"unknown key {_show(key)}",
                doc.key_location((*path, key)),
                json_path((*path, key)),
                expected="one of " + ", ".join(allowed) if allowed else "no keys",
                hint=_did_you_mean(key, allowed),
            )
        )
        for key in error.instance
        if key not in allowed
    ]


def _alternatives(error: ValidationError, doc: YamlDocument) -> list[_Found]:
    """anyOf/oneOf: report the branch the value was evidently meant for.

    A branch whose type the value has is the one meant (a list is a shape, a
    mapping a {shape, dtype}); if none fits, say what the choices are.
    """
    branches: dict[int, list[ValidationError]] = defaultdict(list)
    for sub in error.context or ():
        branches[int(sub.relative_schema_path[0])].append(sub)
    for _, errors in sorted(branches.items()):
        if not any(sub.validator == "type" and not sub.relative_path for sub in errors):
            return [found for sub in errors for found in _diagnose(sub, doc)]
    return [_value_found("type", error, doc)]


def _bad_name(error: ValidationError, doc: YamlDocument) -> _Found:
    # propertyNames errors sit on the mapping; the offending key is the instance.
    key = error.instance
    path = (*error.absolute_path, key)
    choices = error.schema.get("enum") if isinstance(error.schema, dict) else None
    return _Found(
        Diagnostic(
            f"invalid name {_show(key)}",
            doc.key_location(path),
            json_path(path),
            expected=describe(error.schema),
            hint=_did_you_mean(key, [str(c) for c in choices]) if choices else None,
        )
    )


def _bad_value(error: ValidationError, doc: YamlDocument) -> list[_Found]:
    return [_value_found(str(error.validator), error, doc)]


def _value_found(validator: str, error: ValidationError, doc: YamlDocument) -> _Found:
    path = tuple(error.absolute_path)
    instance = error.instance
    message = _VALUE_MESSAGES.get(validator, _fallback_message)(instance, error)
    return _Found(
        Diagnostic(
            message,
            doc.location(path),
            json_path(path),
            expected=describe(error.schema),
            hint=_value_hint(validator, instance, error.schema),
        ),
        rank={"enum": 0, "const": 0, "type": 1}.get(validator, 2),
    )


def _fallback_message(_instance: object, error: ValidationError) -> str:
    return error.message


def _duplicate_item(instance: Sequence[object], _error: ValidationError) -> str:
    seen: list[object] = []
    for item in instance:
        if item in seen:
            return f"{_show(item)} is listed twice"
        seen.append(item)
    return "items are not unique"


_VALUE_MESSAGES: dict[str, Callable[[Any, ValidationError], str]] = {
    "type": lambda value, _e: f"wrong type: {_kind(value)}",
    "enum": lambda value, _e: f"invalid value {_show(value)}",
    "const": lambda value, _e: f"unsupported value {_show(value)}",
    "pattern": lambda value, _e: f"invalid value {_show(value)}",
    "minimum": lambda value, _e: f"{_show(value)} is too small",
    "maximum": lambda value, _e: f"{_show(value)} is too large",
    "minLength": lambda value, _e: "empty string" if not value else f"{_show(value)} is too short",
    "maxLength": lambda value, _e: f"too long ({len(value)} characters)",
    "minItems": lambda value, _e: "empty list" if not value else "too few items",
    "maxItems": lambda value, _e: "too many items",
    "minProperties": lambda value, _e: "empty mapping" if not value else "too few entries",
    "uniqueItems": _duplicate_item,
}

_HANDLERS: dict[str, Callable[[ValidationError, YamlDocument], list[_Found]]] = {
    "required": _missing,
    "additionalProperties": _unknown_keys,
    "unevaluatedProperties": _unknown_keys,
    "anyOf": _alternatives,
    "oneOf": _alternatives,
}


def _value_hint(validator: str, instance: object, schema: Mapping[str, Any]) -> str | None:
    schema = inline_ref(schema)
    if validator == "type" and "string" in _types(schema) and _is_scalar(instance):
        return f"quote it: unquoted, YAML reads {_show(instance)} as a {_kind_name(instance)}"
    if validator == "enum":
        choices = schema.get("enum", [])
        if any(isinstance(c, int) and str(c) == instance for c in choices):
            return "write the number without quotes"
        return _did_you_mean(str(instance), [str(c) for c in choices])
    return None


def _is_scalar(value: object) -> bool:
    return isinstance(value, int | float | bool)


def _did_you_mean(word: str, choices: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:
        # "auto_cast" for "auto-cast": compare with separators and case ignored too
        fold = {_fold(c): c for c in choices}
        close = [fold[_fold(word)]] if _fold(word) in fold else []
    return f"did you mean {close[0]!r}?" if close else None


def _fold(word: str) -> str:
    return word.lower().replace("_", "").replace("-", "")


def properties_of(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Keys an object schema declares, with those of the schemas it $refs, in order."""
    properties: dict[str, Any] = {}
    for part in _schema_parts(schema):
        for key, value in part.get("properties", {}).items():
            properties.setdefault(key, value)
    return properties


def _schema_parts(schema: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield schema
    ref = schema.get("$ref")
    if isinstance(ref, str):
        yield from _schema_parts(resolve_ref(ref))
    for sub in schema.get("allOf", ()):
        yield from _schema_parts(sub)


def resolve_ref(ref: str) -> Mapping[str, Any]:
    """A local reference (#/$defs/name) into the manifest schema."""
    node: Any = load_schema()
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def inline_ref(schema: Mapping[str, Any] | bool) -> Mapping[str, Any]:
    """The schema with its $ref inlined; the referencing site's own keywords win.

    (Keywords are replaced, not merged: enough for describing a value.)
    """
    if not isinstance(schema, Mapping):
        return {}
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    merged = dict(inline_ref(resolve_ref(ref)))
    merged.update((k, v) for k, v in schema.items() if k != "$ref")
    return merged


# ------------------------------------------------------------ human phrases


def describe(
    schema: Mapping[str, Any] | bool, depth: int = 0, code: Callable[[str], str] = str
) -> str:
    """What a schema accepts, in words: "one of trn1, trn2, trn3", "an integer >= 1".

    `code` formats literal values and patterns (the docs put them in backticks).
    """
    schema = inline_ref(schema)
    if "const" in schema:
        return f"exactly {code(_plain(schema['const']))}"
    if "enum" in schema:
        return "one of " + ", ".join(code(_plain(v)) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _join_or([_titled(sub, depth + 1, code) for sub in schema[key]])
    phrases = [_type_phrase(t, schema, depth, code) for t in _types(schema)]
    return _join_or(phrases) if phrases else "any value"


def _titled(schema: Mapping[str, Any], depth: int, code: Callable[[str], str]) -> str:
    title = inline_ref(schema).get("title")
    phrase = describe(schema, depth, code)
    return f"{phrase} ({title})" if title else phrase


def _types(schema: Mapping[str, Any]) -> list[str]:
    types = schema.get("type", [])
    return [types] if isinstance(types, str) else list(types)


def _type_phrase(
    type_name: str, schema: Mapping[str, Any], depth: int, code: Callable[[str], str]
) -> str:
    if type_name == "integer":
        return "an integer" + (f" >= {schema['minimum']}" if "minimum" in schema else "")
    if type_name == "string":
        return _string_phrase(schema, code)
    if type_name == "array":
        return _array_phrase(schema, depth, code)
    return {"number": "a number", "boolean": "a boolean", "object": "a mapping"}.get(
        type_name, type_name
    )


def _string_phrase(schema: Mapping[str, Any], code: Callable[[str], str]) -> str:
    phrase = "a non-empty string" if schema.get("minLength", 0) >= 1 else "a string"
    if "examples" in schema:  # friendlier than the pattern that checks them
        phrase = "a string such as " + ", ".join(code(str(e)) for e in schema["examples"])
    elif "pattern" in schema:
        phrase = f"a string matching {code(schema['pattern'])}"
    if "maxLength" in schema:
        phrase += f" of at most {schema['maxLength']} characters"
    return phrase


def _array_phrase(schema: Mapping[str, Any], depth: int, code: Callable[[str], str]) -> str:
    phrase = "a non-empty list" if schema.get("minItems", 0) >= 1 else "a list"
    if schema.get("uniqueItems"):
        phrase += " of unique items"
    items = inline_ref(schema.get("items", {}))
    if items.get("title") is not None and items.get("title") == schema.get("title"):
        phrase += " of such values"  # a constant is a list of constants
    elif items and depth == 0:
        phrase += f", each {describe(items, depth + 1, code)}"
    return phrase


def _join_or(phrases: Sequence[str]) -> str:
    return phrases[0] if len(phrases) == 1 else f"{', '.join(phrases[:-1])} or {phrases[-1]}"


def _plain(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _show(value: object) -> str:
    """A user's value quoted back, escaped (no control characters) and shortened."""
    text = repr(value) if isinstance(value, str) else _plain_repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _plain_repr(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        return repr(value)


def _kind_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "list" if isinstance(value, list) else "mapping"


def _kind(value: object) -> str:
    name = _kind_name(value)
    if isinstance(value, dict | list) or value is None:
        return f"got {'an' if name[0] in 'aeiou' else 'a'} {name}"
    return f"got a {name} ({_show(value)})"


# ------------------------------------------------------------------ semantic


def semantic_diagnostics(doc: YamlDocument, root: Path) -> list[Diagnostic]:
    """Problems beyond the schema: names, paths, targets and settings that clash."""
    checks = _Checks(doc, root)
    found = [d for check in checks.all() for d in check()]
    return sorted(found, key=_position)


def split_source(text: str) -> tuple[str, str | None]:
    """`path/to/file.py:function` -> (path, function); a bare path has no function."""
    path, sep, function = text.rpartition(":")
    return (path, function) if sep else (text, None)


def normalize_path(text: str) -> str:
    """POSIX form without "." parts or redundant separators (".." is refused earlier)."""
    return posixpath.normpath(text)


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a Python name in generated code, or None."""
    if not (name.isascii() and name.isidentifier()):
        return f"{_show(name)} is not an ASCII Python identifier"
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword"
    if name.startswith("__"):
        return f"{name!r} starts with '__', which Python reserves"
    return None


# Names the generated bundle uses itself: a kernel or argument by these names would
# shadow them (or, for `mode`, repeat the generated keyword-only parameter).
RESERVED_KERNEL_NAMES = frozenset({"build_info", "KERNELS", "reference", "neff"})
RESERVED_ARGUMENT_NAMES = frozenset({"mode"})


def _reserved_problem(path: JsonPath) -> str | None:
    name = str(path[-1])
    if len(path) == 2 and (name in RESERVED_KERNEL_NAMES or name.startswith("_")):
        return f"kernel name {name!r} is reserved by the generated bundle (or private)"
    if len(path) == 4 and path[2] == "inputs" and name in RESERVED_ARGUMENT_NAMES:
        return f"{name!r} is reserved: generated kernels take a `mode` keyword argument"
    return None


def derived_import_name(distribution: str) -> str:
    """The import name a distribution name maps to when none is given."""
    return re.sub(r"[-_.]+", "_", distribution).lower()


class _Checks:
    """The semantic checks, each a generator of diagnostics over the raw data."""

    def __init__(self, doc: YamlDocument, root: Path) -> None:
        self.doc = doc
        self.root = root
        self.data: dict[str, Any] = doc.data
        self.defaults: dict[str, Any] = self.data.get("defaults", {})
        self.kernels: dict[str, dict[str, Any]] = self.data["kernels"]

    def all(self) -> list[Callable[[], Iterator[Diagnostic]]]:
        return [
            self.names,
            self.package,
            self.sources,
            self.hlo_inputs_only,
            self.variant_inputs,
            self.constant_names,
            self.override_targets,
            self.lnc_on_trn1,
            self.deps,
        ]

    def at(
        self,
        message: str,
        path: JsonPath,
        *,
        key: bool = False,
        expected: str | None = None,
        hint: str | None = None,
    ) -> Diagnostic:
        where = self.doc.key_location(path) if key else self.doc.location(path)
        return Diagnostic(message, where, json_path(path), expected, hint)

    def names(self) -> Iterator[Diagnostic]:
        for path in self._named_entries():
            problem = name_problem(str(path[-1])) or _reserved_problem(path)
            if problem:
                yield self.at(problem, path, key=True, expected="a Python identifier")

    def _named_entries(self) -> Iterator[JsonPath]:
        # Kernel, input, constant and variant names become Python names in the bundle.
        for kernel_name, kernel in self.kernels.items():
            base = ("kernels", kernel_name)
            yield base
            for section in ("inputs", "constants", "variants"):
                for name in kernel.get(section, {}):
                    yield (*base, section, name)

    def package(self) -> Iterator[Diagnostic]:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        package = self.data["package"]
        name_ok = _is_distribution_name(package["name"])
        if not name_ok:
            yield self.at(
                f"invalid distribution name {_show(package['name'])}", ("package", "name")
            )
        yield from self._parses(Version, "version", "a PEP 440 version such as 1.0 or 0.2.1rc1")
        yield from self._parses(
            SpecifierSet, "requires-python", "a PEP 440 specifier set such as >=3.10"
        )
        if name_ok or "import-name" in package:  # else the name's problem is reported already
            yield from self._import_name(package)

    def _parses(
        self, parse: Callable[[str], object], key: str, expected: str
    ) -> Iterator[Diagnostic]:
        value = self.data["package"].get(key)
        if value is None:
            return
        try:
            parse(value)
        except ValueError:  # packaging's InvalidVersion and InvalidSpecifier
            what = "version" if key == "version" else "version specifier"
            yield self.at(f"invalid {what} {_show(value)}", ("package", key), expected=expected)

    def _import_name(self, package: dict[str, Any]) -> Iterator[Diagnostic]:
        if "import-name" in package:
            problem = name_problem(package["import-name"])
            if problem:
                yield self.at(problem, ("package", "import-name"), expected="a Python identifier")
            return
        derived = derived_import_name(package["name"])
        problem = name_problem(derived)
        if problem:
            yield self.at(
                f"the distribution name gives the import name {derived!r}: {problem}",
                ("package", "name"),
                hint="set package.import-name to a valid Python package name",
            )

    def sources(self) -> Iterator[Diagnostic]:
        for name, kernel in self.kernels.items():
            base = ("kernels", name)
            python = kernel["frontend"] in PYTHON_FRONTENDS
            yield from self._source_ref(kernel["source"], (*base, "source"), python)
            if "reference" in kernel:
                yield from self._source_ref(kernel["reference"], (*base, "reference"), True)

    def _source_ref(self, text: str, path: JsonPath, python: bool) -> Iterator[Diagnostic]:
        file, function = split_source(text)
        form = "path/to/file.py:function" if python else "a file path without ':function'"
        if python and function is None:
            yield self.at(f"{_show(text)} names no function", path, expected=form)
        elif not python and function is not None:
            yield self.at(
                f"{_show(text)} names a function, but hlo sources are files",
                path,
                expected=form,
                hint="remove ':' and what follows",
            )
        elif function is not None and name_problem(function):
            yield self.at(name_problem(function) or "", path, expected=form)
        problem = self._file_problem(file, python)
        if problem:
            message, hint = problem
            yield self.at(message, path, expected=form, hint=hint)

    def _file_problem(self, file: str, python: bool) -> tuple[str, str | None] | None:
        problem = _relative_path_problem(file)
        if problem:
            return problem, "paths are relative to the directory of nkibuild.yaml"
        if python and not file.endswith(".py"):
            return f"{_show(file)} is not a Python file", "Python code is read from a .py file"
        return _existing_file_problem(self.root, normalize_path(file))

    def hlo_inputs_only(self) -> Iterator[Diagnostic]:
        reasons = {
            "constants": "an HloModuleProto has its constants built in",
            "variants": "an HloModuleProto has fixed shapes; declare one kernel per shape",
        }
        for name, kernel in self.kernels.items():
            if kernel["frontend"] != "hlo":
                continue
            for section, reason in reasons.items():
                if section in kernel:
                    yield self.at(
                        f"the hlo frontend takes no {section}",
                        ("kernels", name, section),
                        key=True,
                        hint=reason,
                    )

    def variant_inputs(self) -> Iterator[Diagnostic]:
        for name, kernel in self.kernels.items():
            inputs = list(kernel["inputs"])
            for variant, entries in kernel.get("variants", {}).items():
                for input_name in entries:
                    if input_name not in inputs:
                        yield self.at(
                            f"variant {variant!r} names {_show(input_name)}, not an input",
                            ("kernels", name, "variants", variant, input_name),
                            key=True,
                            expected="one of " + ", ".join(inputs),
                            hint=_did_you_mean(input_name, inputs),
                        )

    def constant_names(self) -> Iterator[Diagnostic]:
        for name, kernel in self.kernels.items():
            for constant in kernel.get("constants", {}):
                if constant in kernel["inputs"]:
                    yield self.at(
                        f"constant {constant!r} has the name of an input",
                        ("kernels", name, "constants", constant),
                        key=True,
                        hint="rename one: both are passed to the kernel as keyword arguments",
                    )

    def _targets(self, kernel: dict[str, Any]) -> list[str]:
        return kernel.get("targets") or self.defaults.get("targets") or list(DEFAULT_TARGETS)

    def override_targets(self) -> Iterator[Diagnostic]:
        for name, kernel in self.kernels.items():
            targets = self._targets(kernel)
            for target in kernel.get("overrides", {}):
                if target not in targets:
                    yield self.at(
                        f"override for {target}, which kernel {name!r} does not target",
                        ("kernels", name, "overrides", target),
                        key=True,
                        expected="one of the kernel's targets: " + ", ".join(targets),
                        hint=f"add {target} to the targets, or remove this override",
                    )

    def lnc_on_trn1(self) -> Iterator[Diagnostic]:
        offenders: dict[JsonPath, list[str]] = defaultdict(list)
        for name, kernel in self.kernels.items():
            if "trn1" in self._targets(kernel):
                path, lnc = self._trn1_lnc(name, kernel)
                if lnc == 2:
                    offenders[path].append(name)
        for path, names in offenders.items():
            yield self.at(
                f"lnc 2 on trn1 (for {_kernels_phrase(names)})",
                path,
                expected="lnc auto or 1 on trn1",
                hint="trn1 supports only lnc 1 (neuronx-cc refuses lnc 2 there with NCC_EARG001): "
                "set lnc: 1 under overrides.trn1, or lnc: 2 only under overrides of trn2/trn3",
            )

    def _trn1_lnc(self, name: str, kernel: dict[str, Any]) -> tuple[JsonPath, object]:
        # The last layer that sets lnc decides: defaults < kernel < overrides.trn1.
        layers: list[tuple[JsonPath, dict[str, Any]]] = [
            (("defaults",), self.defaults),
            (("kernels", name), kernel),
            (("kernels", name, "overrides", "trn1"), kernel.get("overrides", {}).get("trn1", {})),
        ]
        setting: tuple[JsonPath, object] = ((), "auto")
        for path, layer in layers:
            # "auto" is stored as "not set" (None), so it inherits like an absent key.
            if layer.get("lnc", "auto") != "auto":
                setting = ((*path, "lnc"), layer["lnc"])
        return setting

    def deps(self) -> Iterator[Diagnostic]:
        for name, kernel in self.kernels.items():
            for index, pattern in enumerate(kernel.get("deps", [])):
                problem = _relative_path_problem(pattern, dotdot=False)
                if problem:
                    yield self.at(
                        problem,
                        ("kernels", name, "deps", index),
                        expected="a glob pattern relative to the manifest's directory",
                    )


def _is_distribution_name(name: str) -> bool:
    # JSON Schema's "$" also matches before a final newline; a name must not end in one.
    pattern = load_schema()["$defs"]["package"]["properties"]["name"]["pattern"]
    return re.fullmatch(pattern, name) is not None


def _kernels_phrase(names: Sequence[str]) -> str:
    listed = ", ".join(repr(n) for n in names)
    return f"kernel {listed}" if len(names) == 1 else f"kernels {listed}"


def _relative_path_problem(text: str, *, dotdot: bool = True) -> str | None:
    """Why `text` is not a path (or glob) inside the manifest's directory, or None.

    `dotdot`: whether ".." parts are allowed at all (as long as they stay inside).
    """
    if not text:
        return "the path is empty"
    if "\\" in text:
        return f"{_show(text)} contains '\\'; use '/' as the separator"
    if PurePosixPath(text).is_absolute() or PureWindowsPath(text).drive:
        return f"{_show(text)} is absolute"
    parts = PurePosixPath(text).parts
    if not dotdot and ".." in parts:
        return f"{_show(text)} contains '..'"
    normalized = normalize_path(text)
    if normalized == ".." or normalized.startswith("../"):
        return f"{_show(text)} points outside the manifest's directory"
    if "\0" in text:
        return f"{_show(text)} contains a NUL character"
    return None


def _existing_file_problem(root: Path, relative: str) -> tuple[str, str | None] | None:
    target = root / relative
    try:
        inside = target.resolve().is_relative_to(root.resolve())
        is_file = target.is_file()
        exists = is_file or target.exists()
    except (OSError, ValueError, RuntimeError):  # unrepresentable name, symlink loop
        return f"cannot access {_show(relative)}", None
    if not inside:
        return (
            f"{_show(relative)} leads outside the manifest's directory through a symlink",
            "copy the file into the project instead of linking to it",
        )
    if is_file:
        return None
    if exists:
        return f"{_show(relative)} is not a file", None
    return f"{_show(relative)} does not exist", _similar_file(root, relative)


def _similar_file(root: Path, relative: str) -> str | None:
    parent = posixpath.dirname(relative)
    try:
        siblings = [p.name for p in (root / parent).iterdir() if p.is_file()]
    except (OSError, ValueError):
        return None
    close = difflib.get_close_matches(posixpath.basename(relative), siblings, n=1)
    return f"did you mean {posixpath.join(parent, close[0])!r}?" if close else None
