"""Write NEFF containers for nkibuild's toolchain double (the fake `neuronx-cc`).

Not a compiler: the NEFFs it writes have a real container (the header, MD5 and gzip tar
payload that `nkibuild.formats.neff` reads, laid out like a NEFF from neuronx-cc 2.23:
packaging version 2, format 2.0) and the kernel's signature, but no executable code.
Placeholders carry all three marks that `nkibuild.formats.neff` looks for.

Dtypes are stored as neuronx-cc stores them: fp8 as `int8`, bool as `uint8`
(`nkibuild.dtypes.neff_storage_dtype`). Output is byte-deterministic for equal
arguments, because wheels built from these NEFFs must be reproducible.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nkibuild.dtypes import BY_NAME, neff_storage_dtype
from nkibuild.formats.neff import (
    HEADER,
    HEADER_SIZE,
    PACKAGING_VERSION,
    PLACEHOLDER_BUILD,
    PLACEHOLDER_MEMBER,
    NeffTensor,
    payload_md5_field,
)
from nkibuild.fsutil import atomic_write_bytes

FORMAT_VERSION = (2, 0)  # what neuronx-cc 2.23 writes
PLACEHOLDER_TEXT = (
    "This NEFF is a placeholder written by nkibuild's toolchain double\n"
    "(nkibuild.toolchain_double), not by neuronx-cc. It has the signature of the kernel it\n"
    "stands for but contains no executable code: it cannot run on a NeuronCore.\n"
)

_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/nkibuild/nkibuild/neff")


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
    extra_members: Mapping[str, bytes] | None = None,
    compress: bool = True,
) -> None:
    """Write a NEFF with one subgraph per NeuronCore, atomically and deterministically.

    Tensor dtypes are nkibuild names (`float8_e4m3`, `bool`, ...). `build` defaults to
    the placeholder marker (placeholders) or "nkibuild"; a placeholder's build string
    always starts with the marker. `compress=False` writes the uncompressed tar payload
    of --enable-fast-loading-neuron-binaries.
    """
    if num_tpb < 1:
        raise ValueError(f"num_tpb must be at least 1, not {num_tpb}")
    build = _build_string(build, placeholder)
    members = _metadata_members(compiler_version, inputs, outputs, num_tpb, placeholder)
    for member_name, data in (extra_members or {}).items():
        parts = member_name.split("/")
        if member_name in members or member_name.startswith("/") or {"", ".."} & set(parts):
            raise ValueError(f"invalid or reserved extra NEFF member name {member_name!r}")
        members[member_name] = bytes(data)
    payload = _payload(members, compress)
    header = HEADER.pack(
        PACKAGING_VERSION,
        HEADER_SIZE,
        len(payload),
        *FORMAT_VERSION,
        _fixed_field(build, 128, "build"),
        num_tpb,
        payload_md5_field(io.BytesIO(payload)),
        bytes(16),
        uuid.uuid5(_UUID_NAMESPACE, hashlib.sha256(payload).hexdigest()).bytes,
        _fixed_field(name, 256, "name"),
    ).ljust(HEADER_SIZE, b"\0")
    # Readers (and a concurrent build) never see a half-written NEFF.
    atomic_write_bytes(Path(path), header + payload, durable=False)


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
    names = [t.name for t in (*inputs, *outputs)]
    if "" in names or len(set(names)) < len(names):
        raise ValueError(f"NEFF tensor names must be unique and non-empty: {names}")
    info: dict[str, Any] = {"tool_version": compiler_version, "num_tpb": num_tpb}
    if placeholder:
        info["nkibuild_placeholder"] = True
    signature = {
        t.name: {"id": i, "dtype": _stored_dtype(t), "shape": list(t.shape)}
        for i, t in enumerate(inputs)
    }
    tensor_map = {
        t.name: {
            "kind": kind,
            "dtype": _stored_dtype(t),
            "tf_shape": list(t.shape),
            "is_const": False,
        }
        for kind, tensors in (("input", inputs), ("output", outputs))
        for t in tensors
    }
    subgraphs = [f"sg{i:02d}" for i in range(num_tpb)]
    # neuronx-cc 2.23 leaves the signature's outputs empty; the tensor maps list them.
    default = {"inputs": signature, "outputs": {}}
    members = {
        "info.json": _json_bytes(info),
        "neff.json": _json_bytes({"metadata": {"signatures": {"default": default}}}),
        "kelf-0.json": _json_bytes({"graphs": [{"name": sg} for sg in subgraphs]}),
    }
    members.update({f"{sg}/tensor_map.json": _json_bytes(tensor_map) for sg in subgraphs})
    if placeholder:
        members[PLACEHOLDER_MEMBER] = PLACEHOLDER_TEXT.encode()
    return members


def _stored_dtype(tensor: NeffTensor) -> str:
    if tensor.dtype not in BY_NAME:
        raise ValueError(f"tensor {tensor.name!r} has unknown dtype {tensor.dtype!r}")
    return neff_storage_dtype(tensor.dtype)


def _json_bytes(value: Any) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True) + "\n").encode()


def _payload(members: Mapping[str, bytes], compress: bool) -> bytes:
    """A tar (gzip unless told otherwise) whose bytes depend only on the members."""
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member_name, data in sorted(members.items()):
            info = tarfile.TarInfo(member_name)  # mtime 0, mode 0o644, root, no user names
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if not compress:
        return tar_buffer.getvalue()
    gz_buffer = io.BytesIO()
    # GzipFile rather than gzip.compress: its header bytes are the same on every Python
    # version (mtime 0, no file name).
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz_buffer, mtime=0) as gz:
        gz.write(tar_buffer.getvalue())
    return gz_buffer.getvalue()
