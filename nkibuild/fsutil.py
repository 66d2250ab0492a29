"""Atomic file writes: a killed build never leaves a half-written file behind."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from nkibuild.errors import refused_path, storage_error

# The names of the temp files and dirs nkibuild writes through (a killed writer leaves
# them): tempfile's 8 random characters between nkibuild's fixed prefixes and suffixes
# (atomic_output, bundle.tree, compiler work dirs, worker scratch dirs). Exact, so a
# user's `.notes.tmp` or `.work-in-progress` is never taken for one.
LEFTOVER_PATTERNS = re.compile(r"\..+\.[a-z0-9_]{8}\.(?:tmp|new)|\.work(?:er)?-[a-z0-9_]{8}")


def stamp_of(info: os.stat_result) -> str:
    """Size, mtime, ctime and inode as one string: what changes whenever a file is
    written or replaced (ctime cannot be set back; a rename brings another inode)."""
    return f"{info.st_size} {info.st_mtime_ns} {info.st_ctime_ns} {info.st_ino}"


def stamp_ctime_ns(stamp: str) -> int:
    return int(stamp.split(" ")[2])


def stat_stamp(path: str | os.PathLike[str]) -> str | None:
    try:
        return stamp_of(os.stat(path))
    except (OSError, ValueError):  # ValueError: a NUL in the path (a damaged record's)
        return None


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> None:
    """`atomic_output` for bytes in hand, written through the temp file's own descriptor."""
    with reported_at(path):
        fd, tmp = _temp_file_beside(path)
        try:
            with open(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fchmod(fd, new_file_mode())  # mkstemp's 0o600, as open() would make it
                if durable:
                    os.fsync(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _temp_file_beside(path: Path) -> tuple[int, str]:
    """A new temp file in `path`'s directory, made first if it is missing."""
    try:
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)


def atomic_write_text(path: Path, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


@functools.cache  # nkibuild never changes its umask: read once, not at every write
def process_umask() -> int:
    """The umask, read from /proc where it can be (setting it to learn it races other
    threads creating files). Outputs get the modes open() and mkdir() would give them."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    return 0o666 & ~process_umask()


@contextlib.contextmanager
def atomic_output(path: Path, *, durable: bool = True) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it over `path` only if the block succeeds.

    The rename alone makes the write atomic for a killed process. `durable` adds an
    fsync so it also survives a power loss; files only ever read as hints (and
    checked when read) skip that cost.
    """
    with reported_at(path):
        fd, name = _temp_file_beside(path)
        os.close(fd)
        tmp = Path(name)
        try:
            yield tmp
            os.chmod(tmp, new_file_mode())  # mkstemp's 0o600, as open() would have made it
            if durable:
                with open(tmp, "rb+") as handle:
                    os.fsync(handle.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def reported_at(path: Path) -> Iterator[None]:
    """Name `path` in a storage error (disk full, read-only) about one of its temp files
    or about no file at all: "dist/x.whl: No space left on device" says what could not
    be written."""
    try:
        yield
    except OSError as error:
        if storage_error(error) is None:
            raise  # not the disk's refusal: keep the error as it is
        refused = refused_path(error)
        temp_prefix = str(path.parent / f".{path.name}.")  # atomic_output's, bundle.tree's
        if refused is None or refused.startswith(temp_prefix):
            raise OSError(error.errno, error.strerror, str(path)) from error
        raise


def atomic_copy(source: Path, destination: Path, *, durable: bool = True) -> None:
    with atomic_output(destination, durable=durable) as tmp:
        shutil.copyfile(source, tmp)


def leftovers(
    root: Path, pattern: re.Pattern[str], *, since: int = 0, recursive: bool = True
) -> list[Path]:
    """Entries under `root` whose names match `pattern` and whose ctime is not before
    `since` (ns); matching dirs are not entered, symlinked dirs never."""
    found = []
    for directory, dirs, files in os.walk(root):
        matched = {n for n in (*dirs, *files) if pattern.fullmatch(n)}
        found += [p for n in sorted(matched) if _changed_since(p := Path(directory, n), since)]
        dirs[:] = [d for d in dirs if d not in matched] if recursive else []
    return found


def _changed_since(path: Path, since: int) -> bool:
    try:
        return os.lstat(path).st_ctime_ns >= since
    except OSError:
        return False
