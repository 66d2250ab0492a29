"""nkibuild.formats.neff: the reader against a NEFF from a real neuronx-cc (golden), against
hand-assembled and broken containers; the toolchain double's writer against an
independent parse."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from golden_data import golden_path
from hypothesis import given, settings
from hypothesis import strategies as st

from nkibuild.dtypes import compatible_in_neff
from nkibuild.formats.neff import NeffFormatError, NeffInfo, NeffTensor, read_neff
from nkibuild.toolchain_double.neff_writer import write_neff

# A NEFF compiled by a real neuronx-cc 2.23 (../shared/testdata/neff/README.md).
GOLDEN = "neff/matmul_small.neff"

INPUTS = (NeffTensor("x", "float16", (128, 256)), NeffTensor("y", "float16", (256, 128)))
OUTPUTS = (NeffTensor("output0", "float16", (128, 128)), NeffTensor("output1", "bfloat16", ()))


def write(path: Path, **overrides: Any) -> bytes:
    kwargs: dict[str, Any] = {
        "compiler_version": "2.23.6484.0+3b612583",
        "inputs": INPUTS,
        "outputs": OUTPUTS,
        "num_tpb": 2,
        "placeholder": True,
    }
    write_neff(path, **(kwargs | overrides))
    return path.read_bytes()


@pytest.fixture()
def neff_bytes(tmp_path: Path) -> bytes:
    return write(tmp_path / "model.neff")


# --- an independent container builder -------------------------------------------------------


def md5_words(payload: bytes) -> tuple[int, ...]:
    """The documented layout: the big-endian digest read as four u32 words."""
    digest = hashlib.md5(payload).digest()
    return tuple(int.from_bytes(digest[i : i + 4], "big") for i in range(0, 16, 4))


def assemble(
    members: dict[str, bytes],
    *,
    build: bytes = b"2.23.6484.0",
    compress: bool = True,
    md5: tuple[int, ...] | None = None,
    packaging: int = 2,
) -> bytes:
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    payload = gzip.compress(tar_buffer.getvalue()) if compress else tar_buffer.getvalue()
    header = (
        struct.pack("<5Q", packaging, 1024, len(payload), 2, 0)
        + build.ljust(128, b"\0")
        + struct.pack("<I4I", 1, *(md5_words(payload) if md5 is None else md5))
        + bytes(16)
        + uuid.UUID(int=7).bytes
        + b"file.neff".ljust(256, b"\0")
    )
    return header.ljust(1024, b"\0") + payload


def real_like_members(**replace: Any) -> dict[str, bytes]:
    """Members shaped like a real compiler's NEFF (extra fields, a const tensor)."""
    tensor_map = {
        "output10": {"kind": "output", "dtype": "float32", "tf_shape": [1], "is_const": False},
        "x": {"kind": "input", "dtype": "float16", "tf_shape": [128, 256], "is_const": False},
        "weights": {"kind": "input", "dtype": "float16", "tf_shape": [4], "is_const": True},
        "output2": {
            "kind": "output",
            "dtype": "float16",
            "tf_shape": [128, 128],
            "is_const": False,
        },
        "folded": {"kind": "output", "dtype": "float16", "tf_shape": [2], "is_const": True},
    }
    inputs = {
        "y": {"id": 1, "dtype": "float16", "shape": [256, 128]},
        "x": {"id": 0, "dtype": "float16", "shape": [128, 256]},
    }
    members: dict[str, Any] = {
        "info.json": {"tool_version": "2.23.6484.0+3b612583", "num_tpb": 1, "other": 1},
        "neff.json": {"metadata": {"signatures": {"default": {"inputs": inputs}}}},
        "kelf-0.json": {"graphs": [{"name": "sg00", "more": "stuff"}]},
        "sg00/tensor_map.json": tensor_map,
        "sg00/def.json": {},
    }
    members |= replace
    return {k: json.dumps(v).encode() for k, v in members.items() if v is not None}


# --- writer -------------------------------------------------------------------------------


