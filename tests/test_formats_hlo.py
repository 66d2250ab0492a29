"""nkibuild.formats.hlo on real HLO modules lowered by JAX, and on broken bytes."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nkibuild.dtypes import BY_NAME
from nkibuild.formats.hlo import (
    HloFormatError,
    HloModuleInfo,
    HloShape,
    canonical_module,
    portable_source_file,
    read_hlo,
    read_hlo_file,
)

F32, S32, PRED, TUPLE = 11, 4, 1, 13


def lower(
    fn: Callable[..., Any], *specs: Any, static_argnames: tuple[str, ...] = (), **static: Any
) -> bytes:
    """Serialized HloModuleProto of `fn` as JAX lowers it for CPU."""
    jax = pytest.importorskip("jax")
    lowered = jax.jit(fn, static_argnames=static_argnames).lower(*specs, **static)
    return lowered.compiler_ir("hlo").as_serialized_hlo_module_proto()


def spec(shape: tuple[int, ...], dtype: str) -> Any:
    jax = pytest.importorskip("jax")
    return jax.ShapeDtypeStruct(shape, dtype)


def top_level_fields(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each top-level field, by a wire walker of our own."""

    def varint(pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = data[pos]
            value |= (byte & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if byte < 0x80:
                return value, pos

    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = varint(pos)
        if tag & 7 == 0:
            _, pos = varint(pos)
        elif tag & 7 == 2:
            length, pos = varint(pos)
            pos += length
        else:
            raise AssertionError(f"unexpected wire type {tag & 7}")
        yield tag >> 3, start, pos


def without_field(data: bytes, number: int) -> bytes:
    return b"".join(data[s:e] for n, s, e in top_level_fields(data) if n != number)


@pytest.fixture(scope="module")
def matmul_pb() -> bytes:
    def matmul(x: Any, y: Any) -> Any:
        return x @ y

    return lower(matmul, spec((128, 256), "float32"), spec((256, 128), "float32"))


def test_reads_f32_matmul_signature(matmul_pb: bytes) -> None:
    info = read_hlo(matmul_pb)
    assert info.name == "jit_matmul"
    assert info.entry_computation_name.startswith("main")
    assert [(p.index, p.name, p.shape.dtype, p.shape.dims) for p in info.parameters] == [
        (0, "p0", "float32", (128, 256)),
        (1, "p1", "float32", (256, 128)),
    ]
    assert info.result == HloShape(F32, (128, 128))
    assert not info.result.is_tuple
    assert info.outputs() == (info.result,)
    assert str(info.result) == "float32[128,128]"
    assert info.custom_calls == ()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int32", "bool", "float32"])
def test_element_types(dtype: str) -> None:
    info = read_hlo(lower(lambda x: x[::-1], spec((8, 3), dtype)))
    (param,) = info.parameters
    assert param.shape.dtype == dtype
    assert param.shape.element_type == BY_NAME[dtype].hlo_type
    assert info.result == HloShape(BY_NAME[dtype].hlo_type, (8, 3))


def test_tuple_result_flattens_in_order() -> None:
    def several(x: Any) -> Any:
        return x + 1, (x.astype("int32"), x.sum())

    info = read_hlo(lower(several, spec((3, 4), "float32")))
    assert info.result.is_tuple
    assert info.result.dtype == "tuple"
    assert info.outputs() == (HloShape(F32, (3, 4)), HloShape(S32, (3, 4)), HloShape(F32, ()))
    # JAX flattens nested Python tuples into one result tuple.
    assert str(info.result) == "(float32[3,4], int32[3,4], float32[])"


def test_static_arguments_are_not_parameters() -> None:
    def head(x: Any, *, n: int) -> Any:
        return x[:n] * 2

    for n in (2, 5):
        info = read_hlo(lower(head, spec((8, 4), "float32"), static_argnames=("n",), n=n))
        assert [p.shape for p in info.parameters] == [HloShape(F32, (8, 4))]
        assert info.result == HloShape(F32, (n, 4))


def test_parameter_names_fall_back_to_instructions(matmul_pb: bytes) -> None:
    info = read_hlo(matmul_pb)
    derived = read_hlo(without_field(matmul_pb, 4))  # drop host_program_shape
    assert [p.shape for p in derived.parameters] == [p.shape for p in info.parameters]
    assert derived.result == info.result
    # JAX names the parameter instructions after the Python arguments (x.1, y.1).
    assert [p.name.split(".")[0] for p in derived.parameters] == ["x", "y"]


def test_custom_calls_in_nested_computations() -> None:
    jnp = pytest.importorskip("jax.numpy")
    pb = lower(lambda x: jnp.linalg.cholesky(x), spec((4, 4), "float32"))
    info = read_hlo(pb)
    (call,) = info.custom_calls
    assert "potrf" in call.target
    assert call.computation != info.entry_computation_name
    assert call.instruction
    assert isinstance(call.backend_config, bytes)
    assert info.result == HloShape(F32, (4, 4))


# --- hand-encoded modules: shapes JAX does not produce -----------------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(raw)) + raw


def _shape(element_type: int, *dims: int, tuple_shapes: tuple[bytes, ...] = ()) -> bytes:
    packed = b"".join(_varint(d) for d in dims)
    return (
        _field(2, element_type)
        + (_field(3, packed) if dims else b"")
        + b"".join(_field(4, t) for t in tuple_shapes)
    )


def _instruction(iid: int, opcode: str, shape: bytes, name: str = "", **extra: Any) -> bytes:
    out = _field(1, name) + _field(2, opcode) + _field(3, shape) + _field(35, iid)
    if "parameter_number" in extra:
        out += _field(9, extra["parameter_number"])
    if "target" in extra:
        out += _field(28, extra["target"]) + _field(43, extra["config"])
    return out


def _module(*instructions: bytes, root_id: int, entry_name: str = "entry") -> bytes:
    computation = (
        _field(1, "entry") + b"".join(_field(2, i) for i in instructions) + _field(6, root_id)
    )
    return _field(1, "handmade") + _field(2, entry_name) + _field(3, computation)


def test_hand_encoded_module_without_host_program_shape() -> None:
    f8 = 99  # not in our enum table: an open proto3 enum keeps the number
    pb = _module(
        _instruction(1, "parameter", _shape(f8, 16), parameter_number=1),
        _instruction(2, "parameter", _shape(F32, 2, 3), name="weights", parameter_number=0),
        _instruction(
            3, "custom-call", _shape(PRED), target="AwsNeuronCustomNativeKernel", config=b"\xff\x00"
        ),
        _instruction(4, "tuple", _shape(TUPLE, tuple_shapes=(_shape(PRED), _shape(F32, 2)))),
        root_id=4,
    )
    info = read_hlo(pb)
    assert [(p.name, p.shape) for p in info.parameters] == [
        ("weights", HloShape(F32, (2, 3))),
        ("input1", HloShape(f8, (16,))),
    ]
    assert info.parameters[1].shape.dtype == "hlo-type-99"
    assert info.outputs() == (HloShape(PRED, ()), HloShape(F32, (2,)))
    assert [(c.target, c.backend_config) for c in info.custom_calls] == [
        ("AwsNeuronCustomNativeKernel", b"\xff\x00")
    ]


def test_hand_encoded_module_errors() -> None:
    param = _instruction(1, "parameter", _shape(F32, 2), parameter_number=0)
    with pytest.raises(HloFormatError, match="no computations"):
        read_hlo(_field(1, "empty module"))
    with pytest.raises(HloFormatError, match="'main' is missing"):
        read_hlo(_module(param, root_id=1, entry_name="main"))
    with pytest.raises(HloFormatError, match="no root instruction"):
        read_hlo(_module(param, root_id=7))
    gap = _instruction(1, "parameter", _shape(F32, 2), parameter_number=1)
    with pytest.raises(HloFormatError, match="parameter numbers"):
        read_hlo(_module(gap, root_id=1))


def test_shape_helpers() -> None:
    nested = HloShape(TUPLE, (), (HloShape(F32, (2,)), HloShape(TUPLE, (), (HloShape(S32, ()),))))
    assert nested.leaves() == (HloShape(F32, (2,)), HloShape(S32, ()))
    assert str(nested) == "(float32[2], (int32[]))"
    assert HloShape(TUPLE, ()).leaves() == ()


# --- broken input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xff" * 64,
        b"hello, this is not a protobuf",
        bytes(random.Random(1).getrandbits(8) for _ in range(4096)),
        b"\x1f\x8b\x08\x00" + bytes(200),  # a gzip header
    ],
    ids=["empty", "nul", "ff", "text", "random", "gzip"],
)
def test_garbage_is_a_format_error(data: bytes) -> None:
    with pytest.raises(HloFormatError):
        read_hlo(data)


