"""Typed model of a validated nkibuild.yaml (format version 1): the one description of it.

Every value here has passed the JSON Schema and the semantic checks; later stages
never see raw YAML. The field metadata (`keys.key`, `keys.mapping`) says how each
field is spelled in YAML and what it means: the JSON Schema (schemas/), the reference
(docs/manifest.md) and the YAML converter are generated from it, so a key is added
here and nowhere else. `VALUE_TYPES` are the YAML value types that are not classes.
"""

from __future__ import annotations

import math
import posixpath
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args

from nkibuild import dtypes
from nkibuild.errors import Location
from nkibuild.manifest.keys import Converting, Section, effective_defaults, key, mapping, mixin, ref
from nkibuild.quantities import DURATION_PATTERN, SIZE_PATTERN, parse_duration, parse_size

Target = Literal["trn1", "trn2", "trn3"]
Frontend = Literal["nki", "nkipy", "jax", "hlo"]
AutoCast = Literal["none", "matmult", "all"]
AutoCastType = Literal["bf16", "fp16", "tf32", "fp8_e4m3"]
OptLevel = Literal[1, 2, 3]
# nkibuild.toolchain.TOOLCHAIN_MODES (not imported: workers import the toolchain, not this)
ToolchainMode = Literal["auto", "neuron", "fake"]

TARGETS: tuple[str, ...] = get_args(Target)
FRONTENDS: tuple[str, ...] = get_args(Frontend)
AUTO_CAST: tuple[str, ...] = get_args(AutoCast)
AUTO_CAST_TYPES: tuple[str, ...] = get_args(AutoCastType)
DEFAULT_VARIANT = "default"

# A constant is any YAML scalar or a (nested) list of them; lists become tuples.
Constant = int | float | bool | str | tuple["Constant", ...]


def _names(title: str, definition: str = "identifier") -> dict[str, str]:
    """The schema of the names of a mapping by name."""
    return {"title": title, **ref(definition)}


# ------------------------------------------------------------ YAML value types

_SHAPE = ref("shape")
_DTYPE = ref("dtype")

VALUE_TYPES: dict[str, dict[str, Any]] = {
    "identifier": {
        "title": "identifier",
        "description": "A Python identifier in ASCII: letters, digits and underscores, "
        "not starting with a digit; at most 64 characters.",
        "type": "string",
        "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
        "maxLength": 64,
    },
    "target": {
        "title": "target",
        "description": "A Trainium generation.",
        "type": "string",
        "enum": list(TARGETS),
    },
    "targets": {
        "title": "targets",
        "description": "Trainium generations to compile for; one NEFF is built per target.",
        "type": "array",
        "items": ref("target"),
        "minItems": 1,
        "uniqueItems": True,
    },
    "dtype": {
        "title": "dtype",
        "description": "Element type of a tensor, spelled as in NumPy.",
        "type": "string",
        "enum": list(dtypes.NAMES),
    },
    "shape": {
        "title": "shape",
        "description": "Dimensions of a tensor, outermost first; at least one (the Neuron "
        "runtime cannot pass a 0-d tensor).",
        "type": "array",
        "items": {"type": "integer", "minimum": 1},
    },
    "tensorChange": {
        "title": "tensor change",
        "description": "A variant's shape and/or element type for one input.",
        "type": "object",
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {
            "shape": {
                "title": "Shape",
                "description": "Dimensions of the input in this variant.",
                **_SHAPE,
            },
            "dtype": {
                "title": "Element type",
                "description": "Element type of the input in this variant.",
                **_DTYPE,
            },
        },
    },
    "variant": {
        "title": "variant",
        "description": "A shape bucket: for each input it names, a shape list or a "
        "`{shape, dtype}` mapping. Inputs it does not name keep their declared shape "
        "and dtype.",
        "type": "object",
        "propertyNames": _names("input"),
        "additionalProperties": {
            "title": "input change",
            "description": "The input's shape in this variant (a list), or a mapping with "
            "its `shape` and/or `dtype`.",
            "anyOf": [_SHAPE, ref("tensorChange")],
        },
    },
    "constant": {
        "title": "constant",
        "description": "A value passed to the kernel function as a keyword argument: a "
        "number, boolean, string or a (nested) list of them.",
        "type": ["boolean", "integer", "number", "string", "array"],
        "items": ref("constant"),
    },
    "sourceRef": {
        "title": "source reference",
        "description": "`path/to/file.py:function`, relative to the manifest's directory.",
        "type": "string",
        "minLength": 1,
        "maxLength": 1024,
    },
    "glob": {
        "title": "glob pattern",
        "description": "A glob pattern relative to the manifest's directory, e.g. "
        "`kernels/common/*.py`.",
        "type": "string",
        "minLength": 1,
        "maxLength": 1024,
    },
    "size": {
        "title": "size",
        "description": "An amount of memory: a number with a unit K, M, G or T (powers of "
        "1024, optional `iB`/`B`), e.g. `16G`, `512MiB`.",
        "type": "string",
        "pattern": SIZE_PATTERN,
        "examples": ["16G", "512MiB", "1.5T"],
    },
    "duration": {
        "title": "duration",
        "description": "Seconds, or a number with a unit `s`, `m`, `h` or `d`, e.g. `90`, "
        "`30m`, `2h`.",
        "oneOf": [
            {"type": "number", "exclusiveMinimum": 0},
            {"type": "string", "pattern": DURATION_PATTERN, "examples": ["90s", "30m", "2h"]},
        ],
    },
}