def test_roundtrip(neff_bytes: bytes) -> None:
    info = read_neff(neff_bytes)
    assert info.inputs == INPUTS
    assert info.outputs == OUTPUTS
    assert info.compiler_version == "2.23.6484.0+3b612583"
    assert info.num_tpb == 2
    assert info.subgraphs == ("sg00", "sg01")
    assert info.placeholder
    assert info.checksum_ok
    assert info.name == "file.neff"
    assert info.payload_size == len(neff_bytes) - 1024
    assert info.to_json()["inputs"][0] == {"name": "x", "dtype": "float16", "shape": [128, 256]}
    assert json.loads(json.dumps(info.to_json())) == info.to_json()


def test_header_fields_at_documented_offsets(neff_bytes: bytes) -> None:
    payload = neff_bytes[1024:]
    assert struct.unpack_from("<Q", neff_bytes, 0) == (2,)
    assert struct.unpack_from("<Q", neff_bytes, 8) == (1024,)
    assert struct.unpack_from("<Q", neff_bytes, 16) == (len(neff_bytes) - 1024,)
    assert struct.unpack_from("<QQ", neff_bytes, 24) == read_neff(neff_bytes).format_version
    assert neff_bytes[40:168].rstrip(b"\0") == b"nkibuild-toolchain-double placeholder"
    assert struct.unpack_from("<I", neff_bytes, 168) == (2,)
    assert struct.unpack_from("<4I", neff_bytes, 172) == md5_words(payload)
    # Equivalently: each 4-byte group of the digest is stored reversed.
    digest = hashlib.md5(payload).digest()
    assert neff_bytes[172:188] == b"".join(digest[i : i + 4][::-1] for i in range(0, 16, 4))
    assert str(uuid.UUID(bytes=neff_bytes[204:220])) == read_neff(neff_bytes).uuid
    assert neff_bytes[220:476].rstrip(b"\0") == b"file.neff"
    assert payload[:2] == b"\x1f\x8b"  # gzip


def test_payload_members(neff_bytes: bytes) -> None:
    with tarfile.open(fileobj=io.BytesIO(neff_bytes[1024:]), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        data = {name: tar.extractfile(m).read() for name, m in members.items()}  # type: ignore[union-attr]
    assert sorted(members) == [
        "PLACEHOLDER.txt",
        "info.json",
        "kelf-0.json",
        "neff.json",
        "sg00/tensor_map.json",
        "sg01/tensor_map.json",
    ]
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 for m in members.values())
    assert b"no executable code" in data["PLACEHOLDER.txt"]
    info = json.loads(data["info.json"])
    assert info["nkibuild_placeholder"] is True
    assert info["num_tpb"] == 2
    inputs = json.loads(data["neff.json"])["metadata"]["signatures"]["default"]["inputs"]
    assert inputs["y"] == {"id": 1, "dtype": "float16", "shape": [256, 128]}
    assert [g["name"] for g in json.loads(data["kelf-0.json"])["graphs"]] == ["sg00", "sg01"]
    tensor_map = json.loads(data["sg01/tensor_map.json"])
    assert tensor_map["output1"] == {
        "kind": "output",
        "dtype": "bfloat16",
        "tf_shape": [],
        "is_const": False,
    }
    assert tensor_map["x"]["kind"] == "input"


def test_writes_are_byte_deterministic(tmp_path: Path) -> None:
    first = write(tmp_path / "a.neff", extra_members={"notes/x.json": b"{}"})
    second = write(tmp_path / "b.neff", extra_members={"notes/x.json": b"{}"})
    assert first == second
    other = write(tmp_path / "c.neff", inputs=INPUTS[:1])
    assert other != first
    assert read_neff(other).uuid != read_neff(first).uuid
    assert list(tmp_path.iterdir()) != [] and not list(tmp_path.glob(".*.tmp"))


def test_non_placeholder_and_uncompressed(tmp_path: Path) -> None:
    data = write(tmp_path / "n.neff", placeholder=False, compress=False, num_tpb=1)
    info = read_neff(data)
    assert not info.placeholder
    assert info.build == "nkibuild"
    assert info.subgraphs == ("sg00",)
    assert data[1024 + 257 : 1024 + 262] == b"ustar"  # a plain tar payload


