"""Build minimal HloModuleProtos for nkibuild's toolchain double.

The fake torch-xla and nkipy (`nkibuild/toolchain_double/fakes/`) dump these where the real
tools dump a traced module. A module here describes the kernel's signature (parameters
by name, the result's shapes, optionally one custom-call as the root), not its
computation. It uses the schema subset of `nkibuild.formats.hlo`, so the build's own
reader parses exactly what the double writes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nkibuild.dtypes import BY_NAME
from nkibuild.formats.hlo import TUPLE_TYPE, message_class

__all__ = ["build_hlo_module"]


def build_hlo_module(
    name: str,
    parameters: Sequence[tuple[str, str, Sequence[int]]],
    results: Sequence[tuple[str, Sequence[int]]],
    custom_call: tuple[str, bytes] | None = None,
) -> bytes:
    """A minimal valid module: parameters, one custom-call (or a copy) as the root.

    Used by nkibuild's toolchain double to stand in for what torch-xla and nkipy dump.
    """
    module = message_class("HloModuleProto")()
    module.name = name
    module.id = 1
    entry = module.computations.add(name=f"{name}.entry", id=1)
    module.entry_computation_name = entry.name
    module.entry_computation_id = entry.id
    program = module.host_program_shape
    for number, (param_name, dtype, dims) in enumerate(parameters):
        shape = _array_shape(dtype, dims)
        entry.instructions.add(
            name=param_name, opcode="parameter", parameter_number=number, id=number + 1
        ).shape.CopyFrom(shape)
        program.parameters.add().CopyFrom(shape)
        program.parameter_names.append(param_name)
    result = _result_shape(results)
    root = entry.instructions.add(name="root", id=len(parameters) + 1)
    root.operand_ids.extend(range(1, len(parameters) + 1))
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
