"""`_build.json`: the build record every bundle carries, defined once.

The bundle stage writes it; `nkibuild verify` and the wheel writer read it through
these classes. The runtime vendored into each bundle (`runtime.py`) reads the same
document as plain JSON, because an installed bundle may not import nkibuild; the
tests hold every key the runtime reads to a field defined here.

JSON keys are the field names. Maps keyed by name (kernels, variants, targets) are
JSON objects; sequences are arrays. `format_version` changes when a reader of an
older version could misread a newer document; documents from before the field
existed have the layout of version 1.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from types import NoneType
from typing import Any, TypeVar, get_args, get_origin

from nkibuild.errors import NkibuildError

# No `from __future__ import annotations`: the reader checks each field against its
# annotation, so annotations must be types, not strings.

FILE_NAME = "_build.json"
FORMAT_VERSION = 1

R = TypeVar("R")
Constant = int | float | bool | str | tuple["Constant", ...]
NamedConstant = tuple[str, Constant]  # a kernel's constant; JSON [name, value]


class BuildInfoError(NkibuildError):
    """A `_build.json` this nkibuild cannot read; the message names the field."""

    def __init__(self, problem: str, document: str = FILE_NAME) -> None:
        self.problem = problem  # "<field>: <what is wrong with it>"
        super().__init__(f"{document}: {problem}")

    def of(self, document: str) -> "BuildInfoError":
        """The same problem, naming where the document is (a path, a wheel member)."""
        return BuildInfoError(self.problem, document)


class _Record:
    """An object of the document, keyed by field name; a field whose default is None may
    be absent (a key added after documents without it were written)."""

    def to_json(self) -> dict[str, Any]:
        # The encoder takes a record as its vars() (its fields, in order) and writes tuples
        # as arrays, recursing in C: faster than building the dicts in Python.
        return json.loads(json.dumps(self, default=vars))


@dataclass(frozen=True)
class TensorInfo(_Record):
    """A tensor of a fixed shape: a variant's input or a NEFF's output."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ArgumentInfo(_Record):
    """A kernel argument in call order; its shape depends on the variant."""

    name: str
    dtype: str


@dataclass(frozen=True)
class FunctionRef(_Record):
    """A function in a module the bundle ships: `<bundle>.<package>.<module>:<function>`."""

    package: str
    module: str
    function: str


@dataclass(frozen=True)
class ToleranceInfo(_Record):
    """`numpy.allclose` tolerances for verify; None: a default by dtype."""

    rtol: float | None
    atol: float | None


@dataclass(frozen=True)
class VariantInfo(_Record):
    """One shape set of a kernel; a call's input shapes select it."""

    inputs: tuple[TensorInfo, ...]


@dataclass(frozen=True)
class NeffInfo(_Record):
    """One compiled NEFF of a kernel variant for a target, and how to load it."""

    package: str  # the import package holding it (a split bundle's target part)
    path: str  # inside `package`, POSIX
    sha256: str
    lnc: int
    placeholder: bool  # written by the toolchain double, never loadable on a device
    compiler_version: str
    cache_key: str
    input_names: tuple[str, ...]  # the NEFF's own input names, in parameter order
    output_names: tuple[str, ...]
    outputs: tuple[TensorInfo, ...]
    compile_args: tuple[str, ...]
    # The NEFF format ("2.0") the runtime must read; None in documents written before it
    # was recorded (an optional key: older readers ignore it, so the format version stays)
    neff_version: str | None = None


@dataclass(frozen=True)
class KernelInfo(_Record):
    """A kernel as the runtime dispatches it. Maps are never mutated once built."""

    frontend: str
    inputs: tuple[ArgumentInfo, ...]
    constants: tuple[NamedConstant, ...]  # passed by keyword after the arguments
    variants: Mapping[str, VariantInfo]
    reference: FunctionRef | None
    source: FunctionRef | None  # the kernel's own code, shipped for nki and nkipy kernels
    tolerance: ToleranceInfo
    neffs: Mapping[str, Mapping[str, NeffInfo]]  # target -> variant -> NEFF


@dataclass(frozen=True)
class MaterialInfo(_Record):
    """A file the build read: its path in the project (POSIX) and its sha256."""

    path: str
    sha256: str


@dataclass(frozen=True)
class ToolInfo(_Record):
    """A tool the build ran, by name and version: neuronx-cc, a frontend's package."""

    name: str
    version: str


@dataclass(frozen=True)
class ProvenanceInfo(_Record):
    """What the bundle was built from, hashed by the bundle stage as it read it.

    A release's provenance statement lists the same materials and tools for the
    project (`nkibuild verify-provenance` compares them). The source revision is not
    here: it is the release's, and a commit that leaves every input as it was must
    not change the wheel's bytes."""

    manifest: MaterialInfo
    sources: tuple[MaterialInfo, ...]  # kernel sources, deps and references, by path
    tools: tuple[ToolInfo, ...]  # neuronx-cc and the frontends' packages, by name


