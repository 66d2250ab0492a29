"""What the cold build reads and writes per unit gives the answers of the plain path:
bounded JSON, NEFF payloads however their gzip is framed, NKI paths in HLO modules,
cache directories, the compile's log and work dirs, the peak memory recorded."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import hashlib
import json
import os
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import build, softmax_manifest, softmax_project

from nkibuild.cache import safefs
from nkibuild.cache.store import CorruptEntry
from nkibuild.compiler import local
from nkibuild.formats import backend_config, neff
from nkibuild.formats.jsonlimits import JsonLimitError, JsonLimits, load_json
from nkibuild.formats.neff import HEADER_SIZE, NeffFormatError, read_neff
from nkibuild.frontends.relocation import MARKER, materialize
from nkibuild.toolchain_double.hlo_writer import build_hlo_module
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

# --- bounded JSON ----------------------------------------------------------------------


BENIGN = [
    b'{"tool_version": "2.23.0", "num_tpb": 1, "shape": [8, 64], "x": -12.5e-3}',
    b'{"e1": [1.0, 2, 3], "Infinity-ish": "NaN in a string", "nested": {"a": [[]]}}',
    "[1, 2, 3]".encode("utf-16"),
    b'"just a string \\u00e9"',
]


@pytest.mark.parametrize("raw", BENIGN)
def test_benign_json_reads_as_json_reads_it(raw: bytes) -> None:
    assert load_json(raw) == json.loads(raw)


@pytest.mark.parametrize(
    ("raw", "limits", "message"),
    [
        (b'{"num_tpb": ' + b"9" * 41 + b"}", JsonLimits(), "digits"),
        # Decoded before it is scanned: UTF-16 puts a NUL between the digits.
        (('{"n": ' + "7" * 50 + "}").encode("utf-16-le"), JsonLimits(), "digits"),
        (b"[1e400]", JsonLimits(allow_nonfinite=False), "out of range"),
        (b'{"a": NaN}', JsonLimits(allow_nonfinite=False), "not a number"),
        (b"[-Infinity]", JsonLimits(allow_nonfinite=False), "not a number"),
    ],
)
def test_text_breaking_a_bound_is_refused(raw: bytes, limits: JsonLimits, message: str) -> None:
    with pytest.raises(JsonLimitError, match=message):
        load_json(raw, limits)


def test_a_strict_reader_still_reads_finite_numbers_and_exponent_lookalikes() -> None:
    strict = JsonLimits(allow_nonfinite=False, max_int_digits=20)
    assert load_json(b'{"seconds": 0.25, "x1e": 1e2, "size": 123}', strict) == {
        "seconds": 0.25,
        "x1e": 100.0,
        "size": 123,
    }


def test_a_float_past_1e308_without_an_exponent_is_still_refused_where_infinity_is() -> None:
    lenient_ints = JsonLimits(allow_nonfinite=False, max_int_digits=400)
    with pytest.raises(JsonLimitError, match="out of range"):
        load_json(b"[1" + b"0" * 309 + b".5]", lenient_ints)
    assert load_json(b"[1" + b"0" * 307 + b".5]", lenient_ints) == [1e307]


def test_depth_is_bounded_wherever_the_brackets_are() -> None:
    shallow = JsonLimits(max_depth=3)
    # Many brackets, but inside strings or side by side: accepted.
    assert load_json(b'{"a": "[[[[[", "b": [[1], [2], [3]]}', shallow)["a"] == "[[[[["
    with pytest.raises(JsonLimitError, match="nested more than 3"):
        load_json(b"[[[[1]]]]", shallow)
    with pytest.raises(JsonLimitError, match="nested more than 3"):
        load_json(b'{"a": {"b": {"c": {}}}}', shallow)
    assert load_json(b"[[[1]]]", shallow) == [[[1]]]


# --- NEFF payload: however its gzip is framed ---------------------------------------


def _neff_bytes(tmp_path: Path) -> bytes:
    path = tmp_path / "k.neff"
    tensor = NeffTensor("input0", "float32", (8, 64))
    out = NeffTensor("output0", "float32", (8, 64))
    write_neff(
        path, compiler_version="2.23", inputs=[tensor], outputs=[out], num_tpb=1, placeholder=True
    )
    return path.read_bytes()


def _with_payload(data: bytes, payload: bytes) -> bytes:
    """`data`'s header with size and MD5 fields for `payload`, then `payload`."""
    header = bytearray(data[:HEADER_SIZE])
    struct.pack_into("<Q", header, 16, len(payload))
    struct.pack_into("<4I", header, 172, *struct.unpack(">4I", hashlib.md5(payload).digest()))
    return bytes(header) + payload


