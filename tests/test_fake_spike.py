"""The toolchain double's spike: documented API, strict checks, recorded calls, no nkibuild."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nkibuild.formats.hlo import build_hlo_module

FAKE_RUNTIME = Path(__file__).resolve().parents[1] / "nkibuild" / "testing" / "fake_runtime"


@pytest.fixture(scope="module")
def neff(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A NEFF from the fake compiler: inputs x f32[4,8], w bf16[8]; outputs f32[4,8], i32[4]."""
    work = tmp_path_factory.mktemp("neff")
    hlo = work / "model.pb"
    hlo.write_bytes(
        build_hlo_module(
            "k",
            [("x", "float32", (4, 8)), ("w", "bfloat16", (8,))],
            [("float32", (4, 8)), ("int32", (4,))],
        )
    )
    command = [sys.executable, "-m", "nkibuild.testing.fake_neuronxcc", "compile", str(hlo)]
    command += ["--framework", "XLA", "--target", "trn2", "--output", str(work / "k.neff")]
    subprocess.run(command, cwd=work, check=True, capture_output=True)
    return work / "k.neff"


def run_spike(script: str, neff: Path, tmp_path: Path) -> str:
    """Run `script` where only the fake spike (not nkibuild) is importable by path."""
    prelude = f"""
        import sys
        sys.path.insert(0, {str(FAKE_RUNTIME)!r})
        import json, ml_dtypes, numpy as np, spike
        from spike import SpikeModel, SpikeTensor, SpikeError
        NEFF = {str(neff)!r}
        """
    code = textwrap.dedent(prelude) + textwrap.dedent(script)
    code += "\nassert 'nkibuild' not in sys.modules, 'the double must not need nkibuild'\n"
    log = tmp_path / "spike.jsonl"
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"NKIBUILD_FAKE_SPIKE_LOG": str(log), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_tensor_info_comes_from_the_neff(neff: Path, tmp_path: Path) -> None:
    out = run_spike(
        """
        m = SpikeModel.load_from_neff(NEFF)
        for infos in (m.input_tensors_info, m.output_tensors_info):
            print(json.dumps({n: [i.size, i.dtype, list(i.shape)] for n, i in infos.items()}))
        print(spike.IS_TOOLCHAIN_DOUBLE, "toolchain double" in repr(m))
        """,
        neff,
        tmp_path,
    )
    inputs, outputs, marks = out.splitlines()
    assert json.loads(inputs) == {"x": [128, "float32", [4, 8]], "w": [16, "bfloat16", [8]]}
    assert json.loads(outputs) == {
        "output0": [128, "float32", [4, 8]],
        "output1": [16, "int32", [4]],
    }
    assert marks == "True True"


def test_a_call_returns_zeros_of_the_neffs_outputs_and_is_recorded(
    neff: Path, tmp_path: Path
) -> None:
    out = run_spike(
        """
        m = SpikeModel.load_from_neff(NEFF, core_id=3)
        x = SpikeTensor.from_numpy(np.ones((4, 8), np.float32), "x")
        w = SpikeTensor.from_numpy(np.ones(8, ml_dtypes.bfloat16), "w")
        outs = m(inputs={"x": x, "w": w}, outputs=None)
        print(json.dumps({n: [t.numpy().dtype.name, t.numpy().shape, float(t.numpy().sum())]
                          for n, t in outs.items()}))
        given = {"output0": SpikeTensor.from_numpy(np.ones((4, 8), np.float32), "output0"),
                 "output1": SpikeTensor.from_numpy(np.ones(4, np.int32), "output1")}
        m(inputs={"x": x, "w": w}, outputs=given)
        print(float(given["output0"].numpy().sum()))
        result = m.benchmark({"x": x, "w": w}, warmup_iter=1, benchmark_iter=3)
        print(result.iterations, result.min_ms <= result.mean_ms <= result.max_ms)
        print(len(spike.CALLS))
        """,
        neff,
        tmp_path,
    )
    outputs, filled, benchmark, calls = out.splitlines()
    assert json.loads(outputs) == {
        "output0": ["float32", [4, 8], 0.0],
        "output1": ["int32", [4], 0.0],
    }
    assert filled == "0.0" and benchmark == "3 True"
    events = [json.loads(line) for line in (tmp_path / "spike.jsonl").read_text().splitlines()]
    assert int(calls) == len(events) == 1 + 2 + 4 + 1  # load, 2 calls, 4 timed, benchmark
    assert events[0] == {"event": "load", "path": str(neff), "core_id": 3}
    assert events[1]["inputs"] == {
        "x": {"dtype": "float32", "shape": [4, 8]},
        "w": {"dtype": "bfloat16", "shape": [8]},
    }


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ('{"x": x}', "input names ['x'] do not match the NEFF's inputs ['w', 'x']"),
        ('{"x": x, "w": w, "z": w}', "input names ['w', 'x', 'z'] do not match"),
        (
            '{"x": SpikeTensor.from_numpy(np.ones((4, 8)), "x"), "w": w}',
            "input 'x' is float64[4, 8]; the NEFF expects float32[4, 8]",
        ),
        (
            '{"x": SpikeTensor.from_numpy(np.ones((8, 4), np.float32), "x"), "w": w}',
            "input 'x' is float32[8, 4]; the NEFF expects float32[4, 8]",
        ),
    ],
)
def test_calls_are_checked_strictly(neff: Path, tmp_path: Path, inputs: str, message: str) -> None:
    out = run_spike(
        f"""
        m = SpikeModel.load_from_neff(NEFF)
        x = SpikeTensor.from_numpy(np.ones((4, 8), np.float32), "x")
        w = SpikeTensor.from_numpy(np.ones(8, ml_dtypes.bfloat16), "w")
        try:
            m(inputs={inputs})
        except SpikeError as error:
            print(error)
        """,
        neff,
        tmp_path,
    )
    assert message in out


def test_a_file_that_is_not_a_neff_is_refused(neff: Path, tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.neff"
    garbage.write_bytes(b"\0" * 2000)
    out = run_spike(
        f"""
        try:
            SpikeModel.load_from_neff({str(garbage)!r})
        except SpikeError as error:
            print(error)
        """,
        neff,
        tmp_path,
    )
    assert out.startswith(f"cannot load {garbage}: not a readable NEFF")
