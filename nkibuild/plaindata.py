"""Pickles of plain data, read without running code.

Some of nkibuild's bookkeeping in the build directory is pickled: it is written and
read again on every build of 10,000 units, where pickle is several times faster than
JSON. A build directory may come from elsewhere (a restored CI cache, an unpacked
artifact), and unpickling calls whatever a crafted file names. These files hold only
dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None, which pickle
writes without naming any class or function, so reading refuses every name. A file
of typed records (the plan cache's dataclasses) is read allowing exactly its classes
(`load(..., classes=...)`): dataclasses, whose construction only sets fields.

A file rewritten whole after every build that changed a little of it (a 10,000-unit
build's up-to-date proof or bundle memo: megabytes) can instead be a snapshot with the
changes appended after it (`records`, `append`): a load stops at a change cut short
(a build killed while appending), and the next save writes the file whole again.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import pickle
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

PROTOCOL = 5


class PlainUnpickler(pickle.Unpickler):
    def __init__(self, stream: IO[bytes], classes: Collection[type]) -> None:
        super().__init__(stream)
        self.classes = {(cls.__module__, cls.__qualname__): cls for cls in classes}

    def find_class(self, module: str, name: str) -> Any:
        found = self.classes.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"{module}.{name} named in a file of plain data")
        return found


def dumps(value: Any) -> bytes:
    return pickle.dumps(value, protocol=PROTOCOL)


def load(stream: IO[bytes], classes: Collection[type] = ()) -> Any:
    """The next value in `stream`; ValueError if it is not a whole pickle of plain data
    and instances of `classes` (cut short, damaged, or naming anything else)."""
    try:
        with _no_collections():
            return PlainUnpickler(stream, classes).load()
    except Exception as error:  # damaged bytes make the unpickler raise many kinds
        raise ValueError(f"not a pickle of plain data: {error}") from error


@contextlib.contextmanager
def _no_collections() -> Iterator[None]:
    """The garbage collector held back while a value is unpickled: the hundreds of
    thousands of containers a 10,000-unit memo or proof holds would set off collections
    that find nothing to free (all of it is reachable until the load ends). Resumed
    after, unless it was off already (in this thread or another: then left to whoever
    turned it off)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def loads(data: bytes, classes: Collection[type] = ()) -> Any:
    return load(io.BytesIO(data), classes)


def records(
    stream: IO[bytes], size: int, classes: Collection[type] = ()
) -> Iterator[tuple[Any, int]]:
    """Each value pickled one after the other in `stream` (of `size` bytes), with the
    offset after it; stops at the first that is cut short or damaged (what follows it is
    not trusted). Read from the stream as unpickled: a file of megabytes is not copied
    into memory first (a fresh process pays a page fault for each page of a copy)."""
    while stream.tell() < size:
        try:
            value = load(stream, classes)
        except ValueError:
            return
        yield value, stream.tell()


def read_records(path: Path, classes: Collection[type] = ()) -> Iterator[tuple[Any, int]]:
    """`records` of the file at `path`; OSError if it cannot be opened."""
    with open(path, "rb") as stream:
        yield from records(stream, os.fstat(stream.fileno()).st_size, classes)


def append(path: Path, read: int, snapshot: int, change: bytes) -> bool:
    """Append `change` to the file that was read as `read` bytes whole (a snapshot of
    `snapshot` bytes and the changes after it); False, with nothing written, if the file
    is not that length any more (appending to other bytes would hide the change), or if
    the changes would outgrow the snapshot (each costs every later load its time)."""
    if not read or read + len(change) > 2 * snapshot:
        return False
    with open(path, "ab") as handle:
        if handle.tell() != read:
            return False
        handle.write(change)
    return True


def only(values: Iterable[object], *types: type) -> bool:
    """Whether every value is of one of `types` exactly (no subclass: True is no int)."""
    return set(map(type, values)) <= set(types)


def all_strings(values: Iterable[object]) -> bool:
    """Whether every one of `values` is a string, in one call (not a loop of checks)."""
    try:
        "".join(values)  # type: ignore[arg-type]  # checking is the point
    except TypeError:
        return False
    return True
