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

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from nkibuild.errors import NkibuildError

FILE_NAME = "_build.json"
FORMAT_VERSION = 1

T = TypeVar("T")
Constant = int | float | bool | str | tuple["Constant", ...]


class BuildInfoError(NkibuildError):
    """A `_build.json` this nkibuild cannot read; the message names the field."""

    def __init__(self, problem: str, document: str = FILE_NAME) -> None:
        self.problem = problem  # "<field>: <what is wrong with it>"
        self.document = document
        super().__init__(f"{document}: {problem}")

    def of(self, document: str) -> BuildInfoError:
        """The same problem, naming where the document is (a path, a wheel member)."""
        return BuildInfoError(self.problem, document)


@dataclass(frozen=True)
class TensorInfo:
    """A tensor of a fixed shape: a variant's input or a NEFF's output."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}

    @classmethod
    def from_json(cls, data: _Reader) -> TensorInfo:
        shape = tuple(data.integers("shape"))
        return cls(data.text("name"), data.text("dtype"), shape)


@dataclass(frozen=True)
class ArgumentInfo:
    """A kernel argument in call order; its shape depends on the variant."""

    name: str
    dtype: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: _Reader) -> ArgumentInfo:
        return cls(data.text("name"), data.text("dtype"))


@dataclass(frozen=True)
class FunctionRef:
    """A function in a module the bundle ships: `<bundle>.<package>.<module>:<function>`."""

    package: str
    module: str
    function: str

    def to_json(self) -> dict[str, Any]:
        return {"package": self.package, "module": self.module, "function": self.function}

    @classmethod
    def from_json(cls, data: _Reader) -> FunctionRef:
        return cls(data.text("package"), data.text("module"), data.text("function"))


@dataclass(frozen=True)
class ToleranceInfo:
    """`numpy.allclose` tolerances for verify; None: a default by dtype."""

    rtol: float | None = None
    atol: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rtol": self.rtol, "atol": self.atol}

    @classmethod
    def from_json(cls, data: _Reader) -> ToleranceInfo:
        return cls(data.optional_number("rtol"), data.optional_number("atol"))


@dataclass(frozen=True)
class VariantInfo:
    """One shape set of a kernel; a call's input shapes select it."""

    inputs: tuple[TensorInfo, ...]

    def to_json(self) -> dict[str, Any]:
        return {"inputs": [t.to_json() for t in self.inputs]}

    @classmethod
    def from_json(cls, data: _Reader) -> VariantInfo:
        return cls(data.objects("inputs", TensorInfo.from_json))


@dataclass(frozen=True)
class NeffInfo:
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

    def to_json(self) -> dict[str, Any]:
        return {
            "package": self.package,
            "path": self.path,
            "sha256": self.sha256,
            "lnc": self.lnc,
            "placeholder": self.placeholder,
            "compiler_version": self.compiler_version,
            "cache_key": self.cache_key,
            "input_names": list(self.input_names),
            "output_names": list(self.output_names),
            "outputs": [t.to_json() for t in self.outputs],
            "compile_args": list(self.compile_args),
            "neff_version": self.neff_version,
        }

    @classmethod
    def from_json(cls, data: _Reader) -> NeffInfo:
        return cls(
            package=data.text("package"),
            path=data.text("path"),
            sha256=data.text("sha256"),
            lnc=data.integer("lnc"),
            placeholder=data.flag("placeholder"),
            compiler_version=data.text("compiler_version"),
            cache_key=data.text("cache_key"),
            input_names=data.texts("input_names"),
            output_names=data.texts("output_names"),
            outputs=data.objects("outputs", TensorInfo.from_json),
            compile_args=data.texts("compile_args"),
            neff_version=data.optional_text("neff_version", absent=True),
        )


@dataclass(frozen=True)
class KernelInfo:
    """A kernel as the runtime dispatches it. Maps are never mutated once built."""

    frontend: str
    inputs: tuple[ArgumentInfo, ...]
    constants: tuple[tuple[str, Constant], ...]  # passed by keyword after the arguments
    variants: Mapping[str, VariantInfo]
    reference: FunctionRef | None
    source: FunctionRef | None  # the kernel's own code, shipped for nki and nkipy kernels
    tolerance: ToleranceInfo
    neffs: Mapping[str, Mapping[str, NeffInfo]]  # target -> variant -> NEFF

    def to_json(self) -> dict[str, Any]:
        return {
            "frontend": self.frontend,
            "inputs": [a.to_json() for a in self.inputs],
            "constants": [[name, _constant_json(value)] for name, value in self.constants],
            "variants": {name: v.to_json() for name, v in self.variants.items()},
            "reference": self.reference.to_json() if self.reference else None,
            "source": self.source.to_json() if self.source else None,
            "tolerance": self.tolerance.to_json(),
            "neffs": {
                target: {variant: n.to_json() for variant, n in by_variant.items()}
                for target, by_variant in self.neffs.items()
            },
        }

    @classmethod
    def from_json(cls, data: _Reader) -> KernelInfo:
        return cls(
            frontend=data.text("frontend"),
            inputs=data.objects("inputs", ArgumentInfo.from_json),
            constants=data.constants("constants"),
            variants=data.mapping("variants", VariantInfo.from_json),
            reference=data.optional_object("reference", FunctionRef.from_json),
            source=data.optional_object("source", FunctionRef.from_json),
            tolerance=ToleranceInfo.from_json(data.child("tolerance")),
            neffs=data.mapping("neffs", lambda t: t.mapping_of_self(NeffInfo.from_json)),
        )


