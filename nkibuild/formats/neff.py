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
    188     16 bytes   (unknown; zeros in real files)
    204     16 bytes   UUID
    220     256 bytes  name, NUL padded

The reader only needs the standard library. It extracts the kernel's I/O signature from
the members `info.json`, `neff.json`, `kelf-0.json` and `sgNN/tensor_map.json` (checked
against a NEFF compiled by neuronx-cc 2.23, ../shared/testdata/neff/matmul_small.neff):

- inputs come from `neff.json`'s `metadata.signatures.default.inputs` (ordered by `id`);
  a NEFF without that signature falls back to the first tensor map's non-const inputs
  (`input0`, `input1`, ... numerically, other names in map order);
- outputs come from the first tensor map (`output0`, `output1`, ... numerically);
- subgraph directories may sit under an `sgLnk/` prefix (`sgLnk/sg00/tensor_map.json`);
- dtypes are reported as the NEFF spells them: neuronx-cc stores fp8 as `int8` and bool
  as `uint8` (compare with `nkibuild.dtypes.compatible_in_neff`);
- the subgraph count is not the core count: a 1-core NEFF can have two subgraphs.

The payload MD5 is checked when the header carries one in the documented layout. A
checksum the reader cannot verify (an all-zero field, or a packaging version whose layout
is not documented) is a warning in `NeffInfo.warnings`, never a rejection.

Placeholders, written by nkibuild's toolchain double (`nkibuild.testing.neff_writer`),
are marked three ways (header build string, `info.json`, a `PLACEHOLDER.txt` member) so
no single rewrite can make one pass for a real kernel.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import tarfile
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from nkibuild.errors import NkibuildError

HEADER_SIZE = 1024
# The packaging version whose header layout (and checksum layout) is documented.
PACKAGING_VERSION = 2
PLACEHOLDER_BUILD = "nkibuild-toolchain-double placeholder"
PLACEHOLDER_MEMBER = "PLACEHOLDER.txt"

_INFO, _NEFF, _KELF = "info.json", "neff.json", "kelf-0.json"
# `sgLnk/` is accepted before a subgraph directory; the subgraph keeps its `sgNN` name.
_TENSOR_MAP = re.compile(r"(?:sgLnk/)?(sg\d+)/tensor_map\.json")
_INPUT_NAME = re.compile(r"input(\d+)")
_OUTPUT_NAME = re.compile(r"output(\d+)")
_SUBGRAPH_PREFIX = "sgLnk/"

# Header fields in file order; see the module docstring for offsets.
HEADER = struct.Struct("<5Q128sI16s16s16s256s")


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
    dtype: str  # as the NEFF stores it: float32, bfloat16, int8 (also fp8), uint8 (also bool)
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
    checksum_ok: bool  # False only for a checksum that was verified and does not match
    payload_size: int
    checksum: str = "ok"  # "ok", "mismatch" or "unverified" (see warnings)
    warnings: tuple[str, ...] = ()

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
            "checksum": self.checksum,
            "warnings": list(self.warnings),
            "payload_size": self.payload_size,
        }


# --- reading ---------------------------------------------------------------------------


def read_neff(source: str | os.PathLike[str] | bytes, *, verify_checksum: bool = True) -> NeffInfo:
    """Read a NEFF's header and signature; raise NeffFormatError if it is not a NEFF.

    A checksum that was verified and does not match raises when `verify_checksum`, else
    yields `checksum_ok=False`. One that cannot be verified only adds a warning.
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
    header = _read_header(data)
    payload = data[HEADER_SIZE:]
    checksum, warnings = _checksum(header, payload)
    if verify_checksum and checksum == "mismatch":
        raise NeffFormatError("payload MD5 does not match the header (corrupted file?)")
    members, names = _read_members(payload)
    info = _json_object(members, _INFO)
    build_text = _c_string(header.build)
    maps = _tensor_maps(names)
    subgraphs = _subgraph_names(_json_object(members, _KELF), maps)
    first_map = _json_object(members, maps.get(subgraphs[0]) or _first_map(maps))
    inputs, fallback = _inputs(members.get(_NEFF), first_map)
    if fallback:
        warnings = (*warnings, fallback)
    return NeffInfo(
        packaging_version=header.packaging_version,
        format_version=(header.format_major, header.format_minor),
        build=build_text,
        num_tpb=header.num_tpb,
        name=_c_string(header.name),
        uuid=str(uuid.UUID(bytes=header.uuid)),
        compiler_version=str(info.get("tool_version", "")),
        subgraphs=subgraphs,
        inputs=inputs,
        outputs=_io_tensors(first_map, "output", _OUTPUT_NAME),
        placeholder=(
            info.get("nkibuild_placeholder") is True
            or PLACEHOLDER_MEMBER in names
            or build_text.startswith(PLACEHOLDER_BUILD)
        ),
        checksum_ok=checksum != "mismatch",
        payload_size=header.payload_size,
        checksum=checksum,
        warnings=warnings,
    )


def _read_header(data: bytes) -> _Header:
    if len(data) < HEADER_SIZE:
        raise NeffFormatError(
            f"not a NEFF: {len(data)} bytes is shorter than the {HEADER_SIZE}-byte header"
        )
    header = _Header._make(HEADER.unpack_from(data))
    if header.header_size != HEADER_SIZE:
        raise NeffFormatError(f"not a NEFF: header size field is {header.header_size}, not 1024")
    if header.payload_size != len(data) - HEADER_SIZE:
        raise NeffFormatError(
            f"payload size field says {header.payload_size} bytes but "
            f"{len(data) - HEADER_SIZE} follow the header (truncated or padded file?)"
        )
    return header


def payload_md5_field(payload: bytes) -> bytes:
    """The header's MD5 layout: the big-endian digest re-packed as little-endian u32s."""
    digest = hashlib.md5(payload, usedforsecurity=False).digest()
    return struct.pack("<4I", *struct.unpack(">4I", digest))