# ------------------------------------------------------------------- classes


@mapping(
    "tensor",
    "Shape and element type of a tensor argument.",
    definition="tensor",
    keyed_by="name",
)
@dataclass(frozen=True)
class TensorSpec:
    """One tensor argument: its name, shape and element type."""

    name: str
    shape: tuple[int, ...] = key(
        "shape",
        "Shape",
        "Dimensions, outermost first, each a positive integer.",
        required=True,
        schema=_SHAPE,
    )
    dtype: str = key(
        "dtype",
        "Element type",
        "Element type, spelled as in NumPy.",
        required=True,
        schema=_DTYPE,
    )

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{','.join(map(str, self.shape))}]"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict) -> TensorSpec:
        return cls(str(data["name"]), tuple(int(d) for d in data["shape"]), str(data["dtype"]))


@mapping(
    "compile settings",
    "neuronx-cc settings. A kernel's settings override the defaults; a kernel's "
    "per-target overrides win over both.",
    definition="compileSettings",
    closed=False,  # a mixin: closed by each mapping that takes its keys
)
@dataclass(frozen=True)
class CompileSettings:
    """A layer of compile settings; None means "inherit from the layer below", and the
    documented defaults are what the bottom layer means (`DEFAULT_SETTINGS`)."""

    optlevel: OptLevel | None = key(
        "optlevel",
        "Optimization level",
        "`neuronx-cc --optlevel`: 1 compiles fastest, 3 optimizes most.",
        default=None,
        documented=2,
    )
    auto_cast: AutoCast | None = key(
        "auto-cast",
        "Auto-cast",
        "`neuronx-cc --auto-cast`: which operations may be computed in a lower precision.",
        default=None,
        documented="none",
    )
    auto_cast_type: AutoCastType | None = key(
        "auto-cast-type",
        "Auto-cast type",
        "`neuronx-cc --auto-cast-type`: the lower precision used by auto-cast.",
        default=None,
        documented="bf16",
    )
    lnc: int | None = key(  # None also stands for "auto"
        "lnc",
        "Logical NeuronCore size",
        "`neuronx-cc --lnc`: physical NeuronCores per logical core. `auto` is the same as "
        "leaving the key out: the layer below decides, and if no layer sets a number, trn1 "
        "gets 1 and trn2/trn3 get 2. trn1 supports only 1.",
        default=None,
        documented="auto",
        schema={"type": ["string", "integer"], "enum": ["auto", 1, 2]},
        parse=lambda value: None if value == "auto" else int(value),
    )
    fast_loading: bool | None = key(
        "fast-loading",
        "Fast loading",
        "Pass `--enable-fast-loading-neuron-binaries`: faster NEFF loading, possibly "
        "slower kernels.",
        default=None,
        documented=False,
    )
    compiler_args: tuple[str, ...] | None = key(
        "compiler-args",
        "Extra compiler arguments",
        "Extra neuronx-cc arguments, appended after the ones nkibuild derives from the "
        "settings above.",
        default=None,
        documented=[],
    )
    compile_memory: int | None = key(  # bytes; a scheduling hint, not a compiler flag
        "compile-memory",
        "Compile memory",
        "Peak memory one neuronx-cc run of this kernel needs. With `--max-compile-memory`, "
        "parallel compiles are scheduled so their estimates fit the budget; the estimate is "
        "the larger of this hint and the peak measured at the kernel's last compile.",
        default=None,
        schema=ref("size"),
        parse=parse_size,
    )
    compile_timeout: float | None = key(  # seconds
        "compile-timeout",
        "Compile timeout",
        "Stop neuronx-cc (and every process it started) after this long and fail the unit. "
        "Without it, compiles may run as long as they need.",
        default=None,
        schema=ref("duration"),
        parse=parse_duration,
    )

    def over(self, base: CompileSettings) -> CompileSettings:
        """`base` with every setting this layer sets replaced."""
        set_here = {name: value for name, value in vars(self).items() if value is not None}
        return CompileSettings(**{**vars(base), **set_here})