def test_truncation_never_passes_silently(matmul_pb: bytes) -> None:
    full = read_hlo(matmul_pb)
    boundaries = {end for _, _, end in top_level_fields(matmul_pb)}
    for cut in range(len(matmul_pb)):
        try:
            info = read_hlo(matmul_pb[:cut])
        except HloFormatError:
            continue
        # Only a cut between top-level fields can parse; the signature must then be intact.
        assert cut in boundaries, cut
        assert _signature(info) == _signature(full), cut


def _signature(info: HloModuleInfo) -> tuple[object, ...]:
    return tuple(p.shape for p in info.parameters), info.result


def test_file_errors_name_the_file(tmp_path: Path, matmul_pb: bytes) -> None:
    good = tmp_path / "model.hlo_module.pb"
    good.write_bytes(matmul_pb)
    assert read_hlo_file(good) == read_hlo(matmul_pb)
    bad = tmp_path / "broken.pb"
    bad.write_bytes(matmul_pb[:100])
    with pytest.raises(HloFormatError, match=r"broken\.pb"):
        read_hlo_file(bad)
    with pytest.raises(HloFormatError, match=r"missing\.pb"):
        read_hlo_file(tmp_path / "missing.pb")


def test_float8_e4m3_is_element_type_28() -> None:
    # What the real nkipy traces ml_dtypes.float8_e4m3 as (xla F8E4M3).
    pb = _module(
        _instruction(1, "parameter", _shape(28, 8), name="q", parameter_number=0), root_id=1
    )
    (parameter,) = read_hlo(pb).parameters
    assert (parameter.shape.dtype, BY_NAME["float8_e4m3"].hlo_type) == ("float8_e4m3", 28)


