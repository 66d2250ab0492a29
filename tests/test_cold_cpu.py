"""The cold build's per-unit work made cheaper (issue 17 goal 5, eighth pass): each
shortcut gives what the full path gives, and is taken only where it is sound."""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from nkibuild.cache import safefs
from nkibuild.cache.store import CorruptEntry
from nkibuild.compiler import CompileOptions, local, neuronxcc
from nkibuild.compiler.neuronxcc import CompilerRun
from nkibuild.compiler.process import ProcessOutcome
from nkibuild.formats import backend_config, jsonlimits, neff
from nkibuild.formats.jsonlimits import JsonLimitError, JsonLimits, load_json
from nkibuild.formats.neff import HEADER_SIZE, NeffFormatError, read_neff
from nkibuild.frontends.relocation import MARKER, materialize
from nkibuild.toolchain_double.hlo_writer import build_hlo_module
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

# --- bounded JSON: json's C decoder alone where no bound can be broken -------------------


def _checking_parsers_called(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = jsonlimits._int_parser

    def spy(max_digits: int) -> object:
        calls.append(max_digits)
        return real(max_digits)

    monkeypatch.setattr(jsonlimits, "_int_parser", spy)
    return calls


BENIGN = [
    b'{"tool_version": "2.23.0", "num_tpb": 1, "shape": [8, 64], "x": -12.5e-3}',
    b'{"e1": [1.0, 2, 3], "Infinity-ish": "NaN in a string", "nested": {"a": [[]]}}',
    "[1, 2, 3]".encode("utf-16"),
    b'"just a string \\u00e9"',
]


@pytest.mark.parametrize("raw", BENIGN)
def test_benign_json_is_read_by_the_plain_decoder_with_the_same_value(
    raw: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    called = _checking_parsers_called(monkeypatch)
    assert load_json(raw) == json.loads(raw)
    assert called == []  # no Python callback per number


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
def test_text_that_may_break_a_bound_is_read_by_the_checking_parsers(
    raw: bytes, limits: JsonLimits, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    called = _checking_parsers_called(monkeypatch)
    with pytest.raises(JsonLimitError, match=message):
        load_json(raw, limits)
    assert called == [limits.max_int_digits]


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


def test_depth_is_walked_only_where_the_brackets_allow_it() -> None:
    shallow = JsonLimits(max_depth=3)
    # Many brackets, but inside strings or side by side: walked, and accepted.
    assert load_json(b'{"a": "[[[[[", "b": [[1], [2], [3]]}', shallow)["a"] == "[[[[["
    with pytest.raises(JsonLimitError, match="nested more than 3"):
        load_json(b"[[[[1]]]]", shallow)
    with pytest.raises(JsonLimitError, match="nested more than 3"):
        load_json(b'{"a": {"b": {"c": {}}}}', shallow)
    assert load_json(b"[[[1]]]", shallow) == [[[1]]]


# --- NEFF payload: a small gzip member inflated in one call ------------------------------


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


def test_a_small_gzip_payload_reads_as_gzipfile_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variants = _variants(_neff_bytes(tmp_path))
    inflated = {name: _read(data) for name, data in variants.items()}
    monkeypatch.setattr(neff, "_WHOLE_GZIP_BYTES", -1)  # every payload through GzipFile
    streamed = {name: _read(data) for name, data in variants.items()}
    assert inflated == streamed
    assert isinstance(inflated["whole"], neff.NeffInfo)
    assert inflated["whole"].inputs[0].shape == (8, 64)
    assert "not a readable (gzip) tar archive" in str(inflated["truncated gzip"])


def test_only_one_whole_small_member_skips_gzipfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened = _gzipfiles_opened(monkeypatch)
    variants = _variants(_neff_bytes(tmp_path))
    used = {}
    for name, data in variants.items():
        opened.clear()
        _read(data)
        used[name] = bool(opened)
    assert used == {
        "whole": False,
        "two gzip members": True,
        "zero padding": True,
        "trailing garbage": True,
        "bad crc": True,
        "truncated gzip": True,
    }


def test_a_payload_inflating_past_the_bound_is_streamed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _neff_bytes(tmp_path)
    whole = neff.read_neff(data)
    monkeypatch.setattr(neff, "_WHOLE_TAR_BYTES", 1024)  # the tar is 10 KiB
    streamed = _gzipfiles_opened(monkeypatch)
    assert read_neff(data) == whole
    assert streamed == ["GzipFile"]  # from where the inflating started


def _gzipfiles_opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    real = neff.gzip.GzipFile

    def spy(*args: object, **kwargs: object) -> object:
        opened.append("GzipFile")
        return real(*args, **kwargs)

    monkeypatch.setattr(neff.gzip, "GzipFile", spy)
    return opened


# --- custom-call paths: no parse of a module that calls no NKI kernel --------------------


def _module(custom_call: tuple[str, bytes] | None = None) -> bytes:
    return build_hlo_module(
        "k", [("a", "float32", [2])], [("float32", [2])], custom_call=custom_call
    )


def test_a_module_without_an_nki_call_is_returned_unparsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def parse(*_: object) -> bytes:
        raise AssertionError("parsed a module that calls no NKI kernel")

    monkeypatch.setattr(backend_config, "rewrite_backend_configs", parse)
    data = _module()
    assert backend_config.rewrite_paths(data, lambda _: True, lambda v: v + "!") is data
    assert materialize(data, Path("/nowhere")) is data


def test_a_module_with_an_nki_call_is_still_rewritten(tmp_path: Path) -> None:
    config = base64.b64encode(json.dumps({"bir": MARKER + "sidecars/x.json"}).encode())
    data = _module(("AwsNeuronCustomNativeKernel", config))
    assert backend_config.names_nki_target(data)
    rewritten = materialize(data, tmp_path)
    assert _configs(rewritten) == [{"bir": str(tmp_path.resolve() / "sidecars" / "x.json")}]


def _configs(data: bytes) -> list[object]:
    from nkibuild.formats.hlo import read_hlo

    return [
        json.loads(base64.b64decode(call.backend_config)) for call in read_hlo(data).custom_calls
    ]


def test_a_target_name_elsewhere_in_the_module_is_parsed_and_kept() -> None:
    data = build_hlo_module(
        "AwsNeuronNkiKernel", [("a", "float32", [2])], [("float32", [2])]
    )  # the name only as the module's name: no custom-call to rewrite
    assert backend_config.names_nki_target(data)
    assert backend_config.rewrite_paths(data, lambda _: True, lambda v: v + "!") == data


def test_a_module_that_is_not_bytes_is_parsed_as_before() -> None:
    config = base64.b64encode(json.dumps({"bir": "/abs/x.json"}).encode())
    view = memoryview(_module(("AwsNeuronNkiKernel", config)))
    assert backend_config.names_nki_target(view)  # `in` on a memoryview tests ints
    rewritten = backend_config.rewrite_paths(view, os.path.isabs, lambda v: "moved")
    assert _configs(rewritten) == [{"bir": "moved"}]


# --- cache dirs: existing components opened, missing ones made, symlinks refused ---------


def test_make_dirs_opens_what_exists_and_makes_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []
    real = os.mkdir

    def spy(path: object, *args: object, **kwargs: object) -> None:
        made.append(str(path))
        real(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(safefs.os, "mkdir", spy)
    root = tmp_path / "cache"
    safefs.make_dirs(root, ("neff", "ab"))
    assert (root / "neff" / "ab").is_dir() and made == [str(root), "neff", "ab"]
    made.clear()
    safefs.make_dirs(root, ("neff", "ab"))
    safefs.make_dirs(root, ("neff", "cd"))
    assert made == ["cd"]


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
        safefs.make_dirs(root, ("neff", "ab", "entry"))
    assert list(outside.iterdir()) == []


def test_make_dirs_refuses_a_file_in_the_way(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    (root / "neff").write_text("not a dir")
    with pytest.raises(CorruptEntry, match="not a directory"):
        safefs.make_dirs(root, ("neff", "ab"))


# --- the compile's work dir and log ------------------------------------------------------


def test_the_log_keeps_what_the_compiler_printed_after_its_log_file(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    (work / "compile.log").write_text("log line\n")
    (work / neuronxcc.STDOUT_FILE).write_text("printed\n")
    neuronxcc._keep_log(work, out)
    kept = (out / "compile.log").read_text()
    assert kept == "log line\n\n--- neuronx-cc stdout/stderr ---\nprinted\n"
    assert not (work / "compile.log").exists()


def test_the_log_is_what_was_printed_when_the_compiler_wrote_no_log(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    (work / neuronxcc.STDOUT_FILE).write_text("ERROR: no such flag\n")
    neuronxcc._keep_log(work, out)
    assert (out / "compile.log").read_text().endswith("---\nERROR: no such flag\n")
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    (nothing / neuronxcc.STDOUT_FILE).write_bytes(b"")
    neuronxcc._keep_log(nothing, tmp_path / "out2")  # no log, nothing printed: none kept
    assert not (tmp_path / "out2").exists()


def test_stale_work_dirs_and_only_those_are_removed(tmp_path: Path) -> None:
    for name in (".work-abc", ".work-def"):
        (tmp_path / name / "sub").mkdir(parents=True)
    (tmp_path / "model.neff").write_bytes(b"keep")
    (tmp_path / "work-not-hidden").mkdir()
    neuronxcc._remove_stale_work_dirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.neff", "work-not-hidden"]


def test_a_unit_without_a_known_peak_reads_the_attempts_record_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[Path] = []
    real = local._last_peak

    def spy(out_dir: Path) -> int | None:
        reads.append(out_dir)
        return real(out_dir)

    monkeypatch.setattr(local, "_last_peak", spy)
    outcome = ProcessOutcome(returncode=0, peak_memory=5, seconds=0.1, timed_out=False)
    info = object()
    monkeypatch.setattr(local, "run_compiler", lambda *_, **__: CompilerRun(outcome, info))  # type: ignore[arg-type]
    unit = SimpleNamespace(compile_memory=None)
    job = SimpleNamespace(unit=unit, artifact=None, toolchain=None, out_dir=tmp_path, last_peak=0)
    assert local._compile(job, None, CompileOptions(), []) == (outcome, info)  # type: ignore[arg-type]
    assert reads == [tmp_path]  # the estimate's read; none to compare a peak of 0 with


@pytest.mark.parametrize("recorded", ["-4096", "0", '"big"'])
def test_a_recorded_peak_that_is_no_peak_is_ignored(tmp_path: Path, recorded: str) -> None:
    (tmp_path / "peak-memory.json").write_text(f'{{"peak_memory": {recorded}}}')
    assert local._last_peak(tmp_path) is None
    assert local.memory_estimate(SimpleNamespace(compile_memory=None), tmp_path, 0) is None  # type: ignore[arg-type]
    (tmp_path / "peak-memory.json").write_text('{"peak_memory": 4096}')
    assert local.memory_estimate(SimpleNamespace(compile_memory=None), tmp_path, 0) == 4096  # type: ignore[arg-type]