# What the bottom layer means: the documented defaults.
DEFAULT_SETTINGS: CompileSettings = effective_defaults(CompileSettings)
DEFAULT_TARGETS: tuple[str, ...] = ("trn2",)


@dataclass(frozen=True)
class SourceRef:
    """`path/to/file.py:function` (or a bare path for the hlo frontend); `path` is
    relative to the manifest's directory, in POSIX form."""

    path: str
    function: str | None
    location: Location | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.path}:{self.function}" if self.function else self.path

    @classmethod
    def from_yaml(cls, text: str, location: Location | None) -> SourceRef:
        path, function = split_source(text)
        return cls(posixpath.normpath(path), function, location)  # "./a//b.py" -> "a/b.py"


def split_source(text: str) -> tuple[str, str | None]:
    """`path/to/file.py:function` -> (path, function); a bare path has no function."""
    path, sep, function = text.rpartition(":")
    return (path, function) if sep else (text, None)


@dataclass(frozen=True)
class Variant:
    """A named shape set of a kernel (a shape bucket), its inputs resolved: in YAML a
    variant only restates the inputs it changes (VALUE_TYPES["variant"])."""

    name: str
    inputs: tuple[TensorSpec, ...]
    location: Location | None = field(default=None, compare=False)


def _variants(data: dict[str, Any] | None, converting: Converting) -> tuple[Variant, ...]:
    inputs: tuple[TensorSpec, ...] = converting.values["inputs"]
    base = converting.path[:-1]  # the kernel's
    if data is None:
        return (Variant(DEFAULT_VARIANT, inputs, converting.key_location(base)),)
    return tuple(
        Variant(
            name,
            tuple(_changed(spec, changes.get(spec.name)) for spec in inputs),
            converting.key_location((*converting.path, name)),
        )
        for name, changes in data.items()
    )


def _changed(spec: TensorSpec, change: list[int] | dict[str, Any] | None) -> TensorSpec:
    """An input as a variant sees it: a bare list is a new shape, a mapping a shape/dtype."""
    change = {"shape": change} if isinstance(change, list) else change or {}
    return replace(
        spec,
        shape=tuple(change.get("shape", spec.shape)),
        dtype=change.get("dtype", spec.dtype),
    )


def _constant(value: Any) -> Constant:
    return tuple(_constant(item) for item in value) if isinstance(value, list) else value