# --- canonical_module: portable source paths -------------------------------------------------


def _metadata(source_file: str, line: int) -> bytes:
    """OpMetadata: op_type=1, op_name=2, source_file=3, source_line=4 (xla_data.proto)."""
    return _field(1, "NKIPy_Op") + _field(3, source_file) + _field(4, line)


def _traced(root: str, helper: str = "/usr/lib/python3/site-packages/nkipy/ops.py") -> bytes:
    """A module shaped like the real nkipy's: absolute paths in every op's metadata."""
    param = _instruction(1, "parameter", _shape(F32, 4), name="x", parameter_number=0)
    add = _instruction(2, "add", _shape(F32, 4), name="op0") + _field(
        7, _metadata(f"{root}/kernels/k.py", 3)
    )
    other = _instruction(3, "multiply", _shape(F32, 4), name="op1") + _field(
        7, _metadata(helper, 10)
    )
    relative = _instruction(4, "negate", _shape(F32, 4), name="op2") + _field(
        7, _metadata("kernels/rel.py", 5)
    )
    # Field 68 (frontend_attributes) is not in nkibuild's schema subset: it must survive.
    attributes = _field(68, _field(1, _field(1, "neff_input_names") + _field(2, "x")))
    return _field(5, 41) + _module(param + attributes, add, other, relative, root_id=4)


def test_canonical_module_makes_source_paths_portable() -> None:
    first = canonical_module(_traced("/home/ann/proj"), root="/home/ann/proj")
    second = canonical_module(_traced("/srv/ci/checkout-2"), root="/srv/ci/checkout-2/")
    assert first == second  # same kernel, two checkouts: the same bytes (and cache key)
    assert b"/home/ann" not in first and b"site-packages" not in first
    for kept in (b"kernels/k.py", b"ops.py", b"kernels/rel.py", b"NKIPy_Op", b"neff_input_names"):
        assert kept in first
    assert read_hlo(first).parameters == read_hlo(_traced("/x")).parameters


def test_canonical_module_keeps_paths_without_a_root() -> None:
    plain = canonical_module(_traced("/home/ann/proj"))
    assert b"/home/ann/proj/kernels/k.py" in plain
    assert plain != canonical_module(_traced("/srv/ci/checkout-2"))
    # The module id is cleared either way (JAX numbers its lowerings).
    assert all(number != 5 for number, _, _ in top_level_fields(plain))


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/p/root/kernels/k.py", "kernels/k.py"),
        ("/p/rootless/k.py", "k.py"),  # a sibling sharing the prefix is not under root
        ("/elsewhere/k.py", "k.py"),
        ("kernels/k.py", "kernels/k.py"),
        ("<string>", "<string>"),
    ],
)
def test_portable_source_file(path: str, expected: str) -> None:
    assert portable_source_file(path, "/p/root") == expected


def _attributes(**pairs: str) -> bytes:
    """FrontendAttributes (field 68 of an instruction): map<string, string> entries."""
    return _field(68, b"".join(_field(1, _field(1, k) + _field(2, v)) for k, v in pairs.items()))


def test_names_and_aliases_the_tracer_chose() -> None:
    # As the real nkipy writes a kernel that writes into its input `acc`.
    param = _instruction(1, "parameter", _shape(F32, 4), name="acc", parameter_number=0)
    param += _attributes(neff_input_names="acc.must_alias_input")
    other = _instruction(2, "parameter", _shape(F32, 4), name="x", parameter_number=1)
    root = _instruction(3, "tuple", _shape(TUPLE, tuple_shapes=(_shape(F32, 4), _shape(F32, 4))))
    root += _attributes(neff_output_names="output0,acc")
    alias = _field(8, _field(1, _field(1, _varint(1)) + _field(2, 0)))  # result[1] -> param 0
    info = read_hlo(_module(param, other, root, root_id=3) + alias)
    assert [p.name for p in info.parameters] == ["acc.must_alias_input", "x"]
    assert info.output_names == ("output0", "acc")
    assert [(a.output_shape_index, a.parameter) for a in info.aliases] == [((1,), 0)]
    plain = read_hlo(_module(other.replace(_field(9, 1), _field(9, 0)), root_id=2))
    assert (plain.output_names, plain.aliases) == ((), ())
