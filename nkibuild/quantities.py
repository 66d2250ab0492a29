"""Sizes, durations and counts as people write them (`16G`, `512MiB`, `90s`, `2h`, `3`)."""

from __future__ import annotations

import math
import re

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Also the JSON Schema patterns of the manifest (schemas/nkibuild.schema.json).
SIZE_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*$"
DURATION_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$"


# Bounds that no real setting comes near, so a typo of 400 digits is an error, not an
# overflow somewhere later (an int too large for a C long, a wait of 1e300 seconds).
MAX_SIZE = 1 << 60  # 1 EiB
MAX_DURATION_S = 366 * 86400.0  # a year
MAX_COMPILE_RETRIES = 10


def parse_size(text: str | int) -> int:
    """Bytes in `20G`, `500M`, `1.5TiB`, `64GB` or a plain byte count (powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return _bounded_size(text, _shown(text))
    match = re.match(SIZE_PATTERN, text, re.IGNORECASE) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{_shown(text)} is not a size such as 16G, 512M, 1.5TiB or 1000000")
    number, unit = _number(match[1]), SIZE_UNITS[match[2].upper()]
    return _bounded_size(number * unit, _shown(text))


def _bounded_size(count: float, shown: str) -> int:
    if count < 0:
        raise ValueError(f"{shown} is negative")
    if not count <= MAX_SIZE:
        raise ValueError(f"{shown} is larger than 1 EiB, more than any machine has")
    return int(count)


def parse_duration(text: str | float) -> float:
    """Seconds in `90`, `90s`, `30m`, `2h` or `1d`."""
    if isinstance(text, int | float) and not isinstance(text, bool):
        return _bounded_duration(_float(text), _shown(text))
    match = re.match(DURATION_PATTERN, text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{_shown(text)} is not a duration such as 90s, 30m or 2h")
    return _bounded_duration(_number(match[1]) * DURATION_UNITS[match[2]], _shown(text))


def _bounded_duration(seconds: float, shown: str) -> float:
    if math.isnan(seconds):
        raise ValueError(f"{shown} is not a number")
    if math.isinf(seconds) and shown in ("inf", "-inf"):
        raise ValueError(f"{shown} is not a finite duration")
    if seconds < 0:
        raise ValueError(f"{shown} is negative")
    if seconds > MAX_DURATION_S:
        raise ValueError(f"{shown} is longer than a year")
    return seconds


def _float(value: float) -> float:
    """A number as a float; an int too large for one (400 digits) as infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _number(digits: str) -> float:
    """The pattern's `123.45` as a float; inf for one too long to be one (never raises)."""
    return float(digits) if len(digits) <= 300 else math.inf


def parse_retries(text: str) -> int:
    """A retry count: a whole number from 0 to MAX_COMPILE_RETRIES."""
    try:
        count = int(text.strip())
    except ValueError:
        raise ValueError(f"expected a whole number of retries, not {text!r}") from None
    if not 0 <= count <= MAX_COMPILE_RETRIES:
        raise ValueError(f"expected 0 to {MAX_COMPILE_RETRIES} retries, not {count}")
    return count


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def format_size(count: float) -> str:
    if count < 1024:
        return f"{count:.0f} B"
    for unit in ("KiB", "MiB"):
        count /= 1024
        if count < 1024:
            return f"{count:.1f} {unit}"
    return f"{count / 1024:.1f} GiB"