@mapping(schema={"minProperties": 1})  # inline where used, titled by that field
@dataclass(frozen=True)
class Tolerance:
    """`numpy.allclose` tolerances for `nkibuild verify`; None: a default by dtype."""

    rtol: float | None = key(
        "rtol", "Relative tolerance", "Relative tolerance.", default=None, schema={"minimum": 0}
    )
    atol: float | None = key(
        "atol", "Absolute tolerance", "Absolute tolerance.", default=None, schema={"minimum": 0}
    )


_INPUT_AXIS = "^[A-Za-z_][A-Za-z0-9_]*\\.[0-9]+$"  # `x.0`: axis 0 of input x


@mapping(
    "padded output axis",
    "An axis of an output whose length follows a padded input axis: after the padded call "
    "the output is cut back along it to that input axis's length in the call.",
    definition="paddedOutputAxis",
)
@dataclass(frozen=True)
class PaddedOutputAxis:
    """Output `output`'s axis `axis` is as long as input axis `follows` (`x.0`)."""

    output: int = key(
        "output",
        "Output",
        "Position of the output among the kernel's results, 0 for the first.",
        required=True,
        schema={"minimum": 0},
    )
    axis: int = key(
        "axis",
        "Output axis",
        "The output's axis, 0 for the outermost.",
        required=True,
        schema={"minimum": 0},
    )
    follows: str = key(
        "follows",
        "Follows",
        "The padded input axis this output axis follows, as `input.axis` (`x.0`).",
        required=True,
        schema={"pattern": _INPUT_AXIS, "maxLength": 80},
    )

    @property
    def input(self) -> str:
        return self.follows.rpartition(".")[0]

    @property
    def input_axis(self) -> int:
        return int(self.follows.rpartition(".")[2])


@mapping()  # inline where used, titled by that field
@dataclass(frozen=True)
class Padding:
    """How a call whose shapes match no variant is padded up to one (opt-in)."""

    inputs: tuple[tuple[str, tuple[int, ...]], ...] = key(
        "inputs",
        "Padded input axes",
        "For each input that may be padded, the axes (0 for the outermost) that may be "
        "shorter in a call than in the variant. Every other axis must match exactly.",
        required=True,
        schema={"minProperties": 1},
        names=_names("input"),
        values={
            "title": "padded axes",
            "description": "Axes of this input that a call may have shorter.",
            "items": {"type": "integer", "minimum": 0},
            "minItems": 1,
            "uniqueItems": True,
        },
    )
    value: float = key(
        "value",
        "Pad value",
        "What padded elements hold: every padded input's dtype must hold it exactly (0.1 "
        "is no float32); `-.inf` suits a max or a softmax along a padded axis.",
        default=0.0,
        documented=0,
    )
    outputs: tuple[PaddedOutputAxis, ...] = key(
        "outputs",
        "Output axes to cut back",
        "The output axes that follow a padded input axis; each is cut back to the call's "
        "length after the padded call. Output axes not listed are returned whole.",
        default=(),
    )

    def to_json(self) -> dict[str, Any]:
        """As the generated loader takes it: inputs by name, outputs as (output, axis,
        input, input axis); -inf and nan as strings, which JSON has no literal for."""
        value = self.value if math.isfinite(self.value) else repr(float(self.value))
        return {
            "inputs": {name: list(axes) for name, axes in self.inputs},
            "value": value,
            "outputs": [[o.output, o.axis, o.input, o.input_axis] for o in self.outputs],
        }