def test_placeholder_build_string_keeps_the_marker(tmp_path: Path) -> None:
    info = read_neff(write(tmp_path / "p.neff", build="custom 1.0"))
    assert info.build == "nkibuild-toolchain-double placeholder custom 1.0"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"inputs": (NeffTensor("x", "float16", (1,)), NeffTensor("x", "float16", (1,)))}, "x"),
        ({"outputs": (NeffTensor("x", "float32", (1,)),)}, "unique"),
        ({"inputs": (NeffTensor("x", "complex64", (1,)),)}, "complex64"),
        ({"extra_members": {"info.json": b"{}"}}, "reserved"),
        ({"extra_members": {"../escape": b""}}, "escape"),
        ({"num_tpb": 0}, "num_tpb"),
        ({"name": "n" * 300}, "name"),
    ],
)
def test_writer_rejects_bad_arguments(tmp_path: Path, overrides: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write(tmp_path / "bad.neff", **overrides)
    assert list(tmp_path.iterdir()) == []


# --- reader -------------------------------------------------------------------------------


def test_reads_real_like_container() -> None:
    info = read_neff(assemble(real_like_members()))
    assert [t.name for t in info.inputs] == ["x", "y"]  # by id, not map order
    assert [t.name for t in info.outputs] == ["output2", "output10"]  # numeric, consts dropped
    assert info.outputs[0] == NeffTensor("output2", "float16", (128, 128))
    assert info.num_tpb == 1
    assert not info.placeholder
    assert info.uuid == str(uuid.UUID(int=7))


def test_reads_dot_slash_member_names_and_uncompressed_payload() -> None:
    members = {f"./{name}": data for name, data in real_like_members().items()}
    info = read_neff(assemble(members, compress=False))
    assert [t.name for t in info.inputs] == ["x", "y"]


@pytest.mark.parametrize(
    ("members", "build"),
    [
        (
            real_like_members(**{"info.json": {"tool_version": "x", "nkibuild_placeholder": True}}),
            b"x",
        ),
        ({**real_like_members(), "PLACEHOLDER.txt": b"fake"}, b"x"),
        (real_like_members(), b"nkibuild-toolchain-double placeholder v1"),
    ],
    ids=["info.json", "member", "build"],
)
def test_each_placeholder_marker_is_detected(members: dict[str, bytes], build: bytes) -> None:
    assert read_neff(assemble(members, build=build)).placeholder


@pytest.mark.parametrize(
    ("members", "message"),
    [
        (real_like_members(**{"info.json": None}), "no member info.json"),
        (real_like_members(**{"sg00/tensor_map.json": None}), "sg00/tensor_map.json"),
        (real_like_members(**{"kelf-0.json": {"graphs": []}}), "no subgraphs"),
        (
            real_like_members(**{"neff.json": None, "sg00/tensor_map.json": None}),
            "no tensor map",
        ),
        (real_like_members(**{"info.json": [1, 2]}), "not a JSON object"),
        ({**real_like_members(), "neff.json": b"{not json"}, "not valid JSON"),
        (
            real_like_members(
                **{
                    "neff.json": {
                        "metadata": {
                            "signatures": {
                                "default": {
                                    "inputs": {"x": {"id": 0, "dtype": "float16", "shape": [-1]}}
                                }
                            }
                        }
                    }
                }
            ),
            "shape",
        ),
    ],
    ids=["info", "tensor-map", "graphs", "no-map-at-all", "not-object", "json", "shape"],
)
def test_bad_members_are_format_errors(members: dict[str, bytes], message: str) -> None:
    with pytest.raises(NeffFormatError, match=message):
        read_neff(assemble(members))


def test_checksum_mismatch(neff_bytes: bytes) -> None:
    # Byte 4 of a gzip stream is its mtime: changing it leaves the payload readable.
    corrupt = bytearray(neff_bytes)
    corrupt[1024 + 4] ^= 0x55
    with pytest.raises(NeffFormatError, match="MD5"):
        read_neff(bytes(corrupt))
    info = read_neff(bytes(corrupt), verify_checksum=False)
    assert not info.checksum_ok
    assert info.inputs == INPUTS


def test_any_corrupted_payload_byte_is_caught(neff_bytes: bytes) -> None:
    for offset in range(1024, len(neff_bytes)):
        corrupt = bytearray(neff_bytes)
        corrupt[offset] ^= 0xFF
        with pytest.raises(NeffFormatError, match="MD5"):
            read_neff(bytes(corrupt))
        try:
            info = read_neff(bytes(corrupt), verify_checksum=False)
        except NeffFormatError:
            continue
        assert not info.checksum_ok


def test_truncation_at_every_offset_is_an_error(neff_bytes: bytes) -> None:
    for cut in range(len(neff_bytes)):
        with pytest.raises(NeffFormatError):
            read_neff(neff_bytes[:cut], verify_checksum=False)


def test_wrong_size_fields(neff_bytes: bytes) -> None:
    padded = neff_bytes + b"\0"
    with pytest.raises(NeffFormatError, match="payload size"):
        read_neff(padded)
    bad_header = bytearray(neff_bytes)
    struct.pack_into("<Q", bad_header, 8, 512)
    with pytest.raises(NeffFormatError, match="header size"):
        read_neff(bytes(bad_header))


def test_valid_header_around_a_non_archive() -> None:
    payload = b"definitely not a tar archive" * 40
    data = assemble({})[:1024]
    header = bytearray(data)
    struct.pack_into("<Q", header, 16, len(payload))
    struct.pack_into("<4I", header, 172, *md5_words(payload))
    with pytest.raises(NeffFormatError, match="tar"):
        read_neff(bytes(header) + payload)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.binary(max_size=3000))
