"""`nkibuild inspect`: NEFF fields for people and scripts; corrupt files are clear errors."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_nkibuild

from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff


def neff(path: Path, placeholder: bool = True) -> Path:
    write_neff(
        path,
        compiler_version="2.23.6484.0+3b612583",
        inputs=[NeffTensor("x", "float16", (128, 256)), NeffTensor("y", "float16", (256, 128))],
        outputs=[NeffTensor("output0", "float16", (128, 128))],
        num_tpb=2,
        placeholder=placeholder,
    )
    return path


def test_inspect_prints_compiler_cores_and_io(tmp_path: Path) -> None:
    result = run_nkibuild(["inspect", str(neff(tmp_path / "m.neff", placeholder=False))], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("m.neff: NEFF, compiled")
    assert "  compiler:   neuronx-cc 2.23.6484.0+3b612583" in lines
    assert "  cores:      2 (2 subgraphs: sg00, sg01)" in lines
    assert "  checksum:   ok" in lines
    assert lines[-5:] == [
        "  inputs:",
        "    x: float16[128,256]",
        "    y: float16[256,128]",
        "  outputs:",
        "    output0: float16[128,128]",
    ]


def test_inspect_json_and_placeholder_mark(tmp_path: Path) -> None:
    result = run_nkibuild(["inspect", "--json", str(neff(tmp_path / "p.neff"))], tmp_path)
    data = json.loads(result.stdout)
    assert data["placeholder"] is True and data["checksum_ok"] is True
    assert [t["name"] for t in data["inputs"]] == ["x", "y"]


def test_truncated_and_corrupt_neffs_are_clear_errors(tmp_path: Path) -> None:
    data = neff(tmp_path / "m.neff").read_bytes()
    (tmp_path / "truncated.neff").write_bytes(data[: len(data) - 100])
    flipped = bytearray(data)
    flipped[1100] ^= 0xFF
    (tmp_path / "flipped.neff").write_bytes(bytes(flipped))
    (tmp_path / "garbage.neff").write_bytes(b"not a neff at all" * 10)
    for name in ("truncated.neff", "flipped.neff", "garbage.neff", "missing.neff"):
        result = run_nkibuild(["inspect", name], tmp_path)
        assert result.returncode == 1, name
        assert name in result.stderr and "Traceback" not in result.stderr, result.stderr
