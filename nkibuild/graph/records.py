"""What each extraction last ran with, kept in the build's state dir for `nkibuild explain`.

doit stores only digests of what it checks; these records keep the values, so a
rebuild can be explained in terms of the input that changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from nkibuild.cache import file_sha256
from nkibuild.fsutil import atomic_write_text

RECORDS_DIR = "records"


def file_hashes(root: Path, files: list[str]) -> dict[str, str | None]:
    """sha256 of each file by its path relative to the project (None: missing)."""
    hashes: dict[str, str | None] = {}
    for file in files:
        relative = Path(os.path.relpath(file, root)).as_posix()
        try:
            hashes[relative] = file_sha256(Path(file))
        except OSError:
            hashes[relative] = None
    return hashes


def write_extract_record(
    state_dir: Path, name: str, config: dict[str, Any], root: Path, files: list[str]
) -> None:
    record = {"config": config, "files": file_hashes(root, files)}
    # One line (json's C encoder does not indent), not durable: `explain` is its only reader.
    text = json.dumps(record, sort_keys=True)
    atomic_write_text(extract_record_path(state_dir, name), text, durable=False)


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in `path`; None if it is missing, unreadable or not an object."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def extract_record_path(state_dir: Path, name: str) -> Path:
    # Extraction names are validated identifiers joined by "/": safe as a relative path.
    return state_dir / RECORDS_DIR / "extract" / f"{name}.json"
