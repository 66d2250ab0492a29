"""The toolchain double's spike: documented API, spike's own checks, recorded calls, no nkibuild.

NEFFs come from nkibuild's fake compiler (or its NEFF writer for odd signatures); the
fake spike always runs in a separate interpreter where nkibuild cannot be imported, as
in a virtualenv holding only a bundle.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from nkibuild.testing.hlo_writer import build_hlo_module
from nkibuild.testing.neff_writer import NeffTensor, write_neff

FAKE_RUNTIME = Path(__file__).resolve().parents[1] / "nkibuild" / "testing" / "fake_runtime"

PRELUDE = """
import json, sys

class RefuseNkibuild:
    # The double must run where nkibuild is not installed: make importing it fail.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "nkibuild":
            raise ImportError("the fake spike must not import nkibuild")
        return None

sys.meta_path.insert(0, RefuseNkibuild())
sys.path.insert(0, {runtime!r})
import numpy as np
import spike
from spike import NrtError, SpikeError, SpikeModel, SpikeTensor

def show(value):
    print(json.dumps(value))
"""


@pytest.fixture(scope="module")
def neffs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """k.neff from the fake compiler (x f32[4,8], w bf16[8] -> f32[4,8], i32[4]; lnc 2),
    and NEFFs with signatures that test spike's dtype and shape rules."""
    work = tmp_path_factory.mktemp("neffs")
    hlo = work / "k.pb"
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
    signatures = {
        "fp8": ([("q", "int8", (4,))], [("bfloat16", (2, 2))]),  # real NEFFs carry fp8 as int8
        "scalar": ([("s", "float32", ())], [("float32", ())]),
        "unnamed": ([("d", "float64", (2,)), ("b", "bool", (3,))], [("float64", (2,))]),
        "fast": ([("x", "float32", (2,))], [("float32", (2,))]),
    }
    for name, (inputs, outputs) in signatures.items():
        write_neff(
            work / f"{name}.neff",
            compiler_version="2.23.0.0+nkibuild.fake",
            inputs=[NeffTensor(*spec) for spec in inputs],
            outputs=[NeffTensor(f"output{i}", *spec) for i, spec in enumerate(outputs)],
            num_tpb=1,
            placeholder=True,
            compress=name != "fast",  # --enable-fast-loading-neuron-binaries
        )
    return {path.stem: path for path in work.glob("*.neff")}


