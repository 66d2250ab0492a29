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

Placeholders, written by nkibuild's toolchain double (`nkibuild.toolchain_double.neff_writer`),
are marked three ways (header build string, `info.json`, a `PLACEHOLDER.txt` member) so
no single rewrite can make one pass for a real kernel.
"""

from __future__ import annotations

import _compression
import bz2
import contextlib
import gzip
import hashlib
import io
import json
import lzma
import os
import re
import struct
import tarfile
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import IO, Any, NamedTuple

from nkibuild.confine import UnreadableFile, open_regular
from nkibuild.errors import NkibuildError
from nkibuild.formats.jsonlimits import JsonLimitError, JsonLimits, load_json

HEADER_SIZE = 1024
# The packaging version whose header layout (and checksum layout) is documented.
PACKAGING_VERSION = 2
PLACEHOLDER_BUILD = "nkibuild-toolchain-double placeholder"
PLACEHOLDER_MEMBER = "PLACEHOLDER.txt"

_INFO, _NEFF, _KELF = "info.json", "neff.json", "kelf-0.json"
# `sgLnk/` is accepted before a subgraph directory; the subgraph keeps its `sgNN` name.
_TENSOR_MAP = re.compile(r"(?:sgLnk/)?(sg\d+)/tensor_map\.json")
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
    checksum: str  # "ok", "mismatch" or "unverified" (see warnings)
    warnings: tuple[str, ...]
    payload_size: int

    def to_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))  # its tuples as lists


@dataclass(frozen=True)
class NeffLimits:
    """What the reader accepts before calling a file "not a valid NEFF": every bound an
    input could otherwise turn into unbounded memory or time (bombs, sparse members,
    pax headers, millions of members, deep JSON). Kernel NEFFs are far below each."""

    file_bytes: int = 4 << 30
    payload_bytes: int = 4 << 30  # the decompressed tar stream
    member_bytes: int = 64 << 20  # one metadata member (read into memory)
    metadata_bytes: int = 256 << 20  # all metadata members together
    members: int = 50_000
    extended_header_bytes: int = 64 << 10  # one pax or GNU long-name header
    names_bytes: int = 16 << 20  # all member names together
    json: JsonLimits = field(default_factory=JsonLimits)


DEFAULT_LIMITS = NeffLimits()
_CHUNK = 1 << 20


def read_neff(
    source: str | os.PathLike[str] | bytes,
    *,
    verify_checksum: bool = True,
    limits: NeffLimits = DEFAULT_LIMITS,
) -> NeffInfo:
    """Read a NEFF's header and signature; raise NeffFormatError if it is not a NEFF.

    A checksum that was verified and does not match raises when `verify_checksum`, else
    yields `checksum_ok=False`. One that cannot be verified only adds a warning. Memory
    stays bounded whatever the input: the payload is streamed.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        origin, opened = "NEFF data", contextlib.nullcontext(io.BytesIO(bytes(source)))
    else:
        origin = os.fspath(source)
        opened = open_regular(origin, limits.file_bytes)
    try:
        with opened as stream:
            size = stream.seek(0, os.SEEK_END)
            stream.seek(0)
            return _parse(stream, size, verify_checksum, limits)
    except UnreadableFile as exc:
        raise NeffFormatError(f"{origin}: not a valid NEFF: {exc.strerror}") from None
    except NeffFormatError as exc:
        raise NeffFormatError(f"{origin}: not a valid NEFF: {exc}") from None
    except OSError as exc:  # the file itself failed while being read (EIO, ...)
        raise NeffFormatError(f"cannot read NEFF {origin}: {exc.strerror or exc}") from None


def _parse(stream: IO[bytes], size: int, verify_checksum: bool, limits: NeffLimits) -> NeffInfo:
    if size > limits.file_bytes:
        raise NeffFormatError(f"{size} bytes is more than the {limits.file_bytes} a NEFF may have")
    header = _read_header(stream.read(HEADER_SIZE), size)
    checksum, warnings = _checksum(header, payload_md5_field(stream))
    if verify_checksum and checksum == "mismatch":
        raise NeffFormatError("payload MD5 does not match the header (corrupted file?)")
    stream.seek(HEADER_SIZE)
    members, names = _read_members(stream, limits)
    info = _json_object(members, _INFO, limits)
    build_text = _c_string(header.build)
    maps = _tensor_maps(names)
    subgraphs = _subgraph_names(_json_object(members, _KELF, limits), maps)
    if not maps:
        raise NeffFormatError("payload has no member sg00/tensor_map.json (no tensor map)")
    first_map = _json_object(members, maps.get(subgraphs[0]) or maps[min(maps)], limits)
    inputs, input_warnings = _inputs(members.get(_NEFF), first_map, limits)
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
        outputs=_io_tensors(first_map, "output"),
        placeholder=(
            info.get("nkibuild_placeholder") is True
            or PLACEHOLDER_MEMBER in names
            or build_text.startswith(PLACEHOLDER_BUILD)
        ),
        checksum_ok=checksum != "mismatch",
        checksum=checksum,
        warnings=(*warnings, *input_warnings),
        payload_size=header.payload_size,
    )


