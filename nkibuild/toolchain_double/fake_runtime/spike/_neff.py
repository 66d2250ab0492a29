"""Just enough NEFF reading for the fake runtime: the kernel's I/O and `info.json`.

A NEFF is a 1024-byte little-endian header (u64 packaging version, u64 header size,
u64 payload size, ...) followed by a tar payload, gzip-compressed unless the compiler
wrote a fast-loading NEFF. Each subgraph `sgNN/` (possibly under `sgLnk/`) has a
`tensor_map.json` whose non-const entries are the kernel's inputs and outputs; every
subgraph lists the same I/O, so the first one is read. `neff.json`'s signature, when
present, gives the parameter order. Only the standard library: this runs where nkibuild
is not installed.
"""

from __future__ import annotations

import io
import json
import re
import struct
import tarfile
import zlib
from dataclasses import dataclass
from typing import Any

HEADER_SIZE = 1024
_SIZES = struct.Struct("<3Q")  # packaging version, header size, payload size
_TENSOR_MAP = re.compile(r"(?:sgLnk/)?sg(\d+)/tensor_map\.json")
_JSON_MEMBERS = ("info.json", "neff.json")


class NeffReadError(Exception):
    """The bytes are not a NEFF the fake runtime can load (the caller adds the path)."""


@dataclass(frozen=True)
class NeffTensor:
    name: str
    kind: str  # "input" or "output"
    dtype: str  # as the tensor map spells it
    shape: tuple[int, ...]


@dataclass(frozen=True)
class NeffContents:
    tensors: tuple[NeffTensor, ...]  # tensor map order
    info: dict[str, Any]  # info.json: tool_version, num_tpb, nkibuild_placeholder, ...
    parameter_order: tuple[str, ...] = ()  # input names by neff.json signature id, if any


def read(data: bytes) -> NeffContents:
    if len(data) < HEADER_SIZE:
        raise NeffReadError(f"{len(data)} bytes is shorter than the {HEADER_SIZE}-byte header")
    _, header_size, payload_size = _SIZES.unpack_from(data)
    if header_size != HEADER_SIZE:
        raise NeffReadError(f"the header size field is {header_size}, not {HEADER_SIZE}")
    if payload_size != len(data) - HEADER_SIZE:
        raise NeffReadError(
            f"the header announces a {payload_size}-byte payload but "
            f"{len(data) - HEADER_SIZE} bytes follow (truncated file?)"
        )
    members = _members(data[HEADER_SIZE:])
    maps = sorted((int(m.group(1)), n) for n in members if (m := _TENSOR_MAP.fullmatch(n)))
    if not maps:
        raise NeffReadError("the payload has no sgNN/tensor_map.json")
    return NeffContents(
        tensors=_tensors(_json(members, maps[0][1])),
        info=_json(members, "info.json") if "info.json" in members else {},
        parameter_order=_parameter_order(members),
    )


def _members(payload: bytes) -> dict[str, bytes]:
    wanted: dict[str, bytes] = {}
    try:
        # "r:*" because fast-loading NEFFs carry a plain (uncompressed) tar.
        with tarfile.open(fileobj=io.BytesIO(payload), mode="r:*") as archive:
            for member in archive:
                name = member.name.removeprefix("./")
                if member.isfile() and (name in _JSON_MEMBERS or _TENSOR_MAP.fullmatch(name)):
                    extracted = archive.extractfile(member)
                    wanted[name] = extracted.read() if extracted else b""
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise NeffReadError(f"the payload is not a readable tar archive ({error})") from None
    return wanted


def _json(members: dict[str, bytes], name: str) -> dict[str, Any]:
    try:
        value = json.loads(members[name])
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise NeffReadError(f"{name} is not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise NeffReadError(f"{name} is not a JSON object")
    return value


def _tensors(tensor_map: dict[str, Any]) -> tuple[NeffTensor, ...]:
    tensors = []
    for name, entry in tensor_map.items():
        if not isinstance(entry, dict) or entry.get("is_const"):
            continue  # weights baked into the NEFF are not passed by the caller
        kind, dtype, shape = entry.get("kind"), entry.get("dtype"), entry.get("tf_shape")
        if kind not in ("input", "output"):
            continue
        if not isinstance(dtype, str) or not (
            isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
        ):
            raise NeffReadError(f"tensor map entry {name!r} has no valid dtype and tf_shape")
        tensors.append(NeffTensor(name, kind, dtype, tuple(shape)))
    return tuple(tensors)


def _parameter_order(members: dict[str, bytes]) -> tuple[str, ...]:
    """Input names ordered by neff.json's signature ids; () if it has none (the runtime
    does not need them, so a NEFF without a signature still loads)."""
    try:
        inputs = json.loads(members["neff.json"])["metadata"]["signatures"]["default"]["inputs"]
        return tuple(sorted(inputs, key=lambda name: int(inputs[name]["id"])))
    except (KeyError, TypeError, ValueError):
        return ()
