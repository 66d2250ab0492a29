"""Pickles of plain data, read without running code.

Some of nkibuild's bookkeeping in the build directory is pickled: it is written and
read again on every build of 10,000 units, where pickle is several times faster than
JSON. A build directory may come from elsewhere (a restored CI cache, an unpacked
artifact), and unpickling calls whatever a crafted file names. These files hold only
dicts, lists, tuples, sets, strings, bytes, numbers, booleans and None, which pickle
writes without naming any class or function, so reading refuses every name. A file
of typed records (the plan cache's dataclasses) is read allowing exactly its classes
(`load(..., classes=...)`): dataclasses, whose construction only sets fields.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Collection
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
        return PlainUnpickler(stream, classes).load()
    except Exception as error:  # damaged bytes make the unpickler raise many kinds
        raise ValueError(f"not a pickle of plain data: {error}") from error


def loads(data: bytes, classes: Collection[type] = ()) -> Any:
    return load(io.BytesIO(data), classes)