@mapping(
    "kernel",
    "One kernel: where its code is, its inputs and how to compile it. Kernel-level compile "
    "settings override the defaults.",
    definition="kernel",
    keyed_by="name",
)
@dataclass(frozen=True)
class Kernel:
    name: str
    frontend: Frontend = key(
        "frontend",
        "Frontend",
        "How the source becomes HLO: `nki` (an NKI kernel), `nkipy` (a NKIPy kernel), `jax` "
        "(a JAX function traced on CPU) or `hlo` (a serialized HloModuleProto).",
        required=True,
    )
    source: SourceRef = key(
        "source",
        "Source",
        "The kernel's code: `path/to/file.py:function`, relative to the manifest's "
        "directory; for the `hlo` frontend the path of the HloModuleProto file, without a "
        "function.",
        required=True,
        schema=ref("sourceRef"),
    )
    inputs: tuple[TensorSpec, ...] = key(
        "inputs",
        "Inputs",
        "Tensor arguments of the kernel, by argument name, in call order.",
        required=True,
        schema={"minProperties": 1},
        names=_names("input"),
    )
    constants: tuple[tuple[str, Constant], ...] = key(
        "constants",
        "Constants",
        "Compile-time keyword arguments of the kernel function, by name. Lists become "
        "tuples. Not allowed for the `hlo` frontend.",
        default=(),
        names=_names("constant"),
        values=ref("constant"),
        parse=lambda pairs: tuple((name, _constant(value)) for name, value in pairs),
    )
    variants: tuple[Variant, ...] = key(
        "variants",
        "Variants",
        "Shape buckets, by name; each is compiled separately. Without variants a kernel has "
        "one variant, `default`, with the declared inputs. Not allowed for the `hlo` frontend.",
        default=(),
        schema={
            "type": "object",
            "minProperties": 1,
            "propertyNames": _names("variant"),
            "additionalProperties": ref("variant"),
        },
        hook=_variants,
        hook_absent=True,
    )
    targets: tuple[str, ...] | None = key(
        "targets",
        "Targets",
        "Targets of this kernel, instead of `defaults.targets`.",
        default=None,
        schema=ref("targets"),
    )
    settings: CompileSettings = mixin(default=CompileSettings())
    overrides: tuple[tuple[str, CompileSettings], ...] = key(
        "overrides",
        "Per-target overrides",
        "Compile settings for one target of this kernel; they win over the kernel's "
        "settings and the defaults. Every key must be one of the kernel's targets.",
        default=(),
        names=_names("target", "target"),
        values={
            "title": "target settings",
            "description": "Compile settings of the kernel for this target.",
            "unevaluatedProperties": False,
        },
    )
    reference: SourceRef | None = key(
        "reference",
        "Reference implementation",
        "`path/to/file.py:function` of a CPU (NumPy) implementation with the same "
        "signature; the generated package falls back to it where Neuron is unavailable, and "
        "tests compare against it.",
        default=None,
        schema=ref("sourceRef"),
    )
    deps: tuple[str, ...] = key(
        "deps",
        "Extra dependencies",
        "Glob patterns, relative to the manifest's directory, of further files the kernel's "
        "code reads (e.g. imported helpers); a change to any of them rebuilds the kernel.",
        default=(),
        schema={"items": ref("glob")},
    )
    tolerance: Tolerance = key(
        "tolerance",
        "Verification tolerance",
        "How close `nkibuild verify` requires the bundle's results to be to the reference: "
        "`numpy.allclose` with these `rtol` and `atol`. Without it: rtol 1e-5, atol 1e-6 "
        "for 32-bit floats; 1e-2 for bfloat16 and float16 results.",
        default=Tolerance(),
    )
    padding: Padding | None = key(
        "padding",
        "Padding to shape buckets",
        "Opt-in: a call whose shapes match no variant is padded up to the smallest variant "
        "it fits, run, and its outputs cut back. Without it a call must match a variant "
        "exactly.",
        default=None,
    )
    location: Location | None = field(default=None, compare=False)

    def config(self) -> dict[str, Any]:
        """What of the kernel decides a bundle's loader and its checks (a task's doit
        `config_changed`); positions are left out: moving a kernel rebuilds nothing."""
        return {
            "name": self.name,
            "frontend": self.frontend,
            "inputs": [t.to_json() for t in self.inputs],
            "constants": [[name, value] for name, value in self.constants],
            "variants": {v.name: [t.to_json() for t in v.inputs] for v in self.variants},
            "reference": str(self.reference) if self.reference else None,
            "source": str(self.source),
            "tolerance": [self.tolerance.rtol, self.tolerance.atol],
            "padding": self.padding.to_json() if self.padding else None,
        }


