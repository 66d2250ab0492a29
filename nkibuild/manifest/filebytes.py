"""The manifest file's bytes, read before YAML is even imported: a first build forks
its manifest check before parsing (manifest/__init__.py), and both processes parse."""

from __future__ import annotations

import os

from nkibuild.errors import Diagnostic, Location, ManifestError

MAX_BYTES = 1 << 20


def read_manifest_bytes(path: str | os.PathLike[str], file: str) -> bytes:
    """The bytes of the manifest at `path`; `file` names it in the errors."""
    try:
        with open(path, "rb") as stream:
            raw = stream.read(MAX_BYTES + 1)
    except OSError as error:
        raise fatal(file, f"cannot read the manifest: {error.strerror or error}") from None
    if len(raw) > MAX_BYTES:
        raise fatal(file, f"the manifest is larger than {MAX_BYTES // 1024} KiB")
    return raw


def fatal(file: str, message: str, hint: str | None = None) -> ManifestError:
    """A problem of the whole file (reported at its first line)."""
    return ManifestError([Diagnostic(message, Location(file, 1, 1), hint=hint)])