@dataclass(frozen=True)
class MaterialInfo:
    """A file the build read: its path in the project (POSIX) and its sha256."""

    path: str
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256}

    @classmethod
    def from_json(cls, data: _Reader) -> MaterialInfo:
        return cls(data.text("path"), data.text("sha256"))


@dataclass(frozen=True)
class ToolInfo:
    """A tool the build ran, by name and version: neuronx-cc, a frontend's package."""

    name: str
    version: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}

    @classmethod
    def from_json(cls, data: _Reader) -> ToolInfo:
        return cls(data.text("name"), data.text("version"))


@dataclass(frozen=True)
class ProvenanceInfo:
    """What the bundle was built from, hashed by the bundle stage as it read it.

    A release's provenance statement lists the same materials and tools for the
    project (`nkibuild verify-provenance` compares them). The source revision is not
    here: it is the release's, and a commit that leaves every input as it was must
    not change the wheel's bytes."""

    manifest: MaterialInfo
    sources: tuple[MaterialInfo, ...]  # kernel sources, deps and references, by path
    tools: tuple[ToolInfo, ...]  # neuronx-cc and the frontends' packages, by name

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest.to_json(),
            "sources": [m.to_json() for m in self.sources],
            "tools": [t.to_json() for t in self.tools],
        }

    @classmethod
    def from_json(cls, data: _Reader) -> ProvenanceInfo:
        return cls(
            manifest=MaterialInfo.from_json(data.child("manifest")),
            sources=data.objects("sources", MaterialInfo.from_json),
            tools=data.objects("tools", ToolInfo.from_json),
        )


@dataclass(frozen=True)
class BuildInfo:
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
    format_version: int = field(default=FORMAT_VERSION)

    def targets(self) -> list[str]:
        """Every target some kernel has a NEFF for."""
        return sorted({target for kernel in self.kernels.values() for target in kernel.neffs})

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "package": self.package,
            "version": self.version,
            "nkibuild_version": self.nkibuild_version,
            "compiler_versions": list(self.compiler_versions),
            "placeholder": self.placeholder,
            "neuron_sdk": self.neuron_sdk,
            "requirements": list(self.requirements),
            "split_targets": list(self.split_targets),
            "provenance": self.provenance.to_json() if self.provenance else None,
            "kernels": {name: kernel.to_json() for name, kernel in self.kernels.items()},
        }

    def to_text(self) -> str:
        return encode(self.to_json()) + "\n"

    @classmethod
    def from_json(cls, document: object) -> BuildInfo:
        """Check and convert a parsed `_build.json`; BuildInfoError names a bad field."""
        data = _Reader(document, "")
        return cls(
            format_version=_format_version(data),
            package=data.text("package"),
            version=data.text("version"),
            nkibuild_version=data.text("nkibuild_version"),
            compiler_versions=data.texts("compiler_versions"),
            placeholder=data.flag("placeholder"),
            neuron_sdk=data.optional_text("neuron_sdk"),
            requirements=data.texts("requirements"),
            split_targets=data.texts("split_targets"),
            kernels=data.mapping("kernels", KernelInfo.from_json),
            provenance=data.optional_object("provenance", ProvenanceInfo.from_json, absent=True),
        )

    @classmethod
    def from_text(cls, text: str) -> BuildInfo:
        try:
            document = json.loads(text)
        except ValueError as error:
            raise BuildInfoError(f"not JSON ({error})") from None
        return cls.from_json(document)


