"""Read the signature and custom-calls of a serialized XLA `HloModuleProto`.

The schema is a hand-declared subset of openxla's hlo.proto / xla_data.proto, built at
runtime so nkibuild needs neither protoc nor XLA's generated modules. Only the fields
nkibuild reads (or its toolchain double writes) are declared; everything else is kept
as unknown fields by protobuf.

The subset is declared as proto3 on purpose: proto3 enums are open, so an element type
this table does not list (for example a new f8 variant) reads back as its number instead
of silently turning into 0 as a closed proto2 enum would.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from nkibuild.confine import UnreadableFile, read_regular
from nkibuild.dtypes import BY_HLO_TYPE, hlo_type_name
from nkibuild.errors import NkibuildError

TUPLE_TYPE = 13  # xla PrimitiveType.TUPLE


class HloFormatError(NkibuildError):
    """The bytes are not a usable HloModuleProto."""


@dataclass(frozen=True)
class HloShape:
    element_type: int
    dims: tuple[int, ...]
    tuple_shapes: tuple[HloShape, ...] = ()

    @property
    def dtype(self) -> str:
        """Manifest dtype name (`float32`, `bfloat16`, ...), or `tuple`."""
        return "tuple" if self.is_tuple else hlo_type_name(self.element_type)

    @property
    def is_tuple(self) -> bool:
        return self.element_type == TUPLE_TYPE

    def leaves(self) -> tuple[HloShape, ...]:
        """The non-tuple shapes, depth first, in order."""
        if not self.is_tuple:
            return (self,)
        return tuple(leaf for child in self.tuple_shapes for leaf in child.leaves())

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(child) for child in self.tuple_shapes) + ")"
        return f"{self.dtype}[{','.join(str(d) for d in self.dims)}]"


@dataclass(frozen=True)
class HloParameter:
    index: int
    name: str
    shape: HloShape


@dataclass(frozen=True)
class HloCustomCall:
    computation: str
    instruction: str
    target: str
    backend_config: bytes


@dataclass(frozen=True)
class HloAlias:
    """An output that is written into a parameter's buffer (a kernel that writes into an
    input: nkipy then also returns that input, named after it)."""

    output_shape_index: tuple[int, ...]  # path into the result tuple
    parameter: int


@dataclass(frozen=True)
class HloModuleInfo:
    name: str
    entry_computation_name: str
    parameters: tuple[HloParameter, ...]
    result: HloShape
    custom_calls: tuple[HloCustomCall, ...]
    # The NEFF's output names if the tracer chose them (nkipy's root attribute
    # `neff_output_names`: "output0,x"), else () (the compiler names them output0, ...).
    output_names: tuple[str, ...] = ()
    aliases: tuple[HloAlias, ...] = ()

    def outputs(self) -> tuple[HloShape, ...]:
        return self.result.leaves()


def read_hlo(data: bytes) -> HloModuleInfo:
    """Parse a serialized HloModuleProto; raise HloFormatError if it is not one."""
    return _read(data, "HLO module")


def read_hlo_file(path: str | os.PathLike[str]) -> HloModuleInfo:
    """Parse an HloModuleProto file; errors name the file."""
    origin = os.fspath(path)
    try:
        data = read_regular(origin, MAX_MODULE_BYTES)
    except UnreadableFile as exc:
        raise HloFormatError(str(exc)) from None
    except OSError as exc:
        raise HloFormatError(f"cannot read HLO module {origin}: {exc.strerror}") from None
    return _read(data, origin)


# protobuf cannot parse a message of 2 GiB or more.
MAX_MODULE_BYTES = (2 << 30) - 1


# --- schema -------------------------------------------------------------------------

_PACKAGE = "nkibuild.hlo"
_F = descriptor_pb2.FieldDescriptorProto

# (field name, number, type, label, message/enum type name or None) per message.
_MESSAGES: dict[str, tuple[tuple[str, int, int, int, str | None], ...]] = {
    "ShapeProto": (
        ("element_type", 2, _F.TYPE_ENUM, _F.LABEL_OPTIONAL, "PrimitiveType"),
        ("dimensions", 3, _F.TYPE_INT64, _F.LABEL_REPEATED, None),
        ("tuple_shapes", 4, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ShapeProto"),
    ),
    "ProgramShapeProto": (
        ("parameters", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "ShapeProto"),
        ("result", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "ShapeProto"),
        ("parameter_names", 3, _F.TYPE_STRING, _F.LABEL_REPEATED, None),
    ),
    # xla_data.proto OpMetadata: the field canonical_module rewrites, and those the
    # toolchain double's nkipy writes as the real tracer does (hlo_writer.Origin).
    "OpMetadata": (
        ("op_type", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("op_name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("source_file", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("source_line", 4, _F.TYPE_INT32, _F.LABEL_OPTIONAL, None),
    ),
    # FrontendAttributes.map (map<string, string>) has the wire format of repeated pairs.
    "StringPair": (
        ("key", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("value", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
    ),
    "FrontendAttributes": (("map", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "StringPair"),),
    "AliasEntryProto": (
        ("output_shape_index", 1, _F.TYPE_INT64, _F.LABEL_REPEATED, None),
        ("parameter_number", 2, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
    ),
    "HloInputOutputAliasProto": (
        ("entries", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "AliasEntryProto"),
    ),
    "HloInstructionProto": (
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("opcode", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("shape", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "ShapeProto"),
        ("metadata", 7, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "OpMetadata"),
        ("parameter_number", 9, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("custom_call_target", 28, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("id", 35, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("operand_ids", 36, _F.TYPE_INT64, _F.LABEL_REPEATED, None),
        # bytes, not string: some custom-calls carry non-UTF-8 configs.
        ("backend_config", 43, _F.TYPE_BYTES, _F.LABEL_OPTIONAL, None),
        ("frontend_attributes", 68, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "FrontendAttributes"),
    ),
    "HloComputationProto": (
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("instructions", 2, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "HloInstructionProto"),
        ("id", 5, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("root_id", 6, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
    ),
    "HloModuleProto": (
        ("name", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("entry_computation_name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, None),
        ("computations", 3, _F.TYPE_MESSAGE, _F.LABEL_REPEATED, "HloComputationProto"),
        ("host_program_shape", 4, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "ProgramShapeProto"),
        ("id", 5, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("entry_computation_id", 6, _F.TYPE_INT64, _F.LABEL_OPTIONAL, None),
        ("input_output_alias", 8, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, "HloInputOutputAliasProto"),
    ),
}


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    schema = descriptor_pb2.FileDescriptorProto(
        name="nkibuild/hlo_subset.proto", package=_PACKAGE, syntax="proto3"
    )
    enum = schema.enum_type.add(name="PrimitiveType")
    # proto3 requires the first value to be 0; xla calls it PRIMITIVE_TYPE_INVALID.
    enum.value.add(name="PRIMITIVE_TYPE_INVALID", number=0)
    known = {d.hlo_type: d.name.upper() for d in BY_HLO_TYPE.values()} | {TUPLE_TYPE: "TUPLE"}
    for number, name in sorted(known.items()):
        enum.value.add(name=name, number=number)
    for message_name, fields in _MESSAGES.items():
        message = schema.message_type.add(name=message_name)
        for field_name, number, type_, label, type_name in fields:
            field = message.field.add(name=field_name, number=number, type=type_, label=label)
            if type_name:
                field.type_name = f".{_PACKAGE}.{type_name}"
    # A private pool: the default one may already hold XLA's real hlo.proto (jax, nkipy).
    pool = descriptor_pool.DescriptorPool()
    pool.Add(schema)
    return pool


@functools.cache
def message_class(name: str) -> Any:
    """The protobuf class of one message of the declared subset (`HloModuleProto`,
    `ShapeProto`, ...): for code that builds modules, such as the toolchain double."""
    pool = _pool()
    descriptor = pool.FindMessageTypeByName(f"{_PACKAGE}.{name}")
    get_message_class = getattr(message_factory, "GetMessageClass", None)
    if get_message_class is not None:
        return get_message_class(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)  # protobuf 4.21


def _parsed(data: bytes) -> Any:
    module = message_class("HloModuleProto")()
    module.ParseFromString(bytes(data))
    return module


# --- conversion -----------------------------------------------------------------------


def _read(data: bytes, origin: str) -> HloModuleInfo:
    if not data:
        raise HloFormatError(f"{origin}: empty file, expected a serialized HloModuleProto")
    if len(data) > MAX_MODULE_BYTES:
        raise HloFormatError(
            f"{origin}: {len(data)} bytes is more than a serialized HloModuleProto can be "
            f"({MAX_MODULE_BYTES})"
        )
    try:
        return _module_info(_parsed(data))
    except HloFormatError as exc:
        raise HloFormatError(f"{origin}: {exc}") from None
    except Exception as exc:  # any parse failure of untrusted bytes is a format error
        raise HloFormatError(
            f"{origin}: not a serialized HloModuleProto (truncated or corrupt?): {exc}"
        ) from None


def _module_info(module: Any) -> HloModuleInfo:
    if not module.computations:
        raise HloFormatError("the module has no computations (not an HloModuleProto?)")
    entry = _entry_computation(module)
    parameter_instructions = _parameter_instructions(entry)
    root = next((i for i in entry.instructions if i.id == entry.root_id), None)
    if module.HasField("host_program_shape"):
        program = module.host_program_shape
        shapes = [_shape(p) for p in program.parameters]
        if len(shapes) != len(parameter_instructions):
            raise HloFormatError(
                f"host_program_shape lists {len(shapes)} parameters but the entry "
                f"computation {entry.name!r} has {len(parameter_instructions)}"
            )
        result = _shape(program.result)
        declared_names: Sequence[str] = program.parameter_names
    elif root is None:
        raise HloFormatError(
            f"entry computation {entry.name!r} has no root instruction (id {entry.root_id})"
        )
    else:
        shapes = [_shape(p.shape) for p in parameter_instructions]
        result = _shape(root.shape)
        declared_names = ()
    names = _parameter_names(declared_names, parameter_instructions)
    return HloModuleInfo(
        name=module.name,
        entry_computation_name=entry.name,
        parameters=tuple(
            HloParameter(i, n, s) for i, (n, s) in enumerate(zip(names, shapes, strict=True))
        ),
        result=result,
        custom_calls=tuple(
            HloCustomCall(c.name, i.name, i.custom_call_target, bytes(i.backend_config))
            for c, i in _instructions(module)
            if i.custom_call_target
        ),
        output_names=_output_names(root),
        aliases=tuple(
            HloAlias(tuple(int(i) for i in entry.output_shape_index), int(entry.parameter_number))
            for entry in module.input_output_alias.entries
        ),
    )


def _entry_computation(module: Any) -> Any:
    computations = module.computations
    if module.entry_computation_name:
        # The name is field 2, serialized before the computations: if it is set but its
        # computation is missing, the module was cut short.
        for computation in computations:
            if computation.name == module.entry_computation_name:
                return computation
        raise HloFormatError(
            f"entry computation {module.entry_computation_name!r} is missing (truncated file?)"
        )
    for computation in computations:
        if computation.id == module.entry_computation_id:
            return computation
    if len(computations) == 1:
        return computations[0]
    raise HloFormatError("cannot tell which computation is the entry computation")


def _parameter_instructions(computation: Any) -> list[Any]:
    parameters = sorted(
        (i for i in computation.instructions if i.opcode == "parameter"),
        key=lambda i: i.parameter_number,
    )
    numbers = [p.parameter_number for p in parameters]
    if numbers != list(range(len(parameters))):
        raise HloFormatError(
            f"entry computation {computation.name!r} has parameter numbers {numbers}, "
            f"expected 0..{len(parameters) - 1}"
        )
    return parameters


def _parameter_names(declared: Sequence[str], instructions: Sequence[Any]) -> list[str]:
    """Per parameter: the NEFF input name the tracer chose (nkipy's `neff_input_names`
    attribute), else the declared name, else the instruction's name, else `input{i}`.

    (The real nkipy names an input the kernel writes into `x.must_alias_input`, in the
    attribute and the declared names alike; the aliased output is then named `x`.)
    """
    return [
        _attribute(instruction, "neff_input_names")
        or (declared[i] if i < len(declared) else "")
        or instruction.name
        or f"input{i}"
        for i, instruction in enumerate(instructions)
    ]


def _attribute(instruction: Any, key: str) -> str:
    for pair in instruction.frontend_attributes.map:
        if pair.key == key:
            return str(pair.value)
    return ""


def _output_names(root: Any) -> tuple[str, ...]:
    names = _attribute(root, "neff_output_names") if root is not None else ""
    return tuple(names.split(",")) if names else ()


def _shape(proto: Any) -> HloShape:
    return HloShape(
        element_type=int(proto.element_type),
        dims=tuple(int(d) for d in proto.dimensions),
        tuple_shapes=tuple(_shape(child) for child in proto.tuple_shapes),
    )


def _instructions(module: Any) -> Iterator[tuple[Any, Any]]:
    return ((c, i) for c in module.computations for i in c.instructions)


# --- rewriting ---------------------------------------------------------------------------


def rewrite_backend_configs(data: bytes, rewrite: Callable[[str, bytes], bytes | None]) -> bytes:
    """Apply `rewrite(target, backend_config)` to every custom-call; None keeps a config.

    Returns `data` itself when nothing changed: re-serializing may reorder the
    fields this subset does not declare, so bytes are rewritten only when needed.
    """
    module = _parsed(data)
    changed = False
    for _, instruction in _instructions(module):
        if not instruction.custom_call_target:
            continue
        new = rewrite(instruction.custom_call_target, bytes(instruction.backend_config))
        if new is not None and new != instruction.backend_config:
            instruction.backend_config = new
            changed = True
    return module.SerializeToString() if changed else data


def canonical_module(data: bytes, root: str | None = None) -> bytes:
    """The module with its `id` cleared and, given the project `root`, portable source
    paths, in one serialization.

    Tracers number modules per process (JAX counts lowerings), so a worker that
    traces several kernels would give the same kernel different bytes depending
    on what it traced before; the id means nothing to the compiler. Always
    re-serializing (not only when the id was set) makes equal modules equal bytes.

    nkipy records each instruction's `metadata.source_file` as the kernel file's
    absolute path, so the same kernel would hash differently in every checkout. With
    `root`, paths under it become project-relative and other absolute paths their
    basename: what JAX's source-file canonicalization regex does for JAX kernels
    (`nkibuild.toolchain.tracers.portable_source_paths`). Relative paths are kept.
    """
    module = _parsed(data)
    module.id = 0
    for _, instruction in _instructions(module):
        if root is not None and instruction.metadata.source_file:
            metadata = instruction.metadata
            metadata.source_file = portable_source_file(metadata.source_file, root)
    return module.SerializeToString()


def portable_source_file(path: str, root: str) -> str:
    """`path` relative to `root` if under it, else its basename if absolute, else as is."""
    prefix = root.rstrip("/") + "/"
    if path.startswith(prefix):
        return path[len(prefix) :]
    if path.startswith("/"):
        return path.rsplit("/", 1)[-1]
    return path
