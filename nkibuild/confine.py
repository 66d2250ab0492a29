"""What a build may read: regular files inside the project (or an allowed directory).

One check for every place that reads or copies a file the project names (kernel
sources, references, `deps` globs, the sdist, files an HLO module refers to): a
path is followed through every symlink to the file it really is, and that file must
be a regular file under one of the allowed roots. A symlink under the project that
leads to `~/.ssh/id_rsa` or `/proc/self/environ` is refused with the path and the
reason, never read.

Below that check, `open_regular`/`read_regular` are how nkibuild opens any file that a
user or another machine supplied (project files, NEFFs, HLO modules, wheels,
statements, the manifest, a verify run's results): never blocking on a FIFO, only a
regular file, never more than a stated number of bytes.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import glob
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Literal, NamedTuple

from nkibuild.errors import NkibuildError
from nkibuild.text import printable

# A project file read whole (a source, a reference, a prebuilt HLO module: protobuf's
# 2 GiB limit); a larger one is refused, not loaded into memory.
MAX_PROJECT_FILE_BYTES = (2 << 30) - 1


class OutsideProject(NkibuildError):
    """A file the project names is outside it, or not a regular file (exit code 2)."""

    exit_code = 2

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = reason
        super().__init__(f"{printable(self.path)}: {reason}")


def _under(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


class Problem(NamedTuple):
    """Why a path may not be read: `kind` for callers that phrase it their own way."""

    kind: Literal["missing", "unreadable", "outside", "not-regular"]
    reason: str

    def __str__(self) -> str:
        return self.reason


def file_problem(
    path: str | os.PathLike[str], roots: Sequence[str | os.PathLike[str]]
) -> Problem | None:
    """Why `path` may not be read as a project file, or None: it does not exist, it
    leads outside `roots` (through a symlink or as an absolute path), or it is not a
    regular file (a directory, FIFO, device or socket)."""
    try:
        real = os.path.realpath(path, strict=True)
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return Problem("missing", "does not exist")
    except (OSError, ValueError, RuntimeError) as error:  # a loop, a NUL, no permission
        return Problem(
            "unreadable", f"cannot be accessed ({getattr(error, 'strerror', None) or error})"
        )
    if not any(_under(real, os.path.realpath(root)) for root in roots):
        return Problem("outside", _outside(path, real, roots))
    if not stat.S_ISREG(mode):
        return Problem("not-regular", "is not a regular file")
    return None


def confined_stats(
    paths: Sequence[str | os.PathLike[str]], roots: Sequence[str | os.PathLike[str]]
) -> list[os.stat_result] | None:
    stats = []
    for path in paths:
        if file_problem(path, roots) is not None:
            return None
        try:
            stats.append(os.stat(path))
        except OSError:
            return None
    return stats


def _outside(
    path: str | os.PathLike[str], real: str, roots: Sequence[str | os.PathLike[str]]
) -> str:
    shown = ", ".join(printable(os.fspath(root)) for root in roots)
    written = os.path.normpath(os.path.abspath(path))
    if any(_under(written, os.path.normpath(os.path.abspath(root))) for root in roots):
        return (
            f"leads outside the project through a symlink (to {printable(real)}; allowed: {shown})"
        )
    return f"is outside the project (allowed: {shown})"


def read_confined(
    path: str | os.PathLike[str],
    roots: Sequence[str | os.PathLike[str]],
    max_bytes: int = MAX_PROJECT_FILE_BYTES,
) -> bytes:
    """The bytes of a regular file inside `roots`. The file is opened at its resolved
    path without following a symlink there, and checked again through the open
    descriptor, so one swapped in after the check is not read either."""
    problem = file_problem(path, roots)
    if problem is not None:
        raise OutsideProject(path, problem.reason)
    try:
        return read_regular(os.path.realpath(path), max_bytes, follow=False)
    except UnreadableFile as error:
        raise OutsideProject(path, f"is {error.strerror}") from None
    except OSError as error:
        raise OutsideProject(path, f"cannot be read ({error.strerror})") from None


class UnreadableFile(OSError):
    """A file refused by `open_regular`: not a regular file, a symlink where none may be,
    or past the reader's size bound. An OSError, so "cannot read" paths handle it too."""

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        super().__init__(reason)
        self.filename, self.strerror = os.fspath(path), reason

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