def run_spike(
    script: str, tmp_path: Path, setup: str = "", **env: str
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Run `setup` and `script` in a clean interpreter; return what it show()ed and the log."""
    log = tmp_path / "spike.jsonl"
    code = PRELUDE.format(runtime=str(FAKE_RUNTIME)) + setup + textwrap.dedent(script)
    code += "\nassert 'nkibuild' not in sys.modules\n"
    result = subprocess.run(
        [sys.executable, "-I", "-c", code],  # -I: no PYTHONPATH, no cwd on sys.path
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", ""), "NKIBUILD_FAKE_SPIKE_LOG": str(log), **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return shown, events


def test_the_runtime_directory_holds_only_the_spike_package() -> None:
    # It goes on PYTHONPATH as a whole: anything else there would be importable too.
    entries = {p.name for p in FAKE_RUNTIME.iterdir() if p.name != "__pycache__"}
    assert entries == {"spike"}


def test_tensor_info_comes_from_the_neff(neffs: dict[str, Path], tmp_path: Path) -> None:
    shown, events = run_spike(
        f"""
        m = SpikeModel.load_from_neff({str(neffs["k"])!r})
        for infos in (m.input_tensors_info, m.output_tensors_info):
            show({{n: [i.size, i.dtype, i.shape] for n, i in infos.items()}})
        show([m.name, repr(m), str(m), spike.__version__, spike.IS_TOOLCHAIN_DOUBLE])
        show("ml_dtypes" in sys.modules)  # float32 users need not have it
        """,
        tmp_path,
    )
    inputs, outputs, (name, text, string, version, double), ml_dtypes_imported = shown
    assert inputs == {"x": [128, "float32", [4, 8]], "w": [16, "bfloat16", [8]]}
    assert outputs == {"output0": [128, "float32", [4, 8]], "output1": [16, "int32", [4]]}
    assert name == "k" and version == "0.0.0+nkibuild.fake" and double is True
    assert "toolchain double" in text and "toolchain double" in string
    assert ml_dtypes_imported is False
    assert events == [{"event": "load", "path": str(neffs["k"]), "core_id": 0, "placeholder": True}]


CALL = """
import ml_dtypes
m = SpikeModel.load_from_neff({neff!r}, core_id={core})
x = SpikeTensor.from_numpy(np.ones((4, 8), np.float32), "x", core_id={core})
w = SpikeTensor.from_numpy(np.ones(8, ml_dtypes.bfloat16), "w", core_id={core})
"""


def test_a_call_returns_zeros_of_the_neffs_outputs_and_is_recorded(
    neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, events = run_spike(
        """
        outs = m(inputs={"x": x, "w": w})
        show({n: [t.numpy().dtype.name, t.numpy().shape, bool((t.numpy() == 0).all())]
              for n, t in outs.items()})
        given = {"output1": SpikeTensor.from_numpy(np.ones(4, np.int32), "output1", core_id=3),
                 "output0": SpikeTensor.from_numpy(np.ones((4, 8), np.float32), "o", core_id=3)}
        show([m(inputs={"w": w, "x": x}, outputs=given), float(given["output0"].numpy().sum())])
        show(spike.CALLS)
        """,
        tmp_path,
        setup=CALL.format(neff=str(neffs["k"]), core=3),
    )
    returned, (given_result, given_sum), calls = shown
    assert returned == {
        "output0": ["float32", [4, 8], True],
        "output1": ["int32", [4], True],
    }
    # As spike: outputs the caller passes are filled, and the call returns None.
    assert given_result is None and given_sum == 0.0
    assert calls == events
    assert events == [
        {"event": "load", "path": str(neffs["k"]), "core_id": 3, "placeholder": True},
        {
            "event": "call",
            "path": str(neffs["k"]),
            "inputs": {
                "x": {"dtype": "float32", "shape": [4, 8]},
                "w": {"dtype": "bfloat16", "shape": [8]},
            },
            "outputs": ["output1", "output0"],
            "outputs_given": False,
        },
        {
            "event": "call",
            "path": str(neffs["k"]),
            "inputs": {  # in the caller's order, which is what a test wants to see
                "w": {"dtype": "bfloat16", "shape": [8]},
                "x": {"dtype": "float32", "shape": [4, 8]},
            },
            "outputs": ["output1", "output0"],
            "outputs_given": True,
        },
    ]


def test_benchmark_times_the_fake_call(neffs: dict[str, Path], tmp_path: Path) -> None:
    shown, events = run_spike(
        """
        r = m.benchmark({"x": x, "w": w}, warmup_iter=2, benchmark_iter=3)
        show([r.iterations, r.warmup_iterations, len(r.durations_ms), r.std_dev_ms >= 0,
              r.min_ms <= r.mean_ms <= r.max_ms, repr(r)])
        try:
            m.benchmark({"x": x, "w": w}, mode="wall")
        except ValueError as error:
            show(str(error))
        """,
        tmp_path,
        setup=CALL.format(neff=str(neffs["k"]), core=0),
    )
    (iterations, warmup, durations, std_ok, ordered, text), mode_error = shown
    assert (iterations, warmup, durations, std_ok, ordered) == (3, 2, 3, True, True)
    assert "toolchain double" in text
    assert mode_error == "Invalid benchmark mode 'wall'. Use 'device' or 'host'."
    # One record for the whole benchmark, not one per timed execution.
    assert [e["event"] for e in events] == ["load", "benchmark"]
    assert events[1]["warmup_iter"] == 2 and events[1]["benchmark_iter"] == 3
    assert events[1]["inputs"]["w"] == {"dtype": "bfloat16", "shape": [8]}


# (call, exception type, message). spike's own checks raise ValueError (names) and
# AssertionError (core, shape, dtype); a missing tensor fails in the runtime (NrtError).
STRICT_CASES = [
    ('m(inputs={"x": x})', "NrtError", "no tensor for input(s) ['w']; the NEFF's inputs are"),
    ('m(inputs={"x": x, "w": w, "z": w})', "ValueError", "unknown input(s) ['z'] for model 'k'"),
    (
        'm(inputs={"x": SpikeTensor.from_numpy(np.ones((4, 8)), "x"), "w": w})',
        "AssertionError",
        "input 'x' is float64[4, 8]; the NEFF expects float32[4, 8]",
    ),
    (
        'm(inputs={"x": SpikeTensor.from_numpy(np.ones((8, 4), np.float32), "x"), "w": w})',
        "AssertionError",
        "input 'x' is float32[8, 4]; the NEFF expects float32[4, 8]",
    ),
    (
        'm(inputs={"x": SpikeTensor.from_numpy(np.ones((4, 8), np.float32), "x", 1), "w": w})',
        "AssertionError",
        "input 'x' is on core 1 but model 'k' is loaded on core 0",
    ),
    (
        'm(inputs={"x": np.ones((4, 8), np.float32), "w": w})',
        "TypeError",
        "input 'x' is a ndarray, not a SpikeTensor",
    ),
    (
        'm(inputs={"x": x, "w": w}, outputs={"output0": x, '
        '"output1": SpikeTensor.from_numpy(np.ones(5, np.int32), "output1")})',
        "AssertionError",
        "output 'output1' is int32[5]; the NEFF expects int32[4]",
    ),
    (
        'm(inputs={"x": x, "w": w}, outputs={"output0": x})',
        "NrtError",
        "no tensor for output(s) ['output1']",
    ),
]


def test_calls_are_checked_as_strictly_as_spike_checks_them(
    neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, events = run_spike(
        f"""
        for call in {[case[0] for case in STRICT_CASES]!r}:
            try:
                eval(call)
            except Exception as error:
                show([type(error).__name__, str(error), isinstance(error, RuntimeError)])
            else:
                show(None)
        """,
        tmp_path,
        setup=CALL.format(neff=str(neffs["k"]), core=0),
    )
    assert len(shown) == len(STRICT_CASES)
    for (call, kind, message), (raised, text, runtime_error) in zip(
        STRICT_CASES, shown, strict=True
    ):
        assert (raised, message in text) == (kind, True), (call, text)
        assert runtime_error == (kind == "NrtError")  # NrtError and SpikeError are RuntimeErrors
    rejected = [e for e in events if e["event"] == "rejected"]
    assert [e["error"].partition(":")[0] for e in rejected] == [kind for _, kind, _ in STRICT_CASES]
    # A test can see what a wrong caller sent.
    assert rejected[2]["inputs"]["x"] == {"dtype": "float64", "shape": [4, 8]}
    assert rejected[5]["inputs"]["x"] == {"type": "ndarray"}
    assert not [e for e in events if e["event"] == "call"]


def test_fp8_and_bfloat16_follow_spikes_dtype_rules(neffs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("ml_dtypes")
    shown, _ = run_spike(
        f"""
        import ml_dtypes
        m = SpikeModel.load_from_neff({str(neffs["fp8"])!r})
        show(m.input_tensors_info["q"].dtype)
        for dtype in ("int8", "float8_e4m3", "float8_e5m2", "float8_e4m3fn"):
            q = SpikeTensor.from_numpy(np.zeros(4, getattr(ml_dtypes, dtype, dtype)), "q")
            try:
                out = m(inputs={{"q": q}})["output0"].numpy()
                show([dtype, out.dtype.name, out.shape, float(out.astype(np.float32).sum())])
            except AssertionError as error:
                show([dtype, str(error)])
        """,
        tmp_path,
    )
    assert shown == [
        "int8",
        # spike lets these fp8 arrays through for the int8 tensors that carry fp8 in a NEFF
        ["int8", "bfloat16", [2, 2], 0.0],
        ["float8_e4m3", "bfloat16", [2, 2], 0.0],
        ["float8_e5m2", "bfloat16", [2, 2], 0.0],
        ["float8_e4m3fn", "input 'q' is float8_e4m3fn[4]; the NEFF expects int8[4]"],
    ]


def test_dtypes_spike_has_no_name_for_are_reported_unknown(
    neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, _ = run_spike(
        f"""
        m = SpikeModel.load_from_neff({str(neffs["unnamed"])!r})
        show({{n: [i.size, i.dtype] for n, i in m.input_tensors_info.items()}})
        d = SpikeTensor.from_numpy(np.zeros(2), "d")
        b = SpikeTensor.from_numpy(np.zeros(3, bool), "b")
        for outputs in (None, {{"output0": SpikeTensor.from_numpy(np.zeros(2), "output0")}}):
            try:
                m(inputs={{"d": d, "b": b}}, outputs=outputs)
            except (TypeError, AssertionError) as error:
                show([type(error).__name__, str(error)])
        """,
        tmp_path,
    )
    infos, allocation, call = shown
    assert infos == {"d": [16, "unknown"], "b": [3, "unknown"]}
    assert allocation == [
        "TypeError",
        "cannot allocate output 'output0': spike has no dtype for the NEFF's 'float64' "
        "(it reports 'unknown')",
    ]
    assert call == [
        "AssertionError",
        "input 'd' is float64[2]; the NEFF expects unknown[2] "
        "(spike has no dtype for the NEFF's 'float64')",
    ]


def test_zero_dimensional_tensors_cannot_pass_through_spike(
    neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, _ = run_spike(
        f"""
        m = SpikeModel.load_from_neff({str(neffs["scalar"])!r})
        s = SpikeTensor.from_numpy(np.float32(2), "s")
        show(list(s.shape))
        try:
            m(inputs={{"s": s}})
        except AssertionError as error:
            show(str(error))
        """,
        tmp_path,
    )
    # spike's from_numpy goes through np.ascontiguousarray, which makes 0-d arrays 1-d.
    assert shown == [[1], "input 's' is float32[1]; the NEFF expects float32[]"]


def test_fast_loading_neffs_load_and_the_lnc_setting_must_match(
    neffs: dict[str, Path], tmp_path: Path
) -> None:
    script = f"""
        for neff in ({str(neffs["fast"])!r}, {str(neffs["k"])!r}):  # lnc 1, lnc 2
            try:
                show(SpikeModel.load_from_neff(neff).output_tensors_info["output0"].shape)
            except NrtError as error:
                show(str(error))
        """
    fast, k = run_spike(script, tmp_path, NEURON_LOGICAL_NC_CONFIG="1")[0]
    assert fast == [2]  # the uncompressed payload was read
    assert k.startswith("NRT Error (toolchain double): Failed to load model ")
    assert k.endswith("k.neff: it was compiled for lnc=2 but NEURON_LOGICAL_NC_CONFIG=1")
    assert run_spike(script, tmp_path, NEURON_LOGICAL_NC_CONFIG="2")[0][1] == [4, 8]


def test_files_that_are_not_neffs_are_refused(neffs: dict[str, Path], tmp_path: Path) -> None:
    data = neffs["k"].read_bytes()
    bad = {
        "zeros.neff": bytes(2000),
        "truncated.neff": data[:-100],
        "short.neff": data[:500],
        # A valid header whose payload is not an archive.
        "payload.neff": data[:16] + struct.pack("<Q", 64) + data[24:1024] + bytes(64),
    }
    for name, content in bad.items():
        (tmp_path / name).write_bytes(content)
    shown, events = run_spike(
        f"""
        for name in {[*bad, "missing.neff"]!r}:
            try:
                SpikeModel.load_from_neff(name)
            except (NrtError, SpikeError) as error:
                show([type(error).__name__, str(error)])
        """,
        tmp_path,
    )
    errors = dict(zip([*bad, "missing.neff"], shown, strict=True))
    for name in bad:
        kind, message = errors[name]
        assert kind == "NrtError" and f"Failed to load model {name}: not a NEFF: " in message
    assert "header size field is 0" in errors["zeros.neff"][1]
    assert "truncated file?" in errors["truncated.neff"][1]
    assert "shorter than the 1024-byte header" in errors["short.neff"][1]
    assert "not a readable tar archive" in errors["payload.neff"][1]
    # A file that cannot be opened is spike's own error, as in spike.
    assert errors["missing.neff"][0] == "SpikeError"
    assert "Failed to open NEFF file: missing.neff" in errors["missing.neff"][1]
    assert events == []
