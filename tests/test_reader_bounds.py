"""Binary readers are bounded: NEFF bombs, sparse and oversized tar members, hostile JSON,
HLO custom-call configs; and a coverage-guided fuzzer over the NEFF and HLO readers.

The fuzzer is a small mutation fuzzer in the style of libFuzzer. Line coverage
(sys.settrace, restricted to the reader modules and the standard-library
code they drive: tarfile, gzip, lzma, bz2, json, protobuf's pure-Python parts) decides
which inputs join the corpus, as in libFuzzer: an input that reaches a line no earlier
input reached is kept and mutated further. Anything the target raises that is not one
of the `allowed` error types is a finding.

`python tests/test_reader_bounds.py neff|hlo|config SECONDS SEED` runs one campaign and
prints its figures as JSON (with the process's peak RSS); the tests run it in a
subprocess, so the RSS is the fuzzer's own. The short runs are in the default suite,
the long ones (NKIBUILD_FUZZ_SECONDS, default 300 per reader) are marked slow.
"""

from __future__ import annotations

import base64
import bz2
import gzip
import hashlib
import io
import json
import lzma
import os
import random
import resource
import struct
import subprocess
import sys
import tarfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nkibuild.formats.backend_config import BackendConfigError, decode
from nkibuild.formats.hlo import HloFormatError, read_hlo
from nkibuild.formats.jsonlimits import JsonLimitError, JsonLimits, load_json
from nkibuild.formats.neff import HEADER_SIZE, NeffFormatError, NeffLimits, read_neff
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

TRACED = (
    "nkibuild/formats/",
    "/tarfile.py",
    "/gzip.py",
    "/lzma.py",
    "/bz2.py",
    "/json/",
    "/_compression.py",
)
# Small limits, so a mutated size field costs milliseconds, not the real caps' seconds.
LIMITS = NeffLimits(
    file_bytes=8 << 20,
    payload_bytes=8 << 20,
    member_bytes=1 << 20,
    metadata_bytes=4 << 20,
    members=2000,
    extended_header_bytes=16 << 10,
    names_bytes=1 << 20,
)


@dataclass
class Campaign:
    inputs: int = 0
    corpus: int = 0
    lines: int = 0
    rejected: int = 0  # the documented error
    accepted: int = 0
    findings: list[str] = field(default_factory=list)


def run(
    target: Callable[[bytes], object],
    allowed: tuple[type[BaseException], ...],
    seeds: list[bytes],
    mutate: Callable[[random.Random, bytes, list[bytes]], bytes],
    seconds: float,
    seed: int,
) -> Campaign:
    rng = random.Random(seed)
    seen: set[tuple[str, int]] = set()
    corpus = list(seeds)
    campaign = Campaign()
    deadline = time.monotonic() + seconds
    pending = list(seeds)
    while time.monotonic() < deadline:
        data = pending.pop() if pending else mutate(rng, rng.choice(corpus), corpus)
        hit: set[tuple[str, int]] = set()
        outcome = _traced(target, data, allowed, hit)
        campaign.inputs += 1
        if outcome is None:
            campaign.accepted += 1
        elif outcome == "rejected":
            campaign.rejected += 1
        else:
            campaign.findings.append(outcome)
        if not hit <= seen:
            seen |= hit
            corpus.append(data)
    campaign.corpus, campaign.lines = len(corpus), len(seen)
    return campaign


def _traced(
    target: Callable[[bytes], object],
    data: bytes,
    allowed: tuple[type[BaseException], ...],
    hit: set[tuple[str, int]],
) -> str | None:
    def tracer(frame: Any, event: str, arg: Any) -> Any:
        filename = frame.f_code.co_filename
        if not any(part in filename for part in TRACED):
            return None
        if event == "line":
            hit.add((filename, frame.f_lineno))
        return tracer

    sys.settrace(tracer)
    try:
        target(data)
    except allowed:
        return "rejected"
    except Exception:  # a finding: anything else is a bug in the reader
        return f"{data[:64]!r}...: {traceback.format_exc(limit=-3)}"
    finally:
        sys.settrace(None)
    return None


