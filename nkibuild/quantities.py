"""Sizes and durations as people write them (`16G`, `512MiB`, `90s`, `2h`)."""

from __future__ import annotations

import re

SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Also the JSON Schema patterns of the manifest (schemas/nkibuild.schema.json).
SIZE_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:i?B)?\s*$"
DURATION_PATTERN = r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$"


def parse_size(text: str | int) -> int:
    """Bytes in `20G`, `500M`, `1.5TiB`, `64GB` or a plain byte count (powers of 1024)."""
    if isinstance(text, int):
        return text
    match = re.match(SIZE_PATTERN, text, re.IGNORECASE)
    if match is None:
        raise ValueError(f"{text!r} is not a size such as 16G, 512M, 1.5TiB or 1000000")
    return int(float(match[1]) * SIZE_UNITS[match[2].upper()])


def parse_duration(text: str | float) -> float:
    """Seconds in `90`, `90s`, `30m`, `2h` or `1d`."""
    if isinstance(text, int | float):
        return float(text)
    match = re.match(DURATION_PATTERN, text)
    if match is None:
        raise ValueError(f"{text!r} is not a duration such as 90s, 30m or 2h")
    return float(match[1]) * DURATION_UNITS[match[2]]


def format_size(count: float) -> str:
    if count < 1024:
        return f"{count:.0f} B"
    for unit in ("KiB", "MiB"):
        count /= 1024
        if count < 1024:
            return f"{count:.1f} {unit}"
    return f"{count / 1024:.1f} GiB"
