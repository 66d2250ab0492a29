"""The fake neuronx-cc, run as a subprocess on real JAX HLO like nkibuild runs the real one."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from nkibuild.formats.neff import NeffFormatError, NeffInfo, NeffTensor, read_neff
from nkibuild.toolchain_double.fake_neuronxcc import FAKE_COMPILER_VERSION
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

REPO = Path(__file__).resolve().parents[1]
ENV_PREFIXES = ("NKIBUILD_FAKE_CC_", "NEURON_CC_FLAGS")
COMMAND = (sys.executable, "-m", "nkibuild.toolchain_double.fake_neuronxcc")


@pytest.fixture(scope="module")
def hlo_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    jax = pytest.importorskip("jax")

    def kernel(x: Any, y: Any) -> Any:
        return x @ y, x.sum()

    specs = (
        jax.ShapeDtypeStruct((128, 256), "bfloat16"),
        jax.ShapeDtypeStruct((256, 64), "bfloat16"),
    )
    hlo = jax.jit(kernel).lower(*specs).compiler_ir("hlo").as_serialized_hlo_module_proto()
    path = tmp_path_factory.mktemp("hlo") / "model.hlo_module.pb"
    path.write_bytes(hlo)
    return path


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    """The test's environment without fault variables or NEURON_CC_FLAGS, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIXES)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env | extra