def _variants(data: bytes) -> dict[str, bytes]:
    payload = data[HEADER_SIZE:]
    tar = gzip.decompress(payload)
    half = len(tar) // 2
    two_members = gzip.compress(tar[:half], mtime=0) + gzip.compress(tar[half:], mtime=0)
    bad_crc = bytearray(payload)
    bad_crc[-8] ^= 0xFF  # the trailer's CRC32
    return {
        "whole": data,
        "two gzip members": _with_payload(data, two_members),
        "zero padding": _with_payload(data, payload + bytes(512)),
        "trailing garbage": _with_payload(data, payload + b"garbage"),
        "bad crc": _with_payload(data, bytes(bad_crc)),
        "truncated gzip": _with_payload(data, payload[: len(payload) // 2]),
    }


def _read(data: bytes) -> object:
    try:
        return read_neff(data)
    except NeffFormatError as error:
        return str(error)


def test_a_payload_in_any_complete_gzip_framing_reads_as_the_whole_one(tmp_path: Path) -> None:
    variants = _variants(_neff_bytes(tmp_path))
    read = {name: _read(data) for name, data in variants.items()}
    whole = read.pop("whole")
    assert isinstance(whole, neff.NeffInfo) and whole.inputs[0].shape == (8, 64)
    truncated = read.pop("truncated gzip")
    assert "not a readable (gzip) tar archive" in str(truncated)
    sizes = {name: len(variants[name]) - HEADER_SIZE for name in read}
    assert read == {
        name: dataclasses.replace(whole, payload_size=size) for name, size in sizes.items()
    }  # two gzip members, zero padding, trailing garbage, a bad CRC after the whole tar


# --- custom-call paths: NKI paths rewritten, any other module unchanged --------------------


def _module(custom_call: tuple[str, bytes] | None = None) -> bytes:
    return build_hlo_module(
        "k", [("a", "float32", [2])], [("float32", [2])], custom_call=custom_call
    )


def test_a_module_without_an_nki_call_is_unchanged() -> None:
    data = _module()
    assert backend_config.rewrite_paths(data, lambda _: True, lambda v: v + "!") == data
    assert materialize(data, Path("/nowhere")) == data


def test_a_module_with_an_nki_call_is_rewritten(tmp_path: Path) -> None:
    config = base64.b64encode(json.dumps({"bir": MARKER + "sidecars/x.json"}).encode())
    data = _module(("AwsNeuronCustomNativeKernel", config))
    rewritten = materialize(data, tmp_path)
    assert _configs(rewritten) == [{"bir": str(tmp_path.resolve() / "sidecars" / "x.json")}]


def _configs(data: bytes) -> list[object]:
    from nkibuild.formats.hlo import read_hlo

    return [
        json.loads(base64.b64decode(call.backend_config)) for call in read_hlo(data).custom_calls
    ]


def test_a_target_name_elsewhere_in_the_module_is_kept() -> None:
    data = build_hlo_module(
        "AwsNeuronNkiKernel", [("a", "float32", [2])], [("float32", [2])]
    )  # the name only as the module's name: no custom-call to rewrite
    assert backend_config.rewrite_paths(data, lambda _: True, lambda v: v + "!") == data


def test_a_module_given_as_a_memoryview_is_rewritten() -> None:
    config = base64.b64encode(json.dumps({"bir": "/abs/x.json"}).encode())
    view = memoryview(_module(("AwsNeuronNkiKernel", config)))
    rewritten = backend_config.rewrite_paths(view, os.path.isabs, lambda v: "moved")
    assert _configs(rewritten) == [{"bir": "moved"}]


# --- cache dirs: missing ones made, symlinks refused -------------------------------------


def make_dirs(root: Path, parts: tuple[str, ...]) -> None:
    with safefs.opened_dir(root, parts, make=True):
        pass


def test_make_dirs_makes_what_is_missing_and_keeps_what_exists(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    make_dirs(root, ("neff", "ab"))
    assert (root / "neff" / "ab").is_dir()
    (root / "neff" / "ab" / "entry").write_text("kept")
    make_dirs(root, ("neff", "ab"))
    make_dirs(root, ("neff", "cd"))
    assert sorted(p.name for p in (root / "neff").iterdir()) == ["ab", "cd"]
    assert (root / "neff" / "ab" / "entry").read_text() == "kept"


@pytest.mark.parametrize("where", ["neff", "ab"])
def test_make_dirs_never_goes_through_a_symlink(tmp_path: Path, where: str) -> None:
    root, outside = tmp_path / "cache", tmp_path / "outside"
    outside.mkdir()
    (root / "neff").mkdir(parents=True)
    link = root / "neff" if where == "neff" else root / "neff" / "ab"
    if where == "neff":
        link.rmdir()
    link.symlink_to(outside)
    with pytest.raises(CorruptEntry, match="symbolic link"):
        make_dirs(root, ("neff", "ab", "entry"))
    assert list(outside.iterdir()) == []


def test_make_dirs_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    (root / "neff").write_text("not a dir")
    with pytest.raises(CorruptEntry, match="not a directory"):
        make_dirs(root, ("neff", "ab"))


# --- the compile's work dir and log ------------------------------------------------------


def test_the_log_keeps_what_the_compiler_printed_and_stale_work_dirs_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = softmax_project(tmp_path / "p", softmax_manifest(defaults="{targets: [trn2]}"))
    monkeypatch.setenv("NKIBUILD_FAKE_CC_FAULT", "exit1")
    assert not build(root).ok
    unit_dir = root / "build" / "compile" / "softmax" / "default" / "trn2"
    log = (unit_dir / "compile.log").read_text()
    assert "this is nkibuild's toolchain double" in log  # the compiler's log file, first
    printed = "ERROR: injected fault exit1\n"
    assert log.endswith(f"{printed}\n--- neuronx-cc stdout/stderr ---\n{printed}")
    (unit_dir / ".work-of-a-killed-build" / "sub").mkdir(parents=True)
    (unit_dir / "work-not-hidden").mkdir()
    monkeypatch.delenv("NKIBUILD_FAKE_CC_FAULT")
    monkeypatch.setenv("NKIBUILD_RETRY_FAILED", "1")  # the failure is recorded in the cache
    assert build(root).ok
    assert sorted(p.name for p in unit_dir.iterdir() if p.is_dir()) == ["work-not-hidden"]
    assert (unit_dir / "model.neff").is_file()


@pytest.mark.parametrize("recorded", ["-4096", "0", '"big"'])
def test_a_recorded_peak_that_is_no_peak_is_ignored(tmp_path: Path, recorded: str) -> None:
    (tmp_path / "peak-memory.json").write_text(f'{{"peak_memory": {recorded}}}')
    assert local.memory_estimate(SimpleNamespace(compile_memory=None), tmp_path, 0) is None  # type: ignore[arg-type]
    (tmp_path / "peak-memory.json").write_text('{"peak_memory": 4096}')
    assert local.memory_estimate(SimpleNamespace(compile_memory=None), tmp_path, 0) == 4096  # type: ignore[arg-type]