def _read_header(data: bytes, size: int) -> _Header:
    if len(data) < HEADER_SIZE:
        raise NeffFormatError(f"{len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
    header = _Header._make(HEADER.unpack_from(data))
    if header.header_size != HEADER_SIZE:
        raise NeffFormatError(f"header size field is {header.header_size}, not 1024")
    if header.payload_size != size - HEADER_SIZE:
        raise NeffFormatError(
            f"payload size field says {header.payload_size} bytes but "
            f"{size - HEADER_SIZE} follow the header (truncated or padded file?)"
        )
    return header


def payload_md5_field(stream: IO[bytes]) -> bytes:
    """The header's MD5 of the payload `stream` (read to its end): the big-endian digest
    re-packed as little-endian u32s."""
    digest = hashlib.md5(usedforsecurity=False)
    for block in iter(lambda: stream.read(_CHUNK), b""):
        digest.update(block)
    return struct.pack("<4I", *struct.unpack(">4I", digest.digest()))


def _checksum(header: _Header, payload_md5: bytes) -> tuple[str, tuple[str, ...]]:
    """("ok" | "mismatch" | "unverified", warnings). Only a documented, non-empty field
    that does not match is a mismatch: anything else the reader cannot judge."""
    if header.md5 == payload_md5:
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


def _read_members(stream: IO[bytes], limits: NeffLimits) -> tuple[dict[str, bytes], frozenset[str]]:
    """The metadata members' bytes, and the names of all members.

    The tar is read as a stream through a byte budget, so neither a compression bomb
    nor a member that declares a huge size can take more than the limits allow; the
    archive's own bookkeeping (tarfile keeps every header it read) is dropped as it goes.
    """
    members: dict[str, bytes] = {}
    names: set[str] = set()
    budget = _Budget(_decompressed(stream), limits.payload_bytes)
    tarinfo = type("BoundedTarInfo", (_BoundedTarInfo,), {"limits": limits})
    counts: Counter[str] = Counter()
    try:
        with tarfile.open(fileobj=budget, mode="r|", tarinfo=tarinfo) as tar:
            while (member := tar.next()) is not None:
                tar.members.clear()
                name = member.name.removeprefix("./")
                _count(counts, "members", 1, limits.members)
                _count(counts, "bytes of member names", len(name), limits.names_bytes)
                names.add(name)
                if not member.isfile() or not (
                    name in (_INFO, _NEFF, _KELF) or _TENSOR_MAP.fullmatch(name)
                ):
                    continue
                if member.size > limits.member_bytes:
                    raise NeffFormatError(
                        f"member {name} is {member.size} bytes (at most {limits.member_bytes})"
                    )
                _count(counts, "bytes of metadata members", member.size, limits.metadata_bytes)
                extracted = tar.extractfile(member)
                # The member's declared size (checked above), not the limit: a read of the
                # limit allocates a buffer of the limit's size (64 MiB) for every member first.
                members[name] = extracted.read(member.size) if extracted else b""
    except _READ_ERRORS as exc:
        raise NeffFormatError(f"payload is not a readable (gzip) tar archive: {exc}") from None
    return members, frozenset(names)


# What decompressors and tarfile raise for bytes they cannot read.
_READ_ERRORS = (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError, ValueError)
_XZ_MEMORY = 96 << 20  # xz declares its dictionary size: cap what a header can demand


def _decompressed(stream: IO[bytes]) -> Any:
    """The payload's tar stream: gunzipped, unxz'd, bunzipped, or as is (fast-loading
    NEFFs, `--enable-fast-loading-neuron-binaries`, are uncompressed)."""
    start = stream.tell()
    magic = stream.read(6)
    stream.seek(start)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=stream, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(stream, mode="rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        reader = _compression.DecompressReader(
            stream, lzma.LZMADecompressor, trailing_error=lzma.LZMAError, memlimit=_XZ_MEMORY
        )
        return io.BufferedReader(reader)
    return stream


class _Budget:
    """A reader that refuses to yield more than `limit` bytes in total."""

    def __init__(self, raw: Any, limit: int) -> None:
        self.raw, self.limit, self.total = raw, limit, 0

    def read(self, size: int = -1) -> bytes:
        room = self.limit - self.total + 1
        data = self.raw.read(room if size is None or size < 0 else min(size, room))
        self.total += len(data)
        if self.total > self.limit:
            raise NeffFormatError(f"payload decompresses to more than {self.limit} bytes")
        return bytes(data)


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses, before tarfile reads them into memory, extended headers (pax, GNU long
    names) beyond the limit, and sparse members (a few bytes that expand to any size;
    a NEFF has none)."""

    limits: NeffLimits = DEFAULT_LIMITS

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise NeffFormatError(f"member {self.name!r} is a sparse file")
        if self.type in _EXTENDED_TYPES and self.size > self.limits.extended_header_bytes:
            raise NeffFormatError(
                f"an extended tar header of {self.size} bytes "
                f"(at most {self.limits.extended_header_bytes})"
            )
        return super()._proc_member(tar)  # type: ignore[misc]

    def _proc_gnusparse_00(self, *args: Any) -> None:
        raise NeffFormatError(f"member {self.name!r} is a sparse file")

    _proc_gnusparse_01 = _proc_gnusparse_10 = _proc_gnusparse_00


# pax headers, and GNU long names (GNU_TYPES also holds sparse, refused before).
_EXTENDED_TYPES = {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, *tarfile.GNU_TYPES}


def _count(counts: Counter[str], unit: str, amount: int, limit: int) -> None:
    counts[unit] += amount
    if counts[unit] > limit:
        raise NeffFormatError(f"payload has more than {limit} {unit}")


def _json_object(members: Mapping[str, bytes], name: str, limits: NeffLimits) -> dict[str, Any]:
    if name not in members:
        raise NeffFormatError(f"payload has no member {name}")
    try:
        value = load_json(members[name], limits.json)
    except JsonLimitError as exc:
        raise NeffFormatError(f"member {name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise NeffFormatError(f"member {name} is not a JSON object")
    return value


def _tensor_maps(names: Iterable[str]) -> dict[str, str]:
    """Subgraph name -> its tensor map member (plain `sgNN/` before `sgLnk/sgNN/`)."""
    last_wins = sorted(names, key=lambda n: not n.startswith(_SUBGRAPH_PREFIX))
    return {m.group(1): name for name in last_wins if (m := _TENSOR_MAP.fullmatch(name))}


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
    neff_json: bytes | None, tensor_map: Mapping[str, Any], limits: NeffLimits
) -> tuple[tuple[NeffTensor, ...], tuple[str, ...]]:
    """The inputs from neff.json's signature, else from the tensor map (with a warning)."""
    entries = None
    if neff_json is not None:
        neff = _json_object({_NEFF: neff_json}, _NEFF, limits)
        with contextlib.suppress(KeyError, TypeError):
            entries = neff["metadata"]["signatures"]["default"]["inputs"]
    if entries is None:
        why = "has no" if neff_json is not None else "is missing, so no"
        return _io_tensors(tensor_map, "input"), (
            f"{_NEFF} {why} metadata.signatures.default.inputs: inputs taken from the "
            "tensor map, ordered input0, input1, ... then map order",
        )
    if not isinstance(entries, Mapping):
        raise NeffFormatError(f"{_NEFF}: metadata.signatures.default.inputs is not an object")
    where = f"{_NEFF} input"
    ids = {name: _field(entry, "id", int, f"{where} {name!r}") for name, entry in entries.items()}
    ordered = sorted(ids, key=ids.__getitem__)
    return tuple(_tensor(name, entries[name], "shape", where) for name in ordered), ()


def _io_tensors(tensor_map: Mapping[str, Any], kind: str) -> tuple[NeffTensor, ...]:
    names = [
        name
        for name, entry in tensor_map.items()
        if isinstance(entry, Mapping) and entry.get("kind") == kind and not entry.get("is_const")
    ]
    ordered = sorted(names, key=partial(_numbered_first, kind))
    return tuple(_tensor(n, tensor_map[n], "tf_shape", f"tensor_map {kind}") for n in ordered)


def _numbered_first(kind: str, name: str) -> tuple[int, int, str]:
    """Sort key: output0, output1, ..., output10 numerically; other names after, in map
    order (the sort is stable)."""
    match = re.fullmatch(f"{kind}([0-9]+)", name)
    if not match:
        return (1, 0, "")
    # Compared as digit strings (shorter is smaller), never through int(): a name of
    # 5000 digits is past Python's int() limit, and ASCII digits only (\d is Unicode).
    digits = match.group(1).lstrip("0")
    return (0, len(digits), digits)


def _tensor(name: str, entry: Any, shape_key: str, where: str) -> NeffTensor:
    where = f"{where} {name!r}"
    dtype = _field(entry, "dtype", str, where)
    shape = _field(entry, shape_key, list, where)
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in shape):
        raise NeffFormatError(f"{where}: {shape_key} {shape!r} is not a list of sizes")
    return NeffTensor(name, dtype, tuple(shape))


def _field(entry: Any, key: str, kind: type, where: str) -> Any:
    value = entry.get(key) if isinstance(entry, Mapping) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise NeffFormatError(f"{where}: missing or invalid '{key}'")
    return value