def run(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run the fake compiler as nkibuild would."""
    return subprocess.run(
        [*COMMAND, *args],
        cwd=cwd,
        env=clean_env(env or {}),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def compile_args(hlo: Path, target: str = "trn2", output: str = "model.neff") -> list[str]:
    return ["compile", str(hlo), "--framework", "XLA", "--target", target, "--output", output]


def test_version(tmp_path: Path) -> None:
    result = run(["--version"], tmp_path)
    assert result.returncode == 0
    assert result.stdout == f"NeuronX Compiler version {FAKE_COMPILER_VERSION}\n"
    assert FAKE_COMPILER_VERSION == "2.23.0.0+nkibuild.fake"


def test_compile_writes_placeholder_neff(tmp_path: Path, hlo_path: Path) -> None:
    args = [
        *compile_args(hlo_path),
        "--lnc",
        "2",
        "-O3",
        "--auto-cast",
        "matmult",
        "--auto-cast-type",
        "fp16",
        "--model-type",
        "transformer",
        "--verbose",
        "--enable-fast-loading-neuron-binaries",
        "--internal-tensorizer-opt-level=2",
        "--internal-some-future-flag=on",
        "--internal-other-flag",
        "3",
        "--logfile",
        "build.log",
        "--pipeline",
        "compile",
        "SaveTemps",
    ]
    result = run(args, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "Compiler status PASS" in result.stdout
    info = read_neff(tmp_path / "model.neff")
    assert info.placeholder
    assert info.compiler_version == FAKE_COMPILER_VERSION
    assert info.inputs == (
        NeffTensor("p0", "bfloat16", (128, 256)),
        NeffTensor("p1", "bfloat16", (256, 64)),
    )
    assert info.outputs == (
        NeffTensor("output0", "bfloat16", (128, 64)),
        NeffTensor("output1", "bfloat16", ()),
    )
    # --enable-fast-loading-neuron-binaries: an uncompressed payload.
    assert (tmp_path / "model.neff").read_bytes()[1024:1026] != b"\x1f\x8b"
    log = (tmp_path / "build.log").read_text()
    assert "this is nkibuild's toolchain double" in log
    assert not (tmp_path / "log-neuron-cc.txt").exists()


def read_record(neff: Path) -> dict[str, Any]:
    payload = neff.read_bytes()[1024:]
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(payload))) as tar:
        member = tar.extractfile("nkibuild_fake_compile.json")
        assert member is not None
        return json.loads(member.read())


def compile_ok(hlo: Path, cwd: Path, *extra: str, env: dict[str, str] | None = None) -> NeffInfo:
    result = run([*compile_args(hlo), *extra], cwd, env)
    assert result.returncode == 0, result.stderr
    return read_neff(cwd / "model.neff")


def test_records_argv_and_input_hash(tmp_path: Path, hlo_path: Path) -> None:
    compile_ok(hlo_path, tmp_path, "-O1", env={"NEURON_CC_FLAGS": "--lnc 1 --verbose"})
    record = read_record(tmp_path / "model.neff")
    # Paths are recorded by name only, so the NEFF does not depend on where it was built.
    expected = [*compile_args(hlo_path), "-O1", "--lnc", "1", "--verbose"]
    assert record["argv"] == [hlo_path.name if a == str(hlo_path) else a for a in expected]
    assert record["input_sha256"] == hashlib.sha256(hlo_path.read_bytes()).hexdigest()
    assert read_neff(tmp_path / "model.neff").num_tpb == 1  # the appended --lnc 1 applied


@pytest.mark.parametrize(
    ("target", "flags", "lnc"),
    [
        ("trn1", [], 1),
        ("trn1n", [], 1),
        ("inf2", [], 1),
        ("trn2", [], 2),
        ("trn3", [], 2),
        ("trn2", ["--lnc", "1"], 1),
        ("trn3", ["--logical-nc-config", "1"], 1),
        ("trn1", ["--lnc", "1"], 1),
    ],
)
def test_logical_nc_config(
    tmp_path: Path, hlo_path: Path, target: str, flags: list[str], lnc: int
) -> None:
    result = run([*compile_args(hlo_path, target), *flags], tmp_path)
    assert result.returncode == 0, result.stderr
    info = read_neff(tmp_path / "model.neff")
    assert info.num_tpb == lnc
    assert info.subgraphs == tuple(f"sg{i:02d}" for i in range(lnc))


@pytest.mark.parametrize(
    ("target", "flags", "env"),
    [
        ("trn1", ["--lnc", "2"], {}),
        ("inf2", ["--logical-nc-config", "2"], {}),
        ("trn1n", [], {"NEURON_CC_FLAGS": "--lnc=2"}),
    ],
)
def test_lnc2_rejected_on_trn1(
    tmp_path: Path, hlo_path: Path, target: str, flags: list[str], env: dict[str, str]
) -> None:
    result = run([*compile_args(hlo_path, target), *flags], tmp_path, env)
    assert result.returncode == 1
    assert "NCC_EARG001" in result.stderr
    assert "NCC_EARG001" in (tmp_path / "log-neuron-cc.txt").read_text()
    assert not (tmp_path / "model.neff").exists()


@pytest.mark.parametrize(
    "args",
    [
        ["compile", "in.pb", "--framework", "TENSORFLOW", "--target", "trn2"],
        ["compile", "in.pb", "--framework", "XLA", "--target", "trn9"],
        ["compile", "in.pb", "--framework", "XLA", "--target", "trn2", "--bogus"],
        ["compile", "in.pb", "--framework", "XLA", "--target", "trn2", "-O", "7"],
        ["compile", "in.pb", "--target", "trn2"],
        [],
    ],
    ids=["framework", "target", "unknown-flag", "optlevel", "no-framework", "no-command"],
)
def test_bad_command_lines(tmp_path: Path, args: list[str]) -> None:
    result = run(args, tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip()
    assert not (tmp_path / "file.neff").exists()


def test_default_output_and_logfile(tmp_path: Path, hlo_path: Path) -> None:
    args = ["compile", str(hlo_path), "--framework", "XLA", "--target", "trn1"]
    assert run(args, tmp_path).returncode == 0
    assert read_neff(tmp_path / "file.neff").num_tpb == 1
    log = (tmp_path / "log-neuron-cc.txt").read_text()
    assert "this is nkibuild's toolchain double" in log
    assert "Compiler status PASS" in log


@pytest.mark.parametrize(
    "content", [b"", b"garbage, not a proto", None], ids=["empty", "junk", "missing"]
)
def test_unreadable_hlo_exits_70(tmp_path: Path, content: bytes | None) -> None:
    hlo = tmp_path / "bad.pb"
    if content is not None:
        hlo.write_bytes(content)
    result = run(compile_args(hlo), tmp_path)
    assert result.returncode == 70
    log = (tmp_path / "log-neuron-cc.txt").read_text()
    assert "ERROR" in log
    assert "bad.pb" in log
    assert not (tmp_path / "model.neff").exists()


def test_output_is_deterministic(tmp_path: Path, hlo_path: Path) -> None:
    first, second, other = (tmp_path / name for name in ("a", "b", "c"))
    for cwd in (first, second, other):
        cwd.mkdir()
    compile_ok(hlo_path, first)
    compile_ok(hlo_path, second)
    compile_ok(hlo_path, other, "-O1")
    neff = "model.neff"
    assert (first / neff).read_bytes() == (second / neff).read_bytes()
    assert (first / neff).read_bytes() != (other / neff).read_bytes()


# --- injected faults -----------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "status"), [("exit1", 1), ("exit70", 70), ("kill9", -9)])
def test_failing_faults(tmp_path: Path, hlo_path: Path, fault: str, status: int) -> None:
    result = run(compile_args(hlo_path), tmp_path, {"NKIBUILD_FAKE_CC_FAULT": fault})
    assert result.returncode == status
    assert not (tmp_path / "model.neff").exists()
    assert (tmp_path / "log-neuron-cc.txt").exists()


def test_hang_fault(tmp_path: Path, hlo_path: Path) -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        run(compile_args(hlo_path), tmp_path, {"NKIBUILD_FAKE_CC_FAULT": "hang"}, timeout=1.5)
    assert not (tmp_path / "model.neff").exists()


@pytest.mark.parametrize("fault", ["empty", "garbage"])
def test_bad_output_faults_exit_0(tmp_path: Path, hlo_path: Path, fault: str) -> None:
    result = run(compile_args(hlo_path), tmp_path, {"NKIBUILD_FAKE_CC_FAULT": fault})
    assert result.returncode == 0
    output = (tmp_path / "model.neff").read_bytes()
    assert (len(output) == 0) == (fault == "empty")
    with pytest.raises(NeffFormatError):
        read_neff(output)


def test_hugelog_fault(tmp_path: Path, hlo_path: Path) -> None:
    result = run(compile_args(hlo_path), tmp_path, {"NKIBUILD_FAKE_CC_FAULT": "hugelog"})
    assert result.returncode == 1
    log = tmp_path / "log-neuron-cc.txt"
    assert log.stat().st_size >= 5 * 2**20
    assert log.read_text().splitlines()[-1].startswith("ERROR")


def test_fault_match_selects_one_unit(tmp_path: Path, hlo_path: Path) -> None:
    env = {"NKIBUILD_FAKE_CC_FAULT": "exit1", "NKIBUILD_FAKE_CC_FAULT_MATCH": "unit_b"}
    assert run(compile_args(hlo_path, output="unit_a.neff"), tmp_path, env).returncode == 0
    assert run(compile_args(hlo_path, output="unit_b.neff"), tmp_path, env).returncode == 1
    assert read_neff(tmp_path / "unit_a.neff").placeholder
    assert not (tmp_path / "unit_b.neff").exists()


def test_unknown_fault_is_reported(tmp_path: Path, hlo_path: Path) -> None:
    result = run(compile_args(hlo_path), tmp_path, {"NKIBUILD_FAKE_CC_FAULT": "explode"})
    assert result.returncode == 2
    assert "explode" in result.stderr


def test_counter_counts_compile_invocations(tmp_path: Path, hlo_path: Path) -> None:
    counter = tmp_path / "count.txt"
    env = {"NKIBUILD_FAKE_CC_COUNTER": str(counter)}
    run(["--version"], tmp_path, env)
    run(compile_args(hlo_path, output="one.neff"), tmp_path, env)
    run(compile_args(hlo_path, "trn1", output="two.neff"), tmp_path, env)
    lines = counter.read_text().splitlines()
    assert len(lines) == 2
    assert "one.neff" in lines[0] and "two.neff" in lines[1]


def test_cpu_and_memory_use(tmp_path: Path, hlo_path: Path) -> None:
    env = {"NKIBUILD_FAKE_CC_CPU_SECONDS": "0.4", "NKIBUILD_FAKE_CC_MEMORY_MB": "96"}
    start = time.perf_counter()
    # Popen + wait4: resource usage of this one child, not of all children so far.
    process = subprocess.Popen(
        [*COMMAND, *compile_args(hlo_path)], cwd=tmp_path, env=clean_env(env)
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    assert process.returncode == 0
    assert time.perf_counter() - start >= 0.4
    assert usage.ru_utime + usage.ru_stime >= 0.3
    assert usage.ru_maxrss * 1024 >= 96 * 2**20  # ru_maxrss is in KiB on Linux


def test_fp8_and_bool_are_stored_as_neuronx_cc_stores_them(tmp_path: Path) -> None:
    # neuronx-cc records fp8 tensors as int8 and bool as uint8 in the NEFF.
    hlo = tmp_path / "fp8.pb"
    hlo.write_bytes(
        build_hlo_module(
            "fp8",
            [("q", "float8_e4m3", (8,)), ("r", "float8_e5m2", (8,)), ("m", "bool", (8,))],
            [("float8_e4m3", (8,)), ("bool", (8,)), ("float32", (8,))],
        )
    )
    info = compile_ok(hlo, tmp_path)
    assert [(t.name, t.dtype) for t in info.inputs] == [
        ("q", "int8"),
        ("r", "int8"),
        ("m", "uint8"),
    ]
    assert [t.dtype for t in info.outputs] == ["int8", "uint8", "float32"]
