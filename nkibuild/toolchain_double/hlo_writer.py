"""Build minimal HloModuleProtos for nkibuild's toolchain double.

The fake torch-xla and nkipy (`nkibuild/toolchain_double/`) dump these where the real
tools dump a traced module. A module here describes the kernel's signature (parameters
by name, the result's shapes, optionally one custom-call as the root). The double cannot
trace a computation op by op, so a module the fake nkipy writes also carries an `Origin`:
a digest of the kernel's code and its constants' values, so that the module changes
whenever the real tracer's would (see `../shared/testdata/hlo/nkipy/`). It uses the
schema subset of `nkibuild.formats.hlo`, so the build's own reader parses exactly what
the double writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nkibuild.dtypes import BY_NAME
from nkibuild.formats.hlo import TUPLE_TYPE, message_class

# The op_type the real nkipy writes into each traced instruction's metadata.
TRACED_OP_TYPE = "NKIPy_Op"


@dataclass(frozen=True)
class Origin:
    """What a traced module records of the code it came from.

    As in the real nkipy's modules, every instruction computed from the kernel names the
    kernel's file (absolute: the build makes it project-relative) and line in its
    metadata. `code_digest` stands for the computation the double does not trace, and
    each constant becomes a `constant` instruction whose metadata holds its value.
    """

    source_file: str
    source_line: int
    code_digest: str
    constants: tuple[tuple[str, str], ...] = ()  # (name, value as JSON)
    # The NEFF's output names and (result index, parameter) aliases, as nkipy records
    # them: in `neff_output_names` / `neff_input_names` attributes and the alias table.
    output_names: tuple[str, ...] = ()
    aliases: tuple[tuple[int, int], ...] = ()


def build_hlo_module(
    name: str,
    parameters: Sequence[tuple[str, str, Sequence[int]]],
    results: Sequence[tuple[str, Sequence[int]]],
    custom_call: tuple[str, bytes] | None = None,
    *,
    origin: Origin | None = None,
) -> bytes:
    """A minimal valid module: parameters, the `origin`'s constants, one custom-call (or
    a copy) of them all as the root."""
    module = message_class("HloModuleProto")()
    module.name = name
    module.id = 1
    entry = module.computations.add(name=f"{name}.entry", id=1)
    module.entry_computation_name = entry.name
    module.entry_computation_id = entry.id
    program = module.host_program_shape
    for number, (param_name, dtype, dims) in enumerate(parameters):
        shape = _array_shape(dtype, dims)
        parameter = entry.instructions.add(
            name=param_name, opcode="parameter", parameter_number=number, id=number + 1
        )
        parameter.shape.CopyFrom(shape)
        if origin is not None:
            parameter.frontend_attributes.map.add(key="neff_input_names", value=param_name)
        program.parameters.add().CopyFrom(shape)
        program.parameter_names.append(param_name)
    for constant_name, value in origin.constants if origin is not None else ():
        constant = entry.instructions.add(
            name=f"constant.{constant_name}", opcode="constant", id=len(entry.instructions) + 1
        )
        constant.shape.element_type = TUPLE_TYPE  # no literal: the value is in the metadata
        _set_metadata(constant, origin, f"{constant_name}={value}")
    result = _result_shape(results)
    root = entry.instructions.add(name="root", id=len(entry.instructions) + 1)
    root.operand_ids.extend(range(1, len(entry.instructions)))
    if origin is not None:
        _set_metadata(root, origin, f"kernel_code:{origin.code_digest}")
        names = ",".join(origin.output_names)
        root.frontend_attributes.map.add(key="neff_output_names", value=names)
        for result_index, parameter_number in origin.aliases:
            module.input_output_alias.entries.add(
                output_shape_index=[result_index], parameter_number=parameter_number
            )
    if custom_call is not None:
        root.opcode, root.custom_call_target = "custom-call", custom_call[0]
        root.backend_config = custom_call[1]
    else:
        root.opcode = "copy" if parameters else "constant"
    root.shape.CopyFrom(result)
    entry.root_id = root.id
    program.result.CopyFrom(result)
    return module.SerializeToString()


def _array_shape(dtype: str, dims: Sequence[int]) -> Any:
    shape = message_class("ShapeProto")()
    shape.element_type = BY_NAME[dtype].hlo_type
    shape.dimensions.extend(int(d) for d in dims)
    return shape


def _result_shape(results: Sequence[tuple[str, Sequence[int]]]) -> Any:
    if len(results) == 1:
        return _array_shape(*results[0])
    shape = message_class("ShapeProto")()
    shape.element_type = TUPLE_TYPE
    for dtype, dims in results:
        shape.tuple_shapes.add().CopyFrom(_array_shape(dtype, dims))
    return shape


def _set_metadata(instruction: Any, origin: Origin, op_name: str) -> None:
    metadata = instruction.metadata
    metadata.op_type, metadata.op_name = TRACED_OP_TYPE, op_name
    metadata.source_file, metadata.source_line = origin.source_file, origin.source_line