def test_garbage_is_a_format_error(data: bytes) -> None:
    with pytest.raises(NeffFormatError):
        read_neff(data)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.binary(min_size=1, max_size=2000))
def test_garbage_payload_with_valid_header_is_a_format_error(payload: bytes) -> None:
    header = bytearray(assemble({})[:1024])
    struct.pack_into("<Q", header, 16, len(payload))
    struct.pack_into("<4I", header, 172, *md5_words(payload))
    with pytest.raises(NeffFormatError):
        read_neff(bytes(header) + payload)


def test_file_errors_name_the_file(tmp_path: Path, neff_bytes: bytes) -> None:
    path = tmp_path / "model.neff"
    path.write_bytes(neff_bytes[:1500])
    with pytest.raises(NeffFormatError, match=r"model\.neff"):
        read_neff(path)
    with pytest.raises(NeffFormatError, match=r"absent\.neff"):
        read_neff(tmp_path / "absent.neff")
    path.write_bytes(neff_bytes)
    assert isinstance(read_neff(str(path)), NeffInfo)


# --- a NEFF from a real neuronx-cc ----------------------------------------------------------


@pytest.fixture(scope="module")
def golden() -> bytes:
    return golden_path(GOLDEN).read_bytes()


def test_golden_neff_from_a_real_compiler(golden: bytes) -> None:
    info = read_neff(golden)  # verifies the checksum: a mismatch would raise
    assert info.compiler_version == "2.23.6484.0+3b612583"
    assert (info.packaging_version, info.format_version) == (2, (2, 0))
    assert (info.checksum, info.checksum_ok, info.warnings) == ("ok", True, ())
    assert info.subgraphs == ("sg00", "sg01")
    assert info.num_tpb == 1  # two subgraphs, one core: subgraphs do not count cores
    assert info.inputs == (
        NeffTensor("x", "float16", (128, 256)),
        NeffTensor("y", "float16", (256, 128)),
    )
    assert info.outputs == (NeffTensor("output0", "float16", (128, 128)),)
    assert not info.placeholder
    assert info.name == "file.neff" and info.payload_size == len(golden) - 1024


def test_golden_neff_bytes_at_documented_offsets(golden: bytes) -> None:
    # Independently of the reader: the checksum layout and header fields of a real file.
    assert struct.unpack_from("<4I", golden, 172) == md5_words(golden[1024:])
    assert struct.unpack_from("<5Q", golden) == (2, 1024, len(golden) - 1024, 2, 0)
    assert struct.unpack_from("<I", golden, 168) == (1,)


# --- tolerance for NEFF layouts the reader has not seen -----------------------------------