def _checksum(header: _Header, payload: bytes) -> tuple[str, tuple[str, ...]]:
    """("ok" | "mismatch" | "unverified", warnings). Only a documented, non-empty field
    that does not match is a mismatch: anything else the reader cannot judge."""
    if header.md5 == payload_md5_field(payload):
        return "ok", ()
    if header.md5 == bytes(16):
        return "unverified", ("checksum not verified: the header's MD5 field is empty",)
    if header.packaging_version != PACKAGING_VERSION:
        return "unverified", (
            f"checksum not verified: packaging version {header.packaging_version} may use "
            f"another checksum layout (only version {PACKAGING_VERSION}'s is known)",
        )
    return "mismatch", ()


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


def _tensor_maps(names: Iterable[str]) -> dict[str, str]:
    """Subgraph name -> its tensor map member (plain `sgNN/` before `sgLnk/sgNN/`)."""
    found: dict[str, str] = {}
    for name in sorted(names, key=lambda n: n.startswith(_SUBGRAPH_PREFIX)):
        match = _TENSOR_MAP.fullmatch(name)
        if match:
            found.setdefault(match.group(1), name)
    return found


def _first_map(maps: Mapping[str, str]) -> str:
    if not maps:
        raise NeffFormatError("payload has no member sg00/tensor_map.json (no tensor map)")
    return maps[min(maps)]


def _subgraph_names(kelf: Mapping[str, Any], maps: Mapping[str, str]) -> tuple[str, ...]:
    graphs = kelf.get("graphs")
    if isinstance(graphs, Mapping):
        names = list(graphs)
    elif isinstance(graphs, list):
        names = [g.get("name") if isinstance(g, Mapping) else g for g in graphs]
    else:
        raise NeffFormatError(f"{_KELF} has no 'graphs' list")
    if all(isinstance(n, str) and n for n in names):
        names = [n.removeprefix(_SUBGRAPH_PREFIX) for n in names]
    else:
        # Unknown entry layout: fall back to the subgraph directories present.
        names = sorted(maps)
    if not names:
        raise NeffFormatError(f"{_KELF} lists no subgraphs")
    return tuple(names)


def _inputs(
    neff_json: bytes | None, tensor_map: Mapping[str, Any]
) -> tuple[tuple[NeffTensor, ...], str | None]:
    """The inputs from neff.json's signature, else from the tensor map (with a warning)."""
    entries = None
    if neff_json is not None:
        neff = _json_object({_NEFF: neff_json}, _NEFF)
        try:
            entries = neff["metadata"]["signatures"]["default"]["inputs"]
        except (KeyError, TypeError):
            entries = None
    if entries is None:
        why = "has no" if neff_json is not None else "is missing, so no"
        return _io_tensors(tensor_map, "input", _INPUT_NAME), (
            f"{_NEFF} {why} metadata.signatures.default.inputs: inputs taken from the "
            "tensor map, ordered input0, input1, ... then map order"
        )
    if not isinstance(entries, Mapping):
        raise NeffFormatError(f"{_NEFF}: metadata.signatures.default.inputs is not an object")
    where = f"{_NEFF} input"
    ids = {name: _field(entry, "id", int, f"{where} {name!r}") for name, entry in entries.items()}
    ordered = sorted(ids, key=ids.__getitem__)
    return tuple(_tensor(name, entries[name], "shape", where) for name in ordered), None


def _io_tensors(
    tensor_map: Mapping[str, Any], kind: str, numbered: re.Pattern[str]
) -> tuple[NeffTensor, ...]:
    names = [
        name
        for name, entry in tensor_map.items()
        if isinstance(entry, Mapping) and entry.get("kind") == kind and not entry.get("is_const")
    ]
    ordered = [name for _, name in sorted(enumerate(names), key=_numbered_first(numbered))]
    return tuple(_tensor(n, tensor_map[n], "tf_shape", f"tensor_map {kind}") for n in ordered)


def _numbered_first(numbered: re.Pattern[str]) -> Any:
    """Sort key: output0, output1, ..., output10 numerically; other names after, in map order."""

    def key(index_name: tuple[int, str]) -> tuple[int, int]:
        index, name = index_name
        match = numbered.fullmatch(name)
        return (0, int(match.group(1))) if match else (1, index)

    return key


def _tensor(name: str, entry: Any, shape_key: str, where: str) -> NeffTensor:
    where = f"{where} {name!r}"
    dtype = _field(entry, "dtype", str, where)
    shape = _field(entry, shape_key, list, where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise NeffFormatError(f"{where}: {shape_key} {shape!r} is not a list of sizes")
    return NeffTensor(name, dtype, tuple(shape))


def _field(entry: Any, key: str, kind: type, where: str) -> Any:
    value = entry.get(key) if isinstance(entry, Mapping) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise NeffFormatError(f"{where}: missing or invalid '{key}'")
    return value
