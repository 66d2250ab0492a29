"""Pickles read without running code, for the plan cache (nkibuild.plan).

A build directory may come from elsewhere (a restored CI cache, an unpacked
artifact), and unpickling calls whatever a crafted file names. A file of typed records
(the plan cache's dataclasses) is read allowing exactly its classes
(`loads(..., classes=...)`): dataclasses, whose construction only sets fields; plain
data (dicts, lists, tuples, strings, numbers...) names no class or function at all.
"""

from __future__ import annotations

import contextlib
import gc
import io
import pickle
from collections.abc import Collection, Iterator
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


def loads(data: bytes, classes: Collection[type] = ()) -> Any:
    """The value `data` holds; ValueError if it is not a whole pickle of plain data and
    instances of `classes` (cut short, damaged, or naming anything else)."""
    try:
        with _no_collections():
            return PlainUnpickler(io.BytesIO(data), classes).load()
    except Exception as error:  # damaged bytes make the unpickler raise many kinds
        raise ValueError(f"not a pickle of plain data: {error}") from error


@contextlib.contextmanager
def _no_collections() -> Iterator[None]:
    """The garbage collector held back while a value is unpickled: the hundreds of
    thousands of containers a 10,000-unit plan cache holds would set off collections
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