def encode(value: object) -> str:
    """JSON as `_build.json` spells it: compact, keys sorted."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def read_build_info(path: Path) -> BuildInfo:
    """The `_build.json` at `path`; BuildInfoError (naming the file) if it is unusable."""
    try:
        return BuildInfo.from_text(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise BuildInfoError(f"cannot read it ({error.strerror or error})", str(path)) from None
    except BuildInfoError as error:
        raise error.of(str(path)) from None


def _format_version(data: _Reader) -> int:
    if "format_version" not in data.data:
        return 1  # written before the field existed, in the layout of version 1
    version = data.integer("format_version")
    if not 1 <= version <= FORMAT_VERSION:
        raise BuildInfoError(
            f"format_version: {version} is not one this nkibuild reads "
            f"(1 to {FORMAT_VERSION}); read the bundle with the nkibuild that built it"
        )
    return version


def _constant_json(value: Constant) -> Any:
    return [_constant_json(v) for v in value] if isinstance(value, tuple) else value


class _Reader:
    """Typed access to one JSON object of the document; every error names the field."""

    def __init__(self, data: object, path: str) -> None:
        if not isinstance(data, dict):
            raise BuildInfoError(f"{path or 'the document'}: expected an object, got {_kind(data)}")
        self.data: dict[str, Any] = data
        self.path = path

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, problem: str) -> BuildInfoError:
        return BuildInfoError(f"{self.where(key)}: {problem}")

    def value(self, key: str) -> Any:
        if key not in self.data:
            raise self.fail(key, "missing")
        return self.data[key]

    def text(self, key: str) -> str:
        return self._typed(key, self.value(key), str, "a string")

    def optional_text(self, key: str, *, absent: bool = False) -> str | None:
        value = self.data.get(key) if absent else self.value(key)
        return None if value is None else self._typed(key, value, str, "a string or null")

    def integer(self, key: str) -> int:
        value = self.value(key)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {_kind(value)}")
        return value

    def flag(self, key: str) -> bool:
        return self._typed(key, self.value(key), bool, "true or false")

    def optional_number(self, key: str) -> float | None:
        value = self.value(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"expected a number or null, got {_kind(value)}")
        return float(value)

    def texts(self, key: str) -> tuple[str, ...]:
        items = self._list(key)
        for index, item in enumerate(items):
            self._typed(f"{key}[{index}]", item, str, "a string")
        return tuple(items)

    def integers(self, key: str) -> tuple[int, ...]:
        items = self._list(key)
        for index, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, int):
                raise self.fail(f"{key}[{index}]", f"expected an integer, got {_kind(item)}")
        return tuple(items)

    def child(self, key: str) -> _Reader:
        return _Reader(self.value(key), self.where(key))

    def objects(self, key: str, parse: Callable[[_Reader], T]) -> tuple[T, ...]:
        items = enumerate(self._list(key))
        return tuple(parse(_Reader(item, f"{self.where(key)}[{i}]")) for i, item in items)

    def optional_object(
        self, key: str, parse: Callable[[_Reader], T], *, absent: bool = False
    ) -> T | None:
        """The object at `key`, or None for null (and, if `absent`, for a missing key)."""
        if absent and key not in self.data:
            return None
        return None if self.value(key) is None else parse(self.child(key))

    def mapping(self, key: str, parse: Callable[[_Reader], T]) -> dict[str, T]:
        return self.child(key).mapping_of_self(parse)

    def mapping_of_self(self, parse: Callable[[_Reader], T]) -> dict[str, T]:
        """This object as a map of names to objects."""
        return {name: parse(_Reader(item, self.where(name))) for name, item in self.data.items()}

    def constants(self, key: str) -> tuple[tuple[str, Constant], ...]:
        pairs = []
        for index, item in enumerate(self._list(key)):
            where = f"{key}[{index}]"
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise self.fail(where, f"expected [name, value], got {_kind(item)}")
            pairs.append((item[0], self._constant(where, item[1])))
        return tuple(pairs)

    def _constant(self, where: str, value: Any) -> Constant:
        # JSON has no tuples; the manifest model's constants are tuples.
        if isinstance(value, list):
            return tuple(self._constant(f"{where}[{i}]", v) for i, v in enumerate(value))
        if not isinstance(value, int | float | str):  # bool is an int
            expected = "a number, string, boolean or list"
            raise self.fail(where, f"expected {expected}, got {_kind(value)}")
        return value

    def _list(self, key: str) -> list[Any]:
        return self._typed(key, self.value(key), list, "a list")

    def _typed(self, key: str, value: Any, kind: type[T], expected: str) -> T:
        if not isinstance(value, kind):
            raise self.fail(key, f"expected {expected}, got {_kind(value)}")
        return value


def _kind(value: object) -> str:
    """How an error shows a bad value: short, and its JSON type."""
    names = {dict: "an object", list: "a list", type(None): "null", bool: "a boolean"}
    if type(value) in names:
        return names[type(value)]
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."
