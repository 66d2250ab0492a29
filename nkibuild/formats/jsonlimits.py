"""JSON from untrusted files, with bounds: size, nesting depth, integer length, non-numbers.

`json.loads` alone turns a deeply nested document into a RecursionError (not a
ValueError), accepts 4,300-digit integers and `NaN`, and a recursive walker run on
what it returns can still blow the stack. Every reader of JSON that a file or a
cache entry supplies goes through `load_json`, which raises only `JsonLimitError`
(a ValueError) for anything it refuses.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from typing import Any


class JsonLimitError(ValueError):
    """The text is not JSON, or is JSON beyond the bounds given."""


class JsonSyntaxError(JsonLimitError):
    """The text is not JSON at all (as opposed to JSON beyond a bound)."""


@dataclass(frozen=True)
class JsonLimits:
    max_bytes: int = 64 << 20
    max_depth: int = 64  # containers inside containers; real metadata nests < 10
    max_int_digits: int = 40  # beyond any 128-bit value; a guard against bignum work
    allow_nonfinite: bool = True  # NaN / Infinity (Python's json accepts them)


def load_json(data: bytes | str, limits: JsonLimits = JsonLimits()) -> Any:
    """Parse `data`; raise JsonLimitError (never RecursionError, never OverflowError)."""
    if len(data) > limits.max_bytes:
        raise JsonLimitError(f"{len(data)} bytes long, more than the {limits.max_bytes} allowed")
    # json's own float and constants (NaN, Infinity) unless non-numbers are refused.
    finite = {} if limits.allow_nonfinite else {"parse_float": _finite, "parse_constant": _nan}
    try:
        value = json.loads(data, parse_int=partial(_int, limits.max_int_digits), **finite)
    except JsonLimitError:
        raise
    except RecursionError:
        raise JsonLimitError(f"nested more than {limits.max_depth} levels deep") from None
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        raise JsonSyntaxError(str(error)) from None
    check_depth(value, limits.max_depth)
    return value


def check_depth(value: Any, max_depth: int) -> None:
    """Iteratively (so a deep value cannot exhaust the stack here either)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise JsonLimitError(f"nested more than {max_depth} levels deep")
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


def _int(max_digits: int, text: str) -> int:
    if len(text.lstrip("-")) > max_digits:
        raise JsonLimitError(f"holding an integer of {len(text)} digits (at most {max_digits})")
    return int(text)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise JsonLimitError(f"holding {text[:40]}, out of range")
    return value


def _nan(name: str) -> float:
    raise JsonLimitError(f"holding {name}, not a number")