def test_inputs_fall_back_to_the_tensor_map_without_a_signature() -> None:
    tensor_map = {
        "input10": {"kind": "input", "dtype": "int8", "tf_shape": [3], "is_const": False},
        "output0": {"kind": "output", "dtype": "float32", "tf_shape": [2], "is_const": False},
        "input2": {"kind": "input", "dtype": "float32", "tf_shape": [2], "is_const": False},
        "w": {"kind": "input", "dtype": "float32", "tf_shape": [9], "is_const": True},
        "named": {"kind": "input", "dtype": "uint8", "tf_shape": [1], "is_const": False},
    }
    for neff_json in (None, {"metadata": {}}, {"nodes": []}):
        members = real_like_members(**{"neff.json": neff_json, "sg00/tensor_map.json": tensor_map})
        info = read_neff(assemble(members))
        assert [(t.name, t.dtype, t.shape) for t in info.inputs] == [
            ("input2", "float32", (2,)),
            ("input10", "int8", (3,)),
            ("named", "uint8", (1,)),
        ]
        (warning,) = info.warnings
        assert "neff.json" in warning and "tensor map" in warning


def test_subgraphs_under_an_sglnk_prefix() -> None:
    members = real_like_members()
    members = {
        (f"sgLnk/{name}" if name.startswith("sg00/") else name): data
        for name, data in members.items()
    }
    members["kelf-0.json"] = json.dumps({"graphs": [{"name": "sgLnk/sg00"}]}).encode()
    info = read_neff(assemble(members))
    assert info.subgraphs == ("sg00",)
    assert [t.name for t in info.outputs] == ["output2", "output10"]
    # kelf entries without names: the subgraph directories present, prefix or not.
    members["kelf-0.json"] = json.dumps({"graphs": [{"definition": "x"}]}).encode()
    assert read_neff(assemble(members)).subgraphs == ("sg00",)


@pytest.mark.parametrize(
    ("md5", "packaging", "reason"),
    [((0, 0, 0, 0), 2, "MD5 field is empty"), ((1, 2, 3, 4), 3, "packaging version 3")],
    ids=["empty-field", "unknown-packaging"],
)
def test_a_checksum_that_cannot_be_verified_is_a_warning(
    md5: tuple[int, ...], packaging: int, reason: str
) -> None:
    info = read_neff(assemble(real_like_members(), md5=md5, packaging=packaging))
    assert (info.checksum, info.checksum_ok) == ("unverified", True)
    (warning,) = info.warnings
    assert "checksum not verified" in warning and reason in warning
    assert [t.name for t in info.inputs] == ["x", "y"]


def test_a_documented_checksum_that_differs_is_still_a_mismatch() -> None:
    data = assemble(real_like_members(), md5=(1, 2, 3, 4))
    with pytest.raises(NeffFormatError, match="MD5"):
        read_neff(data)
    info = read_neff(data, verify_checksum=False)
    assert (info.checksum, info.checksum_ok, info.warnings) == ("mismatch", False, ())


# --- dtypes as neuronx-cc stores them -------------------------------------------------------


def test_the_double_stores_fp8_as_int8_and_bool_as_uint8(tmp_path: Path) -> None:
    declared = {"q": "float8_e4m3", "r": "float8_e5m2", "s": "float8_e4m3fn", "m": "bool"}
    data = write(
        tmp_path / "fp8.neff",
        inputs=[NeffTensor(name, dtype, (4,)) for name, dtype in declared.items()],
        outputs=[NeffTensor("output0", "bool", (4,))],
    )
    info = read_neff(data)
    stored = {t.name: t.dtype for t in (*info.inputs, *info.outputs)}
    assert stored == {"q": "int8", "r": "int8", "s": "int8", "m": "uint8", "output0": "uint8"}
    assert all(compatible_in_neff(declared[name], stored[name]) for name in declared)
    with tarfile.open(fileobj=io.BytesIO(data[1024:]), mode="r:gz") as tar:
        tensor_map = json.load(tar.extractfile("sg00/tensor_map.json"))  # type: ignore[arg-type]
    assert tensor_map["q"]["dtype"] == "int8" and tensor_map["m"]["dtype"] == "uint8"
