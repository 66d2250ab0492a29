"""Typed model of a validated nkibuild.yaml (format version 1).

Every value here has passed the JSON Schema and the semantic checks; later
stages never see raw YAML.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from nkibuild.errors import Location

TARGETS: tuple[str, ...] = ("trn1", "trn2", "trn3")
FRONTENDS: tuple[str, ...] = ("nki", "nkipy", "jax", "hlo")
AUTO_CAST: tuple[str, ...] = ("none", "matmult", "all")
AUTO_CAST_TYPES: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp8_e4m3")
DEFAULT_VARIANT = "default"

# A constant is any YAML scalar or a (nested) list of them; lists become tuples.
Constant = int | float | bool | str | tuple["Constant", ...]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument: its name, shape and element type."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{','.join(map(str, self.shape))}]"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> TensorSpec:
        return cls(str(data["name"]), tuple(int(d) for d in data["shape"]), str(data["dtype"]))


@dataclass(frozen=True)
class CompileSettings:
    """A layer of compile settings; None means "inherit from the layer below"."""

    optlevel: int | None = None
    auto_cast: str | None = None
    auto_cast_type: str | None = None
    lnc: int | None = None  # None also stands for "auto"
    fast_loading: bool | None = None
    compiler_args: tuple[str, ...] | None = None
    compile_memory: int | None = None  # bytes; a scheduling hint, not a compiler flag
    compile_timeout: float | None = None  # seconds


@dataclass(frozen=True)
class SourceRef:
    """`path/to/file.py:function` (or a bare path for the hlo frontend).

    `path` is relative to the manifest's directory, in POSIX form.
    """

    path: str
    function: str | None
    location: Location | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.path}:{self.function}" if self.function else self.path


@dataclass(frozen=True)
class Variant:
    """A named shape set of a kernel (a shape bucket)."""

    name: str
    inputs: tuple[TensorSpec, ...]
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Tolerance:
    """`numpy.allclose` tolerances for `nkibuild verify`; None: a default by dtype."""

    rtol: float | None = None
    atol: float | None = None


@dataclass(frozen=True)
class Kernel:
    name: str
    frontend: str
    source: SourceRef
    inputs: tuple[TensorSpec, ...]
    constants: tuple[tuple[str, Constant], ...]
    variants: tuple[Variant, ...]
    targets: tuple[str, ...] | None
    settings: CompileSettings
    overrides: tuple[tuple[str, CompileSettings], ...]
    reference: SourceRef | None
    deps: tuple[str, ...]
    tolerance: Tolerance = Tolerance()
    location: Location | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    import_name: str
    description: str = ""
    license: str | None = None
    requires_python: str = ">=3.10"
    neuron_sdk: str | None = None  # e.g. ">=2.29,<3"
    split_targets: bool = False  # one NEFF wheel per target + a main wheel with extras


@dataclass(frozen=True)
class CacheSettings:
    remote: str | None = None  # fsspec URL
    read_only: bool = False


@dataclass(frozen=True)
class Manifest:
    path: Path  # absolute path of nkibuild.yaml
    package: Package
    default_targets: tuple[str, ...]
    defaults: CompileSettings
    kernels: tuple[Kernel, ...]
    compiler_path: Path | None = None  # absolute; None: search for neuronx-cc
    cache: CacheSettings = CacheSettings()
    verify: bool = False  # run verify's kernel-vs-reference check after the bundle
    sha256: str = field(default="", compare=False)  # of the manifest bytes

    @property
    def root(self) -> Path:
        return self.path.parent

    def kernel(self, name: str) -> Kernel:
        for kernel in self.kernels:
            if kernel.name == name:
                return kernel
        raise KeyError(name)