# --- mutations -----------------------------------------------------------------------------

INTERESTING = (
    b"\0", b"\xff", b"\x7f", b"\x80", b"0", b"9" * 12, b"7777777", b"[" * 70, b"[" * 5000, b"-1",
    b"9" * 50, b"NaN", b"1e999",
)  # fmt: skip


def mutate_bytes(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    buffer = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(6)
        at = rng.randrange(len(buffer) + 1)
        if choice == 0 and buffer:
            buffer[min(at, len(buffer) - 1)] ^= 1 << rng.randrange(8)
        elif choice == 1:
            buffer[at:at] = rng.choice(INTERESTING)
        elif choice == 2:
            del buffer[at : at + rng.randint(1, 64)]
        elif choice == 3:
            buffer[at : at + 4] = rng.choice(INTERESTING)
        elif choice == 4 and buffer:
            start = rng.randrange(len(buffer))
            buffer[at:at] = buffer[start : start + rng.randint(1, 256)]
        else:
            other = rng.choice(corpus)
            buffer[at:] = other[rng.randrange(len(other) + 1) :]
    return bytes(buffer)


def neff_container(payload: bytes, header: bytes | None = None) -> bytes:
    """`payload` behind a header whose size and MD5 fields match it (so mutations of the
    payload reach the tar reader instead of stopping at the checksum)."""
    base = bytearray(header if header is not None else bytes(HEADER_SIZE))
    struct.pack_into("<5Q", base, 0, 2, HEADER_SIZE, len(payload), 2, 0)
    digest = hashlib.md5(payload).digest()
    struct.pack_into("<4I", base, 172, *struct.unpack(">4I", digest))
    return bytes(base[:HEADER_SIZE]) + payload


def _untar(payload: bytes) -> bytes:
    for opener in (gzip.decompress, lzma.decompress, bz2.decompress):
        try:
            return opener(payload)
        except Exception:  # not that compression: try the next
            continue
    return payload


COMPRESSORS: tuple[Callable[[bytes], bytes], ...] = (
    lambda b: b,
    lambda b: gzip.compress(b, mtime=0),
    lambda b: lzma.compress(b, preset=0),
    lambda b: bz2.compress(b, 1),
)


def mutate_neff(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    if len(data) < HEADER_SIZE or rng.random() < 0.1:
        return mutate_bytes(rng, data, corpus)  # header fields and raw bytes too
    header, payload = data[:HEADER_SIZE], data[HEADER_SIZE:]
    if rng.random() < 0.6:  # mutate the tar itself, then recompress
        tar = mutate_bytes(rng, _untar(payload), [_untar(c[HEADER_SIZE:]) for c in corpus[-8:]])
        payload = rng.choice(COMPRESSORS)(tar)
    else:
        payload = mutate_bytes(rng, payload, corpus)
    return neff_container(payload, header)


def neff_seeds() -> list[bytes]:
    members = {
        "info.json": {"tool_version": "2.23", "num_tpb": 1},
        "neff.json": {
            "metadata": {
                "signatures": {
                    "default": {"inputs": {"x": {"id": 0, "dtype": "float32", "shape": [4, 8]}}}
                }
            }
        },
        "kelf-0.json": {"graphs": [{"name": "sg00"}]},
        "sg00/tensor_map.json": {
            "x": {"kind": "input", "dtype": "float32", "tf_shape": [4, 8], "is_const": False},
            "output0": {
                "kind": "output",
                "dtype": "float32",
                "tf_shape": [4, 8],
                "is_const": False,
            },
        },
    }
    seeds = []
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
            for name, value in members.items():
                raw = json.dumps(value).encode()
                info = tarfile.TarInfo(("./" if fmt == tarfile.GNU_FORMAT else "") + name)
                info.size = len(raw)
                tar.addfile(info, io.BytesIO(raw))
            long = tarfile.TarInfo("sgLnk/" + "d" * 120 + "/x.bin")
            long.size = 3
            tar.addfile(long, io.BytesIO(b"abc"))
        for compress in COMPRESSORS:
            seeds.append(neff_container(compress(buffer.getvalue())))
    return seeds


def hlo_seeds() -> list[bytes]:
    config = base64.b64encode(json.dumps({"kernel": "/abs/k.bir", "grid": [1, 2]}).encode())
    return [
        build_hlo_module(
            "m", [("x", "float32", [4, 8]), ("y", "bfloat16", [8])], [("float32", [4, 8])]
        ),
        build_hlo_module(
            "k",
            [("a", "float16", [2, 2])],
            [("float16", [2, 2]), ("int8", [3])],
            custom_call=("AwsNeuronCustomNativeKernel", config),
        ),
    ]


def read_hlo_and_configs(data: bytes) -> None:
    info = read_hlo(data)
    for call in info.custom_calls:
        decode(call.backend_config)


def config_seeds() -> list[bytes]:
    values: list[Any] = [{"a": [1, 2, {"b": "/x"}]}, [[[["deep"]]]], "text", 12, {"n": 1e10}]
    return [base64.b64encode(json.dumps(v).encode()) for v in values] + [b"-_x=", b"e30="]


def mutate_config(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    if rng.random() < 0.5:  # mutate the JSON inside, re-encode
        try:
            inner = base64.b64decode(data, validate=False)
        except ValueError:
            inner = data
        altchars = b"-_" if rng.random() < 0.3 else None
        return base64.b64encode(mutate_bytes(rng, inner, corpus), altchars=altchars)
    return mutate_bytes(rng, data, corpus)


TARGETS: dict[
    str,
    tuple[
        Callable[[bytes], object], tuple[type[BaseException], ...], Callable[[], list[bytes]], Any
    ],
] = {
    "neff": (lambda b: read_neff(b, limits=LIMITS), (NeffFormatError,), neff_seeds, mutate_neff),
    "hlo": (read_hlo_and_configs, (HloFormatError,), hlo_seeds, mutate_bytes),
    "config": (decode, (BackendConfigError,), config_seeds, mutate_config),
}


def peak_rss_kb() -> int:
    """This process's peak RSS in KiB: VmHWM, which starts afresh at exec. (getrusage's
    ru_maxrss does not: a child forked from a big pytest process inherits its peak.)"""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str]) -> int:
    name, seconds, seed = argv[0], float(argv[1]), int(argv[2])
    target, allowed, seeds, mutate = TARGETS[name]
    before = peak_rss_kb()
    started = time.monotonic()
    campaign = run(target, allowed, seeds(), mutate, seconds, seed)
    figures = {
        "target": name,
        "seed": seed,
        "seconds": round(time.monotonic() - started, 1),
        "inputs": campaign.inputs,
        "accepted": campaign.accepted,
        "rejected": campaign.rejected,
        "corpus": campaign.corpus,
        "lines": campaign.lines,
        "findings": campaign.findings[:5],
        "finding_count": len(campaign.findings),
        "rss_before_kb": before,
        "rss_peak_kb": peak_rss_kb(),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# --- tests ---------------------------------------------------------------------------------

THIS = Path(__file__).resolve()
GIB = 1 << 30
CHUNK_MIB = 16
_STREAMS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda b: gzip.compress(b, compresslevel=9, mtime=0),
    "xz": lambda b: lzma.compress(b, preset=6),
    "bz2": lambda b: bz2.compress(b, 9),
}


def tar_header(name: str, size: int, kind: bytes = tarfile.REGTYPE, **pax: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    if pax:
        info.pax_headers = pax
        return info.tobuf(format=tarfile.PAX_FORMAT)
    return info.tobuf(format=tarfile.GNU_FORMAT)


def valid_members() -> bytes:
    """A tar (without its end blocks) of the members a NEFF needs."""
    tar = _untar(neff_seeds()[0][HEADER_SIZE:])
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.getmembers()
        return tar[: archive.offset]


def bomb(path: Path, method: str, name: str, expanded: int, *, first: bytes = b"") -> Path:
    """A NEFF whose payload decompresses to a member `name` of `expanded` zero bytes.

    Built from concatenated compressed streams (gzip members, xz and bz2 streams are
    read back to back), so a 5 GiB bomb is made in milliseconds and is a few MB."""
    compress = _STREAMS[method]
    chunk = compress(bytes(CHUNK_MIB << 20))
    count, rest = divmod(expanded, CHUNK_MIB << 20)
    head = compress(first + tar_header(name, expanded))
    tail = compress(bytes(rest) + bytes(-expanded % 512) + bytes(1024))
    payload = head + chunk * count + tail
    path.write_bytes(neff_container(payload))
    return path


def sparse_member(name: str, realsize: int) -> bytes:
    """An old-GNU sparse member header ('S'): one 512-byte data block standing for
    `realsize` bytes."""
    block = bytearray(tar_header(name, 512))
    block[156:157] = tarfile.GNUTYPE_SPARSE
    block[386:398] = b"%011o\0" % 0  # first sparse chunk: offset 0 ...
    block[398:410] = b"%011o\0" % 512  # ... 512 bytes
    block[483:495] = b"%011o\0" % realsize
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block) + bytes(512)


def container(tar: bytes, method: str = "gzip") -> bytes:
    return neff_container(_STREAMS[method](tar + bytes(1024)) if method else tar + bytes(1024))


def rejected_as(data: bytes | Path, why: str, limits: NeffLimits | None = None) -> str:
    with pytest.raises(NeffFormatError) as raised:
        read_neff(data, limits=limits or NeffLimits())
    message = str(raised.value)
    assert "not a valid NEFF: " in message and why in message, message
    return message


SMALL = NeffLimits(payload_bytes=32 << 20)


@pytest.mark.parametrize("method", ["gzip", "xz", "bz2"])
def test_a_compression_bomb_stops_at_the_payload_cap(tmp_path: Path, method: str) -> None:
    path = bomb(tmp_path / "bomb.neff", method, "blob.bin", 64 << 20, first=valid_members())
    rejected_as(path, "decompresses to more than 33554432 bytes", SMALL)


@pytest.mark.parametrize("method", ["gzip", "xz", "bz2", ""])
@pytest.mark.parametrize("member", ["info.json", "sg00/tensor_map.json"])
def test_a_metadata_member_declaring_10_gb_is_refused_before_it_is_read(
    tmp_path: Path, method: str, member: str
) -> None:
    data = container(valid_members() + tar_header(member, 10 * GIB) + bytes(4096), method)
    rejected_as(data, f"member {member} is {10 * GIB} bytes")


@pytest.mark.parametrize(
    "tar",
    [
        sparse_member("info.json", 10 * GIB),
        sparse_member("blob", 10 * GIB),
        tar_header(
            "info.json",
            512,
            **{"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "9" * 11},
        )
        + b"1\n0\n512\n".ljust(512, b"\0")
        + bytes(512),
        tar_header("x", 512, **{"GNU.sparse.map": "0,512", "GNU.sparse.size": "99999999999"})
        + bytes(512),
        tar_header(
            "x",
            512,
            **{
                "GNU.sparse.size": "99999999999",
                "GNU.sparse.offset": "0",
                "GNU.sparse.numbytes": "512",
            },
        )
        + bytes(512),
    ],
    ids=["old-gnu-info", "old-gnu-blob", "pax-1.0", "pax-0.1", "pax-0.0"],
)
def test_sparse_members_are_refused(tar: bytes) -> None:
    rejected_as(container(valid_members() + tar), "sparse")


@pytest.mark.parametrize(
    ("kind", "size"),
    [
        (tarfile.XHDTYPE, GIB),
        (tarfile.XGLTYPE, GIB),
        (tarfile.GNUTYPE_LONGNAME, GIB),
        (tarfile.GNUTYPE_LONGLINK, 100 << 20),
    ],
)
def test_huge_extended_headers_are_refused_unread(kind: bytes, size: int) -> None:
    rejected_as(container(tar_header("h", size, kind) + bytes(1024)), "extended tar header")


def test_too_many_members_or_names_are_refused() -> None:
    tiny = b"".join(tar_header(f"m{i}", 0) for i in range(2500))
    rejected_as(container(valid_members() + tiny), "more than 2000 members", LIMITS)
    long_names = b"".join(tar_header("n" * 5000 + str(i), 0) for i in range(300))
    rejected_as(container(valid_members() + long_names), "bytes of member names", LIMITS)


def _member(name: str, raw: bytes) -> bytes:
    return tar_header(name, len(raw)) + raw + bytes(-len(raw) % 512)


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        pytest.param(b"[" * 100 + b"]" * 100, "nested more than 64", id="deep-100"),
        pytest.param(b"[" * 1_000_000 + b"]" * 1_000_000, "nested more", id="deep-million"),
        pytest.param(b'{"a":' * 200 + b"1" + b"}" * 200, "nested more", id="deep-objects"),
        pytest.param(b'{"num_tpb": ' + b"9" * 5000 + b"}", "digits", id="int-5000-digits"),
        pytest.param(b'{"num_tpb": ' + b"9" * 41 + b"}", "digits", id="int-41-digits"),
        pytest.param(b'{"x": "\xff\xfe"}', "not valid JSON", id="not-utf8"),
    ],
)
def test_hostile_json_members_are_format_errors(raw: bytes, why: str) -> None:
    rejected_as(container(valid_members() + _member("info.json", raw)), why)