@contextlib.contextmanager
def open_regular(
    path: str | os.PathLike[str], max_bytes: int, *, follow: bool = True
) -> Iterator[BinaryIO]:
    """The one way nkibuild opens a file someone else supplied (a NEFF, an HLO module, a
    statement, a wheel, a manifest, a report): O_NONBLOCK, so a FIFO cannot hang the
    open; fstat, so only a regular file of at most `max_bytes` is read (no /dev/zero, no
    10 GiB sparse file); with `follow=False`, O_NOFOLLOW refuses a symlink in the last
    component. Other OSErrors (missing, no permission) are raised as they are."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as error:
        if error.errno == errno.ELOOP and not follow:
            raise UnreadableFile(path, "a symbolic link (not followed)") from None
        raise
    status = os.fstat(fd)  # before fdopen, which refuses a directory in its own words
    if not stat.S_ISREG(status.st_mode) or status.st_size > max_bytes:
        os.close(fd)
        if not stat.S_ISREG(status.st_mode):
            raise UnreadableFile(path, f"not a regular file ({file_kind(status.st_mode)})")
        raise UnreadableFile(path, f"{status.st_size} bytes, more than the {max_bytes} allowed")
    with os.fdopen(fd, "rb") as handle:
        yield handle


def read_regular(path: str | os.PathLike[str], max_bytes: int, *, follow: bool = True) -> bytes:
    """The bytes of `path` through `open_regular`; a file that grows past the bound while
    it is read is refused too (fstat's size was only a first answer)."""
    with open_regular(path, max_bytes, follow=follow) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnreadableFile(path, f"more than the {max_bytes} bytes allowed")
    return data


def file_kind(mode: int) -> str:
    kinds = {"d": "a directory", "p": "a FIFO", "s": "a socket"}
    kinds |= {"c": "a character device", "b": "a block device"}
    return kinds.get(stat.filemode(mode)[0], "not a plain file")


def glob_files(root: Path, pattern: str) -> list[Path]:
    """Regular files under `root` that `pattern` matches, as `glob.glob(root/pattern,
    recursive=True)` would list them (`**` for any depth, hidden names only when the
    pattern spells their dot), sorted.

    Unlike glob, `root` is never parsed as a pattern (a project in `proj[1]/` works),
    a directory is entered only if it really lies inside `root` and not again below
    itself (a symlink loop ends the walk, not the build), and a match that leads
    outside `root` raises OutsideProject instead of being read."""
    real_root = os.path.realpath(root)
    parts = [part for part in pattern.split("/") if part not in ("", ".")]
    found: set[str] = set()
    if parts:
        _walk(os.fspath(root), parts, real_root, frozenset({real_root}), found)
    return sorted(Path(path) for path in found)


def _walk(
    directory: str, parts: list[str], real_root: str, chain: frozenset[str], found: set[str]
) -> None:
    head, rest = parts[0], parts[1:]
    any_depth = head == "**"
    if any_depth and rest:
        _walk(directory, rest, real_root, chain, found)  # `**` as zero directories
    for name in _names(directory, "*" if any_depth else head):
        path = os.path.join(directory, name)
        if not rest:
            _take(path, real_root, found)
        if any_depth or rest:  # `**` goes on below, with itself still first
            _enter(path, parts if any_depth else rest, real_root, chain, found)


def _names(directory: str, part: str) -> list[str]:
    """Entries of `directory` that one pattern segment matches (glob's rules)."""
    if not glob.has_magic(part):
        return [part] if os.path.lexists(os.path.join(directory, part)) else []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    hidden = part.startswith(".")
    return [n for n in names if (hidden or not n.startswith(".")) and fnmatch.fnmatchcase(n, part)]


def _enter(
    path: str, parts: list[str], real_root: str, chain: frozenset[str], found: set[str]
) -> None:
    real = os.path.realpath(path)
    if not os.path.isdir(real) or real in chain:  # a file, or a loop back up: not entered
        return
    if not _under(real, real_root):  # what is below it would match: refuse, don't skip
        raise OutsideProject(path, _outside(path, real, (real_root,)))
    _walk(path, parts, real_root, chain | {real}, found)


def _take(path: str, real_root: str, found: set[str]) -> None:
    problem = file_problem(path, (real_root,))
    if problem is None:
        found.add(path)
    elif problem.kind == "outside":
        raise OutsideProject(path, problem.reason)
