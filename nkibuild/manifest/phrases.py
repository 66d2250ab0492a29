"""Human phrases for diagnostics and docs: what a schema accepts, a user's value quoted back."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nkibuild.dtypes import OTHER_SPELLINGS
from nkibuild.errors import Diagnostic
from nkibuild.manifest.schemagen import inline_ref

MAX_SHOWN = 60  # characters of a user's value quoted back in a message


def position(d: Diagnostic) -> tuple[int, int]:
    """Sort key of diagnostics: document order."""
    return (d.location.line, d.location.column) if d.location else (0, 0)


def did_you_mean(word: str, choices: Sequence[str]) -> str | None:
    spelled = OTHER_SPELLINGS.get(word.lower())  # fp32: too unlike float32 for difflib
    if spelled in choices:
        return f"did you mean {spelled!r}?"
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:
        # "auto_cast" for "auto-cast": compare with separators and case ignored too
        fold = {_fold(c): c for c in choices}
        close = [fold[_fold(word)]] if _fold(word) in fold else []
    return f"did you mean {close[0]!r}?" if close else None


def _fold(word: str) -> str:
    return word.lower().replace("_", "").replace("-", "")


def describe(
    schema: Mapping[str, Any] | bool, depth: int = 0, code: Callable[[str], str] = str
) -> str:
    """What a schema accepts, in words: "one of trn1, trn2, trn3", "an integer >= 1";
    `code` formats literal values and patterns (the docs put them in backticks)."""
    schema = inline_ref(schema)
    if "const" in schema:
        return f"exactly {code(plain(schema['const']))}"
    if "enum" in schema:
        return "one of " + ", ".join(code(plain(v)) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _join_or([_titled(sub, depth + 1, code) for sub in schema[key]])
    phrases = [_type_phrase(t, schema, depth, code) for t in types_of(schema)]
    return _join_or(phrases) if phrases else "any value"


def _titled(schema: Mapping[str, Any], depth: int, code: Callable[[str], str]) -> str:
    title = inline_ref(schema).get("title")
    phrase = describe(schema, depth, code)
    return f"{phrase} ({title})" if title else phrase


def types_of(schema: Mapping[str, Any]) -> list[str]:
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


def plain(value: object) -> str:
    """A value as YAML would spell it unquoted (an empty string quoted)."""
    return value if isinstance(value, str) and value else json.dumps(value)


def show(value: object) -> str:
    """A user's value quoted back, escaped (no control characters) and shortened."""
    text = repr(value) if isinstance(value, str) else _plain_repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def _plain_repr(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=True)
    except (TypeError, ValueError):
        return repr(value)


_KIND_NAMES = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string"}


def kind_name(value: object) -> str:
    """What YAML read `value` as (the loader makes these types and dicts only)."""
    return _KIND_NAMES.get(type(value)) or ("list" if isinstance(value, list) else "mapping")


def kind(value: object) -> str:
    name = kind_name(value)
    if isinstance(value, dict | list) or value is None:
        return f"got {'an' if name[0] in 'aeiou' else 'a'} {name}"
    return f"got a {name} ({show(value)})"