def test_huge_shape_values_are_format_errors() -> None:
    tensor_map = {"output0": {"kind": "output", "dtype": "float32", "tf_shape": [2**64]}}
    members = valid_members().replace(b"sg00/tensor_map.json", b"sg99/tensor_map.json")
    raw = json.dumps(tensor_map).encode()
    rejected_as(container(_member("sg00/tensor_map.json", raw) + members), "list of sizes")


def test_files_that_are_not_regular_or_too_large_are_format_errors(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.neff"
    os.mkfifo(fifo)
    rejected_as(fifo, "not a regular file")  # and no hang
    big = tmp_path / "big.neff"
    with open(big, "wb") as handle:
        handle.truncate(5 * GIB)
    rejected_as(big, "more than")
    rejected_as(Path("/dev/zero"), "not a regular file")


def test_bounded_json() -> None:
    assert load_json(b'{"a": [1, 2.5, "x"]}') == {"a": [1, 2.5, "x"]}
    strict = JsonLimits(allow_nonfinite=False, max_depth=3)
    for raw in (b"NaN", b"[-Infinity]", b"1e400", b"[[[[1]]]]", b"[" * 50_000):
        with pytest.raises(JsonLimitError):
            load_json(raw, strict)


# --- HLO custom-call configs -----------------------------------------------------------------


@pytest.mark.parametrize(
    "inner",
    [b"[" * 100 + b"]" * 100, b"[" * 200_000, b'{"a":' * 80 + b"1" + b"}" * 80, b"9" * 5000],
    ids=["deep-100", "deep-200000", "deep-objects", "int-5000-digits"],
)
def test_deep_or_huge_configs_are_refused(inner: bytes) -> None:
    with pytest.raises(BackendConfigError):
        decode(base64.b64encode(inner))
    module = build_hlo_module(
        "k",
        [("a", "float16", [2])],
        [("float16", [2])],
        custom_call=("AwsNeuronCustomNativeKernel", base64.b64encode(inner)),
    )
    with pytest.raises(HloFormatError):
        read_hlo_and_configs(module)


def test_a_huge_base64_config_is_refused_before_decoding() -> None:
    with pytest.raises(BackendConfigError, match="at most"):
        decode(b"A" * ((64 << 20) + 4))
    assert decode(b"not base64 at all!") is None  # garbage stays "not base64 JSON"
    assert decode(base64.b64encode(b"{not json")) is None


def test_an_hlo_file_that_is_not_regular_is_a_format_error(tmp_path: Path) -> None:
    from nkibuild.formats.hlo import read_hlo_file

    fifo = tmp_path / "module.pb"
    os.mkfifo(fifo)
    with pytest.raises(HloFormatError, match="not a regular file"):
        read_hlo_file(fifo)
    with pytest.raises(HloFormatError, match="not a regular file"):
        read_hlo_file("/dev/zero")


# --- memory, measured in a fresh process --------------------------------------------------------

RSS_SCRIPT = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from test_reader_bounds import peak_rss_kb
from nkibuild.formats.neff import NeffFormatError, NeffLimits, read_neff
cap, members = int(sys.argv[2]), int(sys.argv[3])
limits = NeffLimits(payload_bytes=cap, members=members) if cap else NeffLimits()
before = peak_rss_kb()
errors = []
for path in sys.argv[4:]:
    try:
        read_neff(Path(path), limits=limits)
        errors.append(None)
    except NeffFormatError as error:
        errors.append(str(error)[-90:])
after = peak_rss_kb()
print(json.dumps({"growth_kb": after - before, "before_kb": before, "errors": errors}))
"""


def bombs(directory: Path, expanded: int, members: int) -> list[Path]:
    paths = [
        bomb(directory / f"{m}.neff", m, "blob.bin", expanded, first=valid_members())
        for m in _STREAMS
    ]
    paths += [bomb(directory / f"wanted-{m}.neff", m, "info.json", 10 * GIB) for m in _STREAMS]
    sparse = directory / "sparse.neff"
    sparse.write_bytes(container(valid_members() + sparse_member("info.json", 10 * GIB)))
    deep = directory / "deep.neff"
    deep.write_bytes(container(valid_members() + _member("info.json", b"[" * (8 << 20))))
    many = directory / "many.neff"
    many.write_bytes(
        container(valid_members() + b"".join(tar_header(f"m{i}", 0) for i in range(60_000)))
    )
    return [*paths, sparse, deep, many]


def peak_rss_growth(paths: list[Path], payload_cap: int, members: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", RSS_SCRIPT, str(THIS.parent), str(payload_cap), str(members)]
        + [str(path) for path in paths],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
        env={**os.environ, "PYTHONPATH": str(THIS.parents[1])},
    )
    figures = json.loads(result.stdout)
    assert all(figures["errors"]), figures  # every bomb is refused
    return figures


def test_bombs_are_refused_in_bounded_memory(tmp_path: Path) -> None:
    """Default limits except a 64 MiB payload cap and 5000 members (the full caps: the
    slow variant)."""
    figures = peak_rss_growth(bombs(tmp_path, GIB, 6000), 64 << 20, 5000)
    print(figures)
    assert figures["growth_kb"] < 200 << 10, figures


@pytest.mark.slow
def test_bombs_past_the_default_caps_are_refused_in_bounded_memory(tmp_path: Path) -> None:
    figures = peak_rss_growth(bombs(tmp_path, 5 * GIB, 60_000), 0, 0)
    print(figures)
    assert figures["growth_kb"] < 200 << 10, figures
    assert all("more than 4294967296" in e for e in figures["errors"][:3]), figures


# --- fuzzing -------------------------------------------------------------------------------


def fuzz(target: str, seconds: float, seed: int) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, str(THIS), target, str(seconds), str(seed)],
        capture_output=True,
        text=True,
        timeout=seconds * 3 + 120,
        check=True,
    )
    figures = json.loads(result.stdout)
    print(figures)
    assert figures["finding_count"] == 0, figures["findings"]
    assert figures["rss_peak_kb"] - figures["rss_before_kb"] < 200 << 10, figures
    assert figures["rejected"] and figures["corpus"] > len(TARGETS[target][2]()), figures
    return figures


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_readers_briefly(target: str) -> None:
    fuzz(target, 2, int(os.environ.get("NKIBUILD_FUZZ_SEED", "1")))


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz_readers(target: str) -> None:
    seconds = float(os.environ.get("NKIBUILD_FUZZ_SECONDS", "300"))
    fuzz(target, seconds, int(os.environ.get("NKIBUILD_FUZZ_SEED", "20261123")))
