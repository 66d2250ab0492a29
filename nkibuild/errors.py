"""Errors are values with a location; the CLI renders them once.

No stage prints: each raises one of these and `nkibuild.cli` turns it into
readable output and an exit code.
"""

from __future__ import annotations

import errno
import shlex
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from nkibuild.text import printable, printable_lines


@dataclass(frozen=True)
class Location:
    """A position in a source file, 1-based like editors show it."""

    file: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"


@dataclass(frozen=True)
class Diagnostic:
    """One problem found in user input."""

    message: str
    location: Location | None = None
    json_path: str | None = None
    expected: str | None = None
    hint: str | None = None
    severity: str = "error"  # or "warning": valid, but likely not what was meant

    def render(self) -> str:
        # Every part may quote the file (a key, a value, its path): none may drive the
        # terminal or start a line of its own.
        where = f"{printable(str(self.location))}: " if self.location else ""
        lines = [f"{where}{self.severity}: {printable(self.message)}"]
        if self.json_path:
            lines.append(f"  at: {printable(self.json_path)}")
        if self.expected:
            lines.append(f"  expected: {printable(self.expected)}")
        if self.hint:
            lines.append(f"  hint: {printable(self.hint)}")
        return "\n".join(lines)


class NkibuildError(Exception):
    """Base of every error nkibuild reports without a traceback."""

    exit_code = 1

    def render(self) -> str:
        """The message as the CLI prints it: lines nkibuild wrote kept, anything else
        that could drive a terminal (ESC, bidi overrides) escaped."""
        return printable_lines(str(self))


class UsageError(NkibuildError):
    """Bad command line or project layout (exit code 2)."""

    exit_code = 2


class ManifestError(NkibuildError):
    """The manifest is invalid; carries every diagnostic found, not only the first."""

    exit_code = 2

    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        super().__init__(self.render())

    def render(self) -> str:
        count = len(self.diagnostics)
        head = f"{count} problem{'s' if count != 1 else ''} in the manifest"
        return "\n".join([head, *(d.render() for d in self.diagnostics)])


class ToolchainError(NkibuildError):
    """A toolchain piece is missing or unusable (exit code 2: nothing was built)."""

    exit_code = 2


class BuildError(NkibuildError):
    """A build step failed; names the unit, the command and the tail of its log."""

    def __init__(
        self,
        message: str,
        *,
        unit: str | None = None,
        command: Sequence[str] | None = None,
        returncode: int | None = None,
        log_tail: str | None = None,
        log_path: str | None = None,
    ) -> None:
        self.message = message
        self.unit = unit
        self.command = tuple(command) if command else None
        self.returncode = returncode
        self.log_tail = log_tail
        self.log_path = log_path
        super().__init__(self.render())

    def render(self) -> str:
        message = printable_lines(self.message)
        lines = [f"{self.unit}: {message}" if self.unit else message]
        if self.command:
            lines.append(f"  command: {printable(shlex.join(self.command))}")
        if self.returncode is not None:
            lines.append(f"  exit status: {describe_returncode(self.returncode)}")
        if self.log_path:
            lines.append(f"  full log: {printable(self.log_path)}")
        if self.log_tail:  # a compiler's or user code's output: colours and all
            lines.append("  log tail:")
            tail_lines = self.log_tail.rstrip("\n").split("\n")
            lines.extend("    " + printable_lines(line.rstrip("\r")) for line in tail_lines)
        return "\n".join(lines)


class StorageError(NkibuildError):
    """The machine refused a file operation: disk full, read-only, no permission."""

    def __init__(self, error: OSError) -> None:
        path = refused_path(error)
        where = f"{printable(path)}: " if path else ""
        super().__init__(f"{where}{error.strerror}{_STORAGE_HINTS[error.errno]}")


_STORAGE_HINTS = {
    errno.ENOSPC: " (free some space; nothing half-written was kept, so rerun the build)",
    errno.EDQUOT: " (over the disk quota; nothing half-written was kept, so rerun the build)",
    errno.EFBIG: " (over the file size limit)",
    errno.EROFS: " (choose a writable --build-dir/--dist-dir, or --cache-read-only for a cache)",
    errno.EACCES: "",
    errno.EPERM: "",
}


_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def refused_path(error: OSError) -> str | None:
    """The file the machine refused: for a copy (two filenames) that failed to write,
    the destination, not the source that shutil names first."""
    if error.filename2 is not None and error.errno in _WRITE_ERRNOS:
        return str(error.filename2)
    return None if error.filename is None else str(error.filename)


def describe_os_error(error: OSError) -> str:
    refused = storage_error(error)
    return refused.render() if refused is not None else str(error)


def storage_error(error: OSError) -> StorageError | None:
    """The user-facing form of an OSError that says the machine refused, not that
    nkibuild has a bug; None for any other OSError (whose traceback stays)."""
    return StorageError(error) if error.errno in _STORAGE_HINTS else None


def describe_returncode(returncode: int) -> str:
    """Say what a subprocess return code means, naming signals."""
    if returncode >= 0:
        return str(returncode)
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = " (likely the out-of-memory killer)" if name == "SIGKILL" else ""
    return f"killed by {name}{hint}"


LOG_TAIL_LINES = 30


def tail(text: str, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a log: what a failure message shows."""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])