def _import_name(value: str | None, converting: Converting) -> str:
    return value or re.sub(r"[-_.]+", "_", converting.values["name"]).lower()


# PEP 508 names; the semantic checks also match it, as JSON Schema's "$" would accept
# a final newline.
DISTRIBUTION_NAME_PATTERN = "^([A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]*[A-Za-z0-9])$"
_SPECIFIER = r"\s*(>=|<=|==|!=|>|<)\s*[0-9]+(\.[0-9]+)*\s*"


@mapping("package", "Distribution metadata of the generated wheel.", definition="package")
@dataclass(frozen=True)
class Package:
    name: str = key(
        "name",
        "Distribution name",
        "Name of the distribution on PyPI (PEP 508): letters, digits, `.`, `_` and `-`, "
        "starting and ending with a letter or digit.",
        required=True,
        schema={"pattern": DISTRIBUTION_NAME_PATTERN, "maxLength": 128},
    )
    version: str = key(
        "version",
        "Version",
        "Version of the distribution (PEP 440), e.g. `0.1.0`. Quote versions that YAML "
        'would read as a number: `"1.0"`.',
        required=True,
        schema={"minLength": 1, "maxLength": 64},
    )
    import_name: str = key(
        "import-name",
        "Import name",
        "Name of the top-level Python package. Default: the distribution name in lower case "
        "with every run of `-`, `_` and `.` replaced by `_`.",
        schema=ref("identifier"),
        hook=_import_name,
        hook_absent=True,
    )
    description: str = key(
        "description", "Description", "One-line summary of the distribution.", default=""
    )
    license: str | None = key(
        "license",
        "License",
        "License of the distribution as an SPDX expression, e.g. `Apache-2.0`.",
        default=None,
        schema={"minLength": 1},
    )
    requires_python: str = key(
        "requires-python",
        "Requires-Python",
        "Python versions the generated wheel supports (a PEP 440 specifier set such as `>=3.10`).",
        default=">=3.10",
        schema={"minLength": 1},
    )
    neuron_sdk: str | None = key(  # e.g. ">=2.29,<3"
        "neuron-sdk",
        "Neuron SDK",
        "Versions of the Neuron SDK the bundle's NEFFs need at run time, as comma-separated "
        "clauses such as `>=2.29` or `>=2.29,<3`. Recorded in the wheel (`Requires-External`) "
        "and checked by the bundle before it loads a NEFF, when the host's SDK version is "
        "known.",
        default=None,
        schema={
            "pattern": f"^{_SPECIFIER}(,{_SPECIFIER})*$",
            "examples": [">=2.29", ">=2.29,<3"],
        },
    )
    split_targets: bool = key(  # one NEFF wheel per target + a main wheel with extras
        "split-targets",
        "One wheel per target",
        "Put each target's NEFFs in a wheel of its own (`<name>-trn2`, ...) next to a main "
        "wheel with the code and extras per target (`pip install 'acme-kernels[trn2]'`), so "
        "a host downloads only its target's NEFFs. Worth it when NEFFs are large (tens of MB "
        "per target or more); otherwise one wheel is simpler.",
        default=False,
    )


@mapping()  # inline where used, titled by that field
@dataclass(frozen=True)
class CacheSettings:
    remote: str | None = key(  # fsspec URL
        "remote",
        "Remote cache",
        "fsspec URL of a cache shared by machines, e.g. `s3://bucket/nkibuild-cache` (needs "
        "`nkibuild[remote]`) or `file:///mnt/shared/cache`. `--remote-cache` and "
        "`NKIBUILD_REMOTE_CACHE` win over it.",
        default=None,
        schema={
            "pattern": "^[A-Za-z][A-Za-z0-9+.-]*://",
            "examples": ["s3://bucket/nkibuild-cache", "file:///mnt/shared/nkibuild-cache"],
        },
    )
    read_only: bool = key(
        "read-only",
        "Read only",
        "Use the caches without writing to them (for CI jobs that consume a cache other "
        "jobs fill). `--cache-read-only` and `NKIBUILD_CACHE_READ_ONLY=1` also set it.",
        default=False,
    )


