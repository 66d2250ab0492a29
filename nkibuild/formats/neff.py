"""Read and write NEFF containers (Neuron Executable File Format).

A NEFF is a 1024-byte little-endian header followed by a tar archive, normally
gzip-compressed (the payload):

    offset  type       field
    0       u64        packaging version
    8       u64        header size (1024)
    16      u64        payload size (file size - header size)
    24/32   u64/u64    format version major / minor
    40      128 bytes  build string, NUL padded
    168     u32        number of NeuronCores (TPBs) used
    172     16 bytes   MD5 of the payload as four little-endian u32 words of the
                       big-endian digest (each 4-byte group of the digest reversed)
    188     16 bytes   (unknown; written as zeros)
    204     16 bytes   UUID
    220     256 bytes  name, NUL padded

The reader only needs the standard library. It extracts the kernel's I/O signature from
the members `info.json`, `neff.json`, `kelf-0.json` and `sgNN/tensor_map.json`.

The writer exists for nkibuild's toolchain double: it produces placeholder NEFFs with a
real container and signature but no executable code. Placeholders are marked three ways
(header build string, `info.json`, a `PLACEHOLDER.txt` member) so no single rewrite can
make one pass for a real kernel. Its output is byte-deterministic for equal arguments,
because wheels built from these NEFFs must be reproducible.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import struct
import tarfile
import types
import uuid
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from nkibuild.dtypes import BY_NAME
from nkibuild.errors import NkibuildError

HEADER_SIZE = 1024
PACKAGING_VERSION = 2
FORMAT_VERSION = (1, 0)
PLACEHOLDER_BUILD = "nkibuild-toolchain-double placeholder"
PLACEHOLDER_MEMBER = "PLACEHOLDER.txt"
PLACEHOLDER_TEXT = (
    "This NEFF is a placeholder written by nkibuild's toolchain double\n"
    "(nkibuild.testing), not by neuronx-cc. It has the signature of the kernel it\n"
    "stands for but contains no executable code: it cannot run on a NeuronCore.\n"
)

_INFO, _NEFF, _KELF = "info.json", "neff.json", "kelf-0.json"
_TENSOR_MAP = re.compile(r"(sg\d+)/tensor_map\.json")
_OUTPUT_NAME = re.compile(r"output(\d+)")
_FROM_NEFF_DTYPE = {d.neff_name: d.name for d in BY_NAME.values()}
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/nkibuild/nkibuild/neff")
_NO_MEMBERS: Mapping[str, bytes] = types.MappingProxyType({})

# Header fields in file order; see the module docstring for offsets.
_HEADER = struct.Struct("<5Q128sI16s16s16s256s")


class _Header(NamedTuple):
    packaging_version: int
    header_size: int
    payload_size: int
    format_major: int
    format_minor: int
    build: bytes
    num_tpb: int
    md5: bytes
    reserved: bytes
    uuid: bytes
    name: bytes


class NeffFormatError(NkibuildError):
    """The bytes are not a readable NEFF."""


@dataclass(frozen=True)
class NeffTensor:
    name: str
    dtype: str  # nkibuild dtype name: float32, bfloat16, ...
    shape: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class NeffInfo:
    packaging_version: int
    format_version: tuple[int, int]
    build: str
    num_tpb: int
    name: str
    uuid: str
    compiler_version: str
    subgraphs: tuple[str, ...]
    inputs: tuple[NeffTensor, ...]
    outputs: tuple[NeffTensor, ...]
    placeholder: bool
    checksum_ok: bool
    payload_size: int

    def to_json(self) -> dict[str, Any]:
        return {
            "packaging_version": self.packaging_version,
            "format_version": list(self.format_version),
            "build": self.build,
            "num_tpb": self.num_tpb,
            "name": self.name,
            "uuid": self.uuid,
            "compiler_version": self.compiler_version,
            "subgraphs": list(self.subgraphs),
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
            "placeholder": self.placeholder,
            "checksum_ok": self.checksum_ok,
            "payload_size": self.payload_size,
        }


# --- reading ---------------------------------------------------------------------------


def read_neff(source: str | os.PathLike[str] | bytes, *, verify_checksum: bool = True) -> NeffInfo:
    """Read a NEFF's header and signature; raise NeffFormatError if it is not a NEFF.

    A checksum mismatch raises when `verify_checksum`, else yields `checksum_ok=False`.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, origin = bytes(source), "NEFF data"
    else:
        origin = os.fspath(source)
        try:
            with open(source, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise NeffFormatError(f"cannot read NEFF {origin}: {exc.strerror}") from None
    try:
        return _parse(data, verify_checksum)
    except NeffFormatError as exc:
        raise NeffFormatError(f"{origin}: {exc}") from None


def _parse(data: bytes, verify_checksum: bool) -> NeffInfo:
    if len(data) < HEADER_SIZE:
        raise NeffFormatError(
            f"not a NEFF: {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header"
        )
    header = _Header._make(_HEADER.unpack_from(data))
    if header.header_size != HEADER_SIZE:
        raise NeffFormatError(f"not a NEFF: header size field is {header.header_size}, not 1024")
    if header.payload_size != len(data) - HEADER_SIZE:
        raise NeffFormatError(
            f"payload size field says {header.payload_size} bytes but "
            f"{len(data) - HEADER_SIZE} follow the header (truncated or padded file?)"
        )
    payload = data[HEADER_SIZE:]
    checksum_ok = header.md5 == _stored_md5(payload)
    if verify_checksum and not checksum_ok:
        raise NeffFormatError("payload MD5 does not match the header (corrupted file?)")
    members, names = _read_members(payload)
    info = _json_object(members, _INFO)
    build_text = _c_string(header.build)
    subgraphs = _subgraph_names(_json_object(members, _KELF), names)
    return NeffInfo(
        packaging_version=header.packaging_version,
        format_version=(header.format_major, header.format_minor),
        build=build_text,
        num_tpb=header.num_tpb,
        name=_c_string(header.name),
        uuid=str(uuid.UUID(bytes=header.uuid)),
        compiler_version=str(info.get("tool_version", "")),
        subgraphs=subgraphs,
        inputs=_inputs(_json_object(members, _NEFF)),
        outputs=_outputs(_json_object(members, f"{subgraphs[0]}/tensor_map.json")),
        placeholder=(
            info.get("nkibuild_placeholder") is True
            or PLACEHOLDER_MEMBER in names
            or build_text.startswith(PLACEHOLDER_BUILD)
        ),
        checksum_ok=checksum_ok,
        payload_size=header.payload_size,
    )


def _stored_md5(payload: bytes) -> bytes:
    """The header's MD5 layout: the big-endian digest re-packed as little-endian u32s."""
    digest = hashlib.md5(payload, usedforsecurity=False).digest()
    return struct.pack("<4I", *struct.unpack(">4I", digest))


def _c_string(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def _member_name(name: str) -> str:
    return name[2:] if name.startswith("./") else name


def _wanted(name: str) -> bool:
    return name in (_INFO, _NEFF, _KELF) or _TENSOR_MAP.fullmatch(name) is not None


def _read_members(payload: bytes) -> tuple[dict[str, bytes], frozenset[str]]:
    """The metadata members' bytes, and the names of all members."""
    members: dict[str, bytes] = {}
    names: set[str] = set()
    try:
        # "r:*": fast-loading NEFFs (--enable-fast-loading-neuron-binaries) are uncompressed.
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as tar:
            for member in tar:
                name = _member_name(member.name)
                names.add(name)
                if member.isfile() and _wanted(name):
                    extracted = tar.extractfile(member)
                    members[name] = extracted.read() if extracted else b""
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise NeffFormatError(f"payload is not a readable (gzip) tar archive: {exc}") from None
    return members, frozenset(names)


def _json_object(members: Mapping[str, bytes], name: str) -> dict[str, Any]:
    if name not in members:
        raise NeffFormatError(f"payload has no member {name}")
    try:
        value = json.loads(members[name])
    except (ValueError, UnicodeDecodeError) as exc:
        raise NeffFormatError(f"member {name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise NeffFormatError(f"member {name} is not a JSON object")
    return value


def _subgraph_names(kelf: Mapping[str, Any], members: Iterable[str]) -> tuple[str, ...]:
    graphs = kelf.get("graphs")
    if isinstance(graphs, Mapping):
        names = list(graphs)
    elif isinstance(graphs, list):
        names = [g.get("name") if isinstance(g, Mapping) else g for g in graphs]
    else:
        raise NeffFormatError(f"{_KELF} has no 'graphs' list")
    if not all(isinstance(n, str) and n for n in names):
        # Unknown entry layout: fall back to the subgraph directories present.
        names = sorted({m.group(1) for n in members if (m := _TENSOR_MAP.fullmatch(n))})
    if not names:
        raise NeffFormatError(f"{_KELF} lists no subgraphs")
    return tuple(names)


def _inputs(neff: Mapping[str, Any]) -> tuple[NeffTensor, ...]:
    try:
        entries = neff["metadata"]["signatures"]["default"]["inputs"]
    except (KeyError, TypeError):
        raise NeffFormatError(f"{_NEFF} has no metadata.signatures.default.inputs") from None
    if not isinstance(entries, Mapping):
        raise NeffFormatError(f"{_NEFF}: metadata.signatures.default.inputs is not an object")
    where = f"{_NEFF} input"
    ids = {name: _field(entry, "id", int, f"{where} {name!r}") for name, entry in entries.items()}
    return tuple(
        _tensor(name, entries[name], "shape", where) for name in sorted(ids, key=ids.__getitem__)
    )


def _outputs(tensor_map: Mapping[str, Any]) -> tuple[NeffTensor, ...]:
    names = [
        name
        for name, entry in tensor_map.items()
        if isinstance(entry, Mapping)
        and entry.get("kind") == "output"
        and not entry.get("is_const")
    ]
    ordered = [name for _, name in sorted(enumerate(names), key=_output_order)]
    return tuple(_tensor(n, tensor_map[n], "tf_shape", "tensor_map output") for n in ordered)


def _output_order(index_name: tuple[int, str]) -> tuple[int, int]:
    """output0, output1, ..., output10 numerically; other names after, in map order."""
    index, name = index_name
    match = _OUTPUT_NAME.fullmatch(name)
    return (0, int(match.group(1))) if match else (1, index)


def _tensor(name: str, entry: Any, shape_key: str, where: str) -> NeffTensor:
    where = f"{where} {name!r}"
    dtype = _field(entry, "dtype", str, where)
    shape = _field(entry, shape_key, list, where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise NeffFormatError(f"{where}: {shape_key} {shape!r} is not a list of sizes")
    return NeffTensor(name, _FROM_NEFF_DTYPE.get(dtype, dtype), tuple(shape))


def _field(entry: Any, key: str, kind: type, where: str) -> Any:
    value = entry.get(key) if isinstance(entry, Mapping) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise NeffFormatError(f"{where}: missing or invalid '{key}'")
    return value


# --- writing ---------------------------------------------------------------------------


def write_neff(
    path: str | os.PathLike[str],
    *,
    compiler_version: str,
    inputs: Sequence[NeffTensor],
    outputs: Sequence[NeffTensor],
    num_tpb: int,
    placeholder: bool,
    build: str | None = None,
    name: str = "file.neff",
    extra_members: Mapping[str, bytes] = _NO_MEMBERS,
    compress: bool = True,
) -> None:
    """Write a NEFF with one subgraph per NeuronCore, atomically and deterministically.

    `build` defaults to the placeholder marker (placeholders) or "nkibuild"; a placeholder's
    build string always starts with the marker. `compress=False` writes the uncompressed
    tar payload of --enable-fast-loading-neuron-binaries.
    """
    if num_tpb < 1:
        raise ValueError(f"num_tpb must be at least 1, not {num_tpb}")
    build = _build_string(build, placeholder)
    members = _metadata_members(compiler_version, inputs, outputs, num_tpb, placeholder)
    for member_name, data in extra_members.items():
        _check_extra_member(member_name, members)
        members[member_name] = bytes(data)
    payload = _payload(members, compress)
    header = _HEADER.pack(
        PACKAGING_VERSION,
        HEADER_SIZE,
        len(payload),
        *FORMAT_VERSION,
        _fixed_field(build, 128, "build"),
        num_tpb,
        _stored_md5(payload),
        bytes(16),
        uuid.uuid5(_UUID_NAMESPACE, hashlib.sha256(payload).hexdigest()).bytes,
        _fixed_field(name, 256, "name"),
    ).ljust(HEADER_SIZE, b"\0")
    _write_atomically(os.fspath(path), header + payload)


def _build_string(build: str | None, placeholder: bool) -> str:
    if not placeholder:
        return "nkibuild" if build is None else build
    if build is None or build.startswith(PLACEHOLDER_BUILD):
        return build or PLACEHOLDER_BUILD
    return f"{PLACEHOLDER_BUILD} {build}"


def _fixed_field(text: str, size: int, what: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) >= size:  # keep a NUL terminator for C readers
        raise ValueError(f"NEFF {what} {text!r} is longer than {size - 1} bytes")
    return raw.ljust(size, b"\0")


def _metadata_members(
    compiler_version: str,
    inputs: Sequence[NeffTensor],
    outputs: Sequence[NeffTensor],
    num_tpb: int,
    placeholder: bool,
) -> dict[str, bytes]:
    _check_names([*inputs, *outputs])
    info: dict[str, Any] = {"tool_version": compiler_version, "num_tpb": num_tpb}
    if placeholder:
        info["nkibuild_placeholder"] = True
    signature = {
        t.name: {"id": i, "dtype": _neff_dtype(t), "shape": list(t.shape)}
        for i, t in enumerate(inputs)
    }
    tensor_map = {
        t.name: {
            "kind": kind,
            "dtype": _neff_dtype(t),
            "tf_shape": list(t.shape),
            "is_const": False,
        }
        for kind, tensors in (("input", inputs), ("output", outputs))
        for t in tensors
    }
    subgraphs = [f"sg{i:02d}" for i in range(num_tpb)]
    members = {
        _INFO: _json_bytes(info),
        _NEFF: _json_bytes({"metadata": {"signatures": {"default": {"inputs": signature}}}}),
        _KELF: _json_bytes({"graphs": [{"name": sg} for sg in subgraphs]}),
    }
    members.update({f"{sg}/tensor_map.json": _json_bytes(tensor_map) for sg in subgraphs})
    if placeholder:
        members[PLACEHOLDER_MEMBER] = PLACEHOLDER_TEXT.encode()
    return members


def _check_names(tensors: Sequence[NeffTensor]) -> None:
    seen: set[str] = set()
    for tensor in tensors:
        if not tensor.name or tensor.name in seen:
            raise ValueError(f"NEFF tensor names must be unique and non-empty: {tensor.name!r}")
        seen.add(tensor.name)


def _neff_dtype(tensor: NeffTensor) -> str:
    dtype = BY_NAME.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"tensor {tensor.name!r} has unknown dtype {tensor.dtype!r}")
    return dtype.neff_name


def _check_extra_member(name: str, members: Mapping[str, bytes]) -> None:
    parts = name.split("/")
    if name in members or not name or name.startswith("/") or ".." in parts or "" in parts:
        raise ValueError(f"invalid or reserved extra NEFF member name {name!r}")


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def _payload(members: Mapping[str, bytes], compress: bool) -> bytes:
    """A tar (gzip unless told otherwise) whose bytes depend only on the members."""
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member_name in sorted(members):
            data = members[member_name]
            info = tarfile.TarInfo(member_name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    if not compress:
        return tar_buffer.getvalue()
    gz_buffer = io.BytesIO()
    # GzipFile rather than gzip.compress: its header bytes are the same on every Python
    # version (mtime 0, no file name).
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz_buffer, mtime=0) as gz:
        gz.write(tar_buffer.getvalue())
    return gz_buffer.getvalue()


def _write_atomically(path: str, data: bytes) -> None:
    # Readers (and a concurrent build) never see a half-written NEFF.
    tmp = os.path.join(os.path.dirname(path) or ".", f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
