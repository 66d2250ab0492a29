"""nkibuild toolchain double: fake `nkipy.core.trace.NKIPyKernel`.

nkipy kernels are NumPy functions: `specialize` runs the function on sample arrays to
learn its outputs, then describes the signature as an HLO module named as the real
tracer names it (`../shared/testdata/hlo/nkipy/`): parameters by their Python names,
float64 and int64 inputs traced as float32 and int32, an input the kernel writes into
renamed `<name>.must_alias_input` and returned as an extra output aliased to it.

The real tracer's module holds the computation: it changes when the kernel's body, a
helper it calls or a constant changes, and not when only a comment does. The double
records instead a digest of the code the kernel runs (bytecode, names and literals, not
comments or file paths) and each non-array argument's value (defaults included), with the
kernel's file and line in every instruction's metadata as the real tracer writes them.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sysconfig
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from nkibuild.toolchain_double.hlo_writer import Origin, build_hlo_module

# What the real tracer narrows 64-bit inputs to (it warns when it does).
_TRACED_AS = {"float64": np.dtype(np.float32), "int64": np.dtype(np.int32)}
# The suffix of a parameter the kernel writes into, as the real tracer names it.
WRITTEN_SUFFIX = ".must_alias_input"


class _Code:
    """The traced module, as `kernel._code.to_proto().SerializeToString()` reads it."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def to_proto(self) -> _Code:
        return self

    def SerializeToString(self) -> bytes:
        return self._data


class NKIPyKernel:
    def __init__(self, fn: Callable[..., Any], backend: str) -> None:
        self.fn = fn
        self.backend = backend
        self._code: _Code | None = None

    @classmethod
    def trace(cls, fn: Callable[..., Any], backend: str = "hlo") -> NKIPyKernel:
        return cls(fn, backend)

    def specialize(self, *args: Any, **kwargs: Any) -> NKIPyKernel:
        bound = inspect.signature(self.fn).bind(*args, **kwargs)
        bound.apply_defaults()  # the real tracer bakes a default's value in as well
        arrays = {k: _traced(k, v) for k, v in bound.arguments.items() if isinstance(v, np.ndarray)}
        constants = tuple(
            (name, _as_json(value)) for name, value in bound.arguments.items() if name not in arrays
        )
        from .nki_op import recording  # relative: also loaded under nkibuild.toolchain_double

        # Nonzero values of each array's dtype and shape, so that a write into it shows.
        samples = {
            n: np.random.default_rng(0).uniform(1, 100, a.shape).astype(a.dtype)
            for n, a in arrays.items()
        }
        bound.arguments.update({name: sample.copy() for name, sample in samples.items()})
        with recording() as nki_calls:  # an NKI kernel's custom-call becomes the root
            result = self.fn(*bound.args, **bound.kwargs)
        returned = result if isinstance(result, tuple) else (result,)
        # An input whose bytes changed was written into (a write of the values it already
        # held goes unseen: random samples make that unlikely).
        written = [n for n in arrays if bound.arguments[n].tobytes() != samples[n].tobytes()]
        outputs = [*map(np.asarray, returned), *(bound.arguments[n] for n in written)]
        kernel = inspect.unwrap(self.fn)  # a decorated kernel's own code
        origin = Origin(
            source_file=os.path.realpath(kernel.__code__.co_filename),
            source_line=kernel.__code__.co_firstlineno,
            code_digest=code_digest(kernel),
            constants=constants,
            output_names=(*(f"output{i}" for i in range(len(returned))), *written),
            aliases=tuple(
                (len(returned) + i, list(arrays).index(n)) for i, n in enumerate(written)
            ),
        )
        module = build_hlo_module(
            self.fn.__name__,
            [
                (n + WRITTEN_SUFFIX * (n in written), a.dtype.name, a.shape)
                for n, a in arrays.items()
            ],
            [(output.dtype.name, output.shape) for output in outputs],
            nki_calls[-1] if nki_calls else None,
            origin=origin,
        )
        self._code = _Code(module)
        return self


def _traced(name: str, array: np.ndarray) -> np.ndarray:
    """The array as the real tracer takes it: 64-bit types narrowed, with a warning."""
    narrowed = _TRACED_AS.get(array.dtype.name)
    if narrowed is None:
        return array
    warnings.warn(f"nkipy (toolchain double): {name} is traced as {narrowed}", stacklevel=3)
    return array.astype(narrowed)


def code_digest(fn: Callable[..., Any]) -> str:
    """sha256 of the code `fn` runs: its own and that of the user functions it calls by
    global name, recursively. Library code (the standard library, site-packages) is the
    library's version's, so it is not followed."""
    digest = hashlib.sha256()
    for code in _user_code(fn):
        digest.update(_describe_code(code).encode())
    return digest.hexdigest()


def _user_code(fn: Callable[..., Any]) -> Iterator[types.CodeType]:
    seen: set[int] = set()
    pending = [fn]
    while pending:
        function = pending.pop()
        if id(function) in seen:
            continue
        seen.add(id(function))
        yield function.__code__
        names = [name for code in _nested(function.__code__) for name in code.co_names]
        pending += [
            called
            for called in map(function.__globals__.get, names)
            if isinstance(called, types.FunctionType)
            and not os.path.realpath(called.__code__.co_filename).startswith(_library_dirs())
        ]


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and the code of the functions, lambdas and comprehensions defined in it."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _nested(constant)


def _describe_code(code: types.CodeType) -> str:
    """What the code computes, without where it is (file, line numbers)."""
    parts = [code.co_code.hex(), *code.co_names, "|", *code.co_varnames, "|"]
    parts += [_describe_constant(constant) for constant in code.co_consts]
    return "\0".join(parts)


def _describe_constant(constant: Any) -> str:
    if isinstance(constant, types.CodeType):
        return _describe_code(constant)
    if isinstance(constant, frozenset):  # its order changes with the hash seed
        return "frozenset" + repr(sorted(map(repr, constant)))
    return repr(constant)


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(
        os.path.join(os.path.realpath(paths[key]), "")
        for key in ("stdlib", "platstdlib", "purelib", "platlib")
    )


def _as_json(value: Any) -> str:
    """A constant's value as the module records it: equal values, equal text, in every
    process (a function or class default is named, not shown at its address)."""
    return json.dumps(value, sort_keys=True, default=_named)


def _named(value: Any) -> str:
    name = getattr(value, "__qualname__", None)
    return f"{getattr(value, '__module__', '')}.{name}" if name else repr(value)