DEFAULTS = Section(
    "defaults",
    "Defaults",
    "Targets and compile settings for every kernel that does not set its own.",
    definition="defaults",
    definition_title="defaults",
    definition_description="Targets and compile settings shared by all kernels.",
)
COMPILER = Section(
    "compiler",
    "compiler",
    "Which toolchain builds the project and where neuronx-cc is. Without `path` nkibuild looks "
    "at `NKIBUILD_NEURONX_CC`, then `PATH`, then the running Python's virtualenv, then the "
    "Neuron SDK's virtualenvs under /opt.",
)


def _compiler_path(text: str, converting: Converting) -> Path:
    try:
        expanded = Path(text).expanduser()
    except RuntimeError:  # `~nosuchuser/...`, or `~` without a home directory
        user = text[1:].split("/", 1)[0]
        whose = f"user {user!r}" if user else "this user (no HOME)"
        raise ValueError(f"cannot expand {text!r}: no home directory for {whose}") from None
    return converting.root / expanded  # an absolute path replaces root


@mapping(
    "nkibuild manifest",
    "nkibuild.yaml (format version 1): the kernels of one Python distribution and how to "
    "compile them for AWS Neuron.",
)
@dataclass(frozen=True, kw_only=True)
class Manifest:
    path: Path  # absolute path of nkibuild.yaml
    format_version: Literal[1] = key(
        "format-version",
        "Format version",
        "Version of the manifest format. Only 1 exists.",
        required=True,
    )
    package: Package = key(
        "package",
        "Package",
        "The Python distribution (wheel) that bundles the compiled kernels.",
        required=True,
    )
    default_targets: tuple[str, ...] = key(
        "targets",
        "Default targets",
        "Targets of kernels that do not list their own.",
        default=DEFAULT_TARGETS,
        section=DEFAULTS,
        schema=ref("targets"),
    )
    defaults: CompileSettings = mixin(  # the bottom layer: every setting final
        default=DEFAULT_SETTINGS, section=DEFAULTS, parse=lambda layer: layer.over(DEFAULT_SETTINGS)
    )
    compiler_path: Path | None = key(  # absolute; None: search for neuronx-cc
        "path",
        "Compiler path",
        "Path of the `neuronx-cc` executable; `~` is expanded, a relative path is relative "
        "to the manifest's directory. `--compiler` and `NKIBUILD_NEURONX_CC` win over it.",
        default=None,
        section=COMPILER,
        schema={"type": "string", "minLength": 1},
        hook=_compiler_path,
    )
    toolchain: ToolchainMode | None = key(  # None: the command line's, else auto
        "toolchain",
        "Toolchain",
        "The toolchain the project builds with: `auto` (the real neuronx-cc), `neuron` or "
        "`fake` (nkibuild's toolchain double). `--toolchain` and `NKIBUILD_TOOLCHAIN` win "
        "over it. Without any of them a build uses `auto`, and `explain`, `list` and "
        "`verify` use the build directory's last build's.",
        default=None,
        section=COMPILER,
    )
    cache: CacheSettings = key(
        "cache",
        "cache",
        "The shared NEFF caches. Lookups go build dir, local cache, remote cache, then "
        "compile; compiled NEFFs are published to both caches.",
        default=CacheSettings(),
    )
    verify: bool = key(  # run verify's kernel-vs-reference check after the bundle
        "verify",
        "Verify",
        "Run `nkibuild verify`'s kernel-vs-reference check as a build step after the "
        "bundle: each kernel that can run on the CPU is compared with its reference on the "
        "sample inputs, and a disagreement fails the build.",
        default=False,
    )
    kernels: tuple[Kernel, ...] = key(
        "kernels",
        "Kernels",
        "The kernels to build, by name. The name becomes a Python attribute of the "
        "generated package.",
        required=True,
        schema={"minProperties": 1},
        names=_names("kernel"),
    )
    sha256: str = field(default="", compare=False)  # of the manifest bytes

    @property
    def root(self) -> Path:
        return self.path.parent