@dataclass(frozen=True)
class BuildInfo(_Record):
    """The whole `_build.json`: what the runtime needs, and provenance for humans."""

    package: str  # the distribution name
    version: str
    nkibuild_version: str
    compiler_versions: tuple[str, ...]
    placeholder: bool  # any NEFF is the toolchain double's
    neuron_sdk: str | None  # the SDK versions the NEFFs need, e.g. ">=2.29,<3"
    requirements: tuple[str, ...]  # the bundle's runtime requirements (pip specifiers)
    split_targets: tuple[str, ...]  # targets whose NEFFs are in a package of their own
    kernels: Mapping[str, KernelInfo]
    # None in documents written before nkibuild recorded it (an optional key: older
    # readers ignore it, so the format version stays)
    provenance: ProvenanceInfo | None = None
    format_version: int = FORMAT_VERSION

    def targets(self) -> list[str]:
        """Every target some kernel has a NEFF for."""
        return sorted({target for kernel in self.kernels.values() for target in kernel.neffs})

    def to_text(self) -> str:
        """JSON as `_build.json` spells it: compact, keys sorted."""
        return json.dumps(self, default=vars, sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def from_json(cls, document: object) -> "BuildInfo":
        """Check and convert a parsed `_build.json`; BuildInfoError names a bad field."""
        data = _object(document, "")
        # Absent: written before the field existed, in the layout of version 1.
        version = _read(int, data.get("format_version", 1), "format_version")
        if not 1 <= version <= FORMAT_VERSION:
            raise BuildInfoError(
                f"format_version: {version} is not one this nkibuild reads "
                f"(1 to {FORMAT_VERSION}); read the bundle with the nkibuild that built it"
            )
        return _record(cls, {**data, "format_version": version}, "")

    @classmethod
    def from_text(cls, text: str) -> "BuildInfo":
        try:
            document = json.loads(text)
        except ValueError as error:
            raise BuildInfoError(f"not JSON ({error})") from None
        return cls.from_json(document)


def read_build_info(path: Path) -> BuildInfo:
    """The `_build.json` at `path`; BuildInfoError (naming the file) if it is unusable."""
    try:
        return BuildInfo.from_text(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise BuildInfoError(f"cannot read it ({error.strerror or error})", str(path)) from None
    except BuildInfoError as error:
        raise error.of(str(path)) from None


def _record(cls: type[R], value: object, where: str) -> R:
    """The dataclass `cls` from a JSON object, each field checked against its annotation."""
    data = _object(value, where)
    values: dict[str, Any] = {}
    for item in fields(cls):
        key = f"{where}.{item.name}" if where else item.name
        if item.name in data:
            values[item.name] = _read(item.type, data[item.name], key)
        elif item.default is not None:
            raise BuildInfoError(f"{key}: missing")
    return cls(**values)


# Each scalar field type: the JSON values it takes (a boolean only for bool), and their name.
_SCALARS: dict[Any, tuple[Any, str]] = {
    str: (str, "a string"),
    bool: (bool, "true or false"),
    int: (int, "an integer"),
    float: (int | float, "a number"),
}


def _read(hint: Any, value: Any, where: str) -> Any:
    """`value` checked and converted to the type `hint`; BuildInfoError names `where`."""
    nullable = NoneType in get_args(hint)
    if nullable:
        if value is None:
            return None
        (hint,) = (arg for arg in get_args(hint) if arg is not NoneType)
    if hint in _SCALARS:
        kinds, expected = _SCALARS[hint]
        if not isinstance(value, kinds) or (isinstance(value, bool) and hint is not bool):
            raise _error(where, expected + (" or null" if nullable else ""), value)
        return float(value) if hint is float else value
    if is_dataclass(hint):
        return _record(hint, value, where)
    if hint is NamedConstant:
        if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)):
            raise _error(where, "[name, value]", value)
        return value[0], _constant(value[1], where)
    if get_origin(hint) is Mapping:
        items = _object(value, where).items()
        return {name: _read(get_args(hint)[1], item, f"{where}.{name}") for name, item in items}
    if not isinstance(value, list):  # a tuple[X, ...]
        raise _error(where, "a list", value)
    return tuple(_read(get_args(hint)[0], item, f"{where}[{i}]") for i, item in enumerate(value))


def _constant(value: Any, where: str) -> Constant:
    # JSON has no tuples; the manifest model's constants are tuples.
    if isinstance(value, list):
        return tuple(_constant(v, f"{where}[{i}]") for i, v in enumerate(value))
    if not isinstance(value, int | float | str):  # bool is an int
        raise _error(where, "a number, string, boolean or list", value)
    return value


def _object(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _error(where or "the document", "an object", value)
    return value


def _error(where: str, expected: str, value: object) -> BuildInfoError:
    return BuildInfoError(f"{where}: expected {expected}, got {_kind(value)}")


def _kind(value: object) -> str:
    """How an error shows a bad value: short, and its JSON type."""
    names = {dict: "an object", list: "a list", type(None): "null", bool: "a boolean"}
    if type(value) in names:
        return names[type(value)]
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
