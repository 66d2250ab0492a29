"""The toolchain double's spike: a CPU core (`spike._spike`) that checks what libnrt checks,
under two Python layers: the double's own, and spike's real Python files (from
../shared/thirdparty/spike-py, copied next to the core at test time).

Each behaviour test runs on both layers ("double" and "real"), so the double's layer is
held to what spike's real layer does. NEFFs come from nkibuild's fake compiler (or its
NEFF writer for odd signatures); spike always runs in a separate interpreter where
nkibuild cannot be imported, as in a virtualenv holding only a bundle.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from nkibuild.toolchain_double.hlo_writer import build_hlo_module
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

FAKE_RUNTIME = (
    Path(__file__).resolve().parents[1] / "nkibuild" / "toolchain_double" / "fake_runtime"
)
# spike's real Python layer (without its libnrt core), next to the checkout.
REAL_SPIKE = Path(__file__).resolve().parents[2] / "shared" / "thirdparty" / "spike-py"
# The double's core: what replaces spike's native extension.
CORE_FILES = ("_spike.py", "_neff.py")
LAYERS = ("double", "real")


def real_spike_runtime(dest: Path) -> Path:
    """A directory whose `spike/` holds spike's real Python files and the double's core.

    Skips the test when ../shared/thirdparty/spike-py is absent. Nothing of spike's is
    copied into the repository: this runs at test time only.
    """
    if not (REAL_SPIKE / "spike_model.py").is_file():
        pytest.skip(f"spike's real Python layer is not at {REAL_SPIKE} (../shared/thirdparty)")
    package = dest / "spike"
    package.mkdir(parents=True)
    for source in REAL_SPIKE.iterdir():
        if source.suffix in (".py", ".pyi", ".typed"):
            shutil.copy2(source, package / source.name)
    for name in CORE_FILES:
        shutil.copy2(FAKE_RUNTIME / "spike" / name, package / name)
    return dest


@pytest.fixture(scope="module", params=LAYERS)
def runtime(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory to put on sys.path: the double itself, or the real layer on its core."""
    if request.param == "double":
        return FAKE_RUNTIME
    return real_spike_runtime(tmp_path_factory.mktemp("real-spike"))


def layer(runtime: Path) -> str:
    return "double" if runtime == FAKE_RUNTIME else "real"


PRELUDE = """
import json, sys

class RefuseNkibuild:
    # spike must run where nkibuild is not installed: make importing it fail.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "nkibuild":
            raise ImportError("spike must not import nkibuild")
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
    command = [
        sys.executable,
        "-m",
        "nkibuild.toolchain_double.fake_neuronxcc",
        "compile",
        str(hlo),
    ]
    command += ["--framework", "XLA", "--target", "trn2", "--output", str(work / "k.neff")]
    subprocess.run(command, cwd=work, check=True, capture_output=True)
    signatures = {
        "fp8": ([("q", "float8_e4m3", (4,))], [("bfloat16", (2, 2))]),  # stored as int8
        "scalar": ([("s", "float32", ())], [("float32", ())]),
        "unnamed": ([("d", "float64", (2,)), ("b", "bool", (3,))], [("float64", (2,))]),
        "flags": ([("b", "bool", (3,))], [("bool", (3,))]),  # stored as uint8
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
    runtime: Path, script: str, tmp_path: Path, setup: str = "", **env: str
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Run `setup` and `script` in a clean interpreter; return what it show()ed and the log."""
    log = tmp_path / "spike.jsonl"
    log.unlink(missing_ok=True)
    code = PRELUDE.format(runtime=str(runtime)) + setup + textwrap.dedent(script)
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


def test_tensor_info_comes_from_the_neff(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, events = run_spike(
        runtime,
        f"""
        m = SpikeModel.load_from_neff({str(neffs["k"])!r})
        for infos in (m.input_tensors_info, m.output_tensors_info):
            show({{n: [i.size, i.dtype, i.shape] for n, i in infos.items()}})
        show([m.name, repr(m.model_ref), spike._spike.IS_TOOLCHAIN_DOUBLE])
        show([list(m.input_tensors_info), list(m.output_tensors_info)])
        """,
        tmp_path,
    )
    inputs, outputs, (name, core_repr, double), order = shown
    assert inputs == {"x": [128, "float32", [4, 8]], "w": [16, "bfloat16", [8]]}
    assert outputs == {"output0": [128, "float32", [4, 8]], "output1": [16, "int32", [4]]}
    assert name == "k" and double is True and "toolchain double" in core_repr
    # The runtime's maps are unordered: the double gives reverse NEFF order on purpose.
    assert order == [["w", "x"], ["output1", "output0"]]
    assert events == [{"event": "load", "path": str(neffs["k"]), "core_id": 0, "placeholder": True}]


CALL = """
import ml_dtypes
m = SpikeModel.load_from_neff({neff!r}, core_id={core})
x = SpikeTensor.from_numpy(np.ones((4, 8), np.float32), "x", core_id={core})
w = SpikeTensor.from_numpy(np.ones(8, ml_dtypes.bfloat16), "w", core_id={core})
"""


def test_a_call_returns_zeros_of_the_neffs_outputs_and_is_recorded(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, events = run_spike(
        runtime,
        """
        outs = m(inputs={"x": x, "w": w})
        show({n: [t.numpy().dtype.name, t.numpy().shape, bool((t.numpy() == 0).all())]
              for n, t in outs.items()})
        given = {"output1": SpikeTensor.from_numpy(np.ones(4, np.int32), "output1", core_id=3),
                 "output0": SpikeTensor.from_numpy(np.ones((4, 8), np.float32), "o", core_id=3)}
        show([m(inputs={"w": w, "x": x}, outputs=given), float(given["output0"].numpy().sum())])
        show(spike._spike.CALLS)
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
    x, w = {"dtype": "float32", "shape": [4, 8]}, {"dtype": "bfloat16", "shape": [8]}
    assert events == [
        {"event": "load", "path": str(neffs["k"]), "core_id": 3, "placeholder": True},
        {
            "event": "call",
            "path": str(neffs["k"]),
            "inputs": {"x": x, "w": w},  # in the caller's order, with what was written
            "outputs": ["output1", "output0"],
            "save_trace": False,
        },
        {
            "event": "call",
            "path": str(neffs["k"]),
            "inputs": {"w": w, "x": x},
            "outputs": ["output1", "output0"],
            "save_trace": False,
        },
    ]


def test_benchmark_times_the_fake_call(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, events = run_spike(
        runtime,
        """
        for mode in ("device", "host"):
            r = m.benchmark({"x": x, "w": w}, warmup_iter=2, benchmark_iter=3, mode=mode)
            show([r.iterations, r.warmup_iterations, len(r.durations_ms), r.std_dev_ms >= 0,
                  r.min_ms <= r.mean_ms <= r.max_ms])
        try:
            m.benchmark({"x": x, "w": w}, mode="wall")
        except ValueError as error:
            show(str(error))
        """,
        tmp_path,
        setup=CALL.format(neff=str(neffs["k"]), core=0),
    )
    device, host, mode_error = shown
    # device mode reads the core's nc_exec_running trace events, host mode the wall clock
    assert device == host == [3, 2, 3, True, True]
    assert mode_error == "Invalid benchmark mode 'wall'. Use 'device' or 'host'."
    assert [e["event"] for e in events] == ["load"] + ["call"] * 10
    assert events[1]["inputs"]["w"] == {"dtype": "bfloat16", "shape": [8]}


# (call, exception type, the double's message). spike's layer raises ValueError (names) and
# AssertionError (core, shape, dtype), and reads `.tensor_ref` of what it is given
# (AttributeError); a missing tensor fails in the runtime's execute (NrtError, the core's).
STRICT_CASES = [
    ('m(inputs={"x": x})', "NrtError", "is missing ['w']; the NEFF's inputs are ['w', 'x']"),
    ('m(inputs={"x": x, "w": w, "z": w})', "ValueError", "Unknown input(s) ['z'] for model 'k'"),
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
        "AttributeError",
        "input 'x' is a ndarray, not a SpikeTensor",
    ),
    (
        'm(inputs={"x": x, "w": w}, outputs={"output0": x, '
        '"output1": SpikeTensor.from_numpy(np.ones(5, np.int32), "output1")})',
        "AssertionError",
        "output 'output1' is int32[5]; the NEFF expects int32[4]",
    ),
    ('m(inputs={"x": x, "w": w}, outputs={"output0": x})', "NrtError", "is missing ['output1']"),
]


def test_calls_are_checked_as_strictly_as_spike_checks_them(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, events = run_spike(
        runtime,
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
        assert raised == kind, (call, text)
        # The layers word their own checks differently; the core's errors are the same.
        if layer(runtime) == "double" or kind == "NrtError":
            assert message in text, (call, text)
        assert runtime_error == (kind == "NrtError")  # NrtError and SpikeError are RuntimeErrors
    # Only the core sees a call the layer let through: it records the ones it refused.
    rejected = [e for e in events if e["event"] == "rejected"]
    assert [e["error"].partition(":")[0] for e in rejected] == ["NrtError", "NrtError"]
    assert rejected[0]["inputs"] == {"x": {"dtype": "float32", "shape": [4, 8]}}
    assert not [e for e in events if e["event"] == "call"]


def test_fp8_and_bfloat16_follow_spikes_dtype_rules(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    pytest.importorskip("ml_dtypes")
    shown, _ = run_spike(
        runtime,
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
                show([dtype, "AssertionError"])
        """,
        tmp_path,
    )
    assert shown == [
        "int8",  # the NEFF stores fp8 as int8, as neuronx-cc does
        # spike lets these fp8 arrays through for the int8 tensors that carry fp8
        ["int8", "bfloat16", [2, 2], 0.0],
        ["float8_e4m3", "bfloat16", [2, 2], 0.0],
        ["float8_e5m2", "bfloat16", [2, 2], 0.0],
        ["float8_e4m3fn", "AssertionError"],
    ]


def test_dtypes_the_runtime_has_no_name_for_are_reported_unknown(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, _ = run_spike(
        runtime,
        f"""
        m = SpikeModel.load_from_neff({str(neffs["unnamed"])!r})
        show({{n: [i.size, i.dtype] for n, i in m.input_tensors_info.items()}})
        d = SpikeTensor.from_numpy(np.zeros(2), "d")
        b = SpikeTensor.from_numpy(np.zeros(3, np.uint8), "b")
        out = {{"output0": SpikeTensor.from_numpy(np.zeros(2), "output0")}}
        for outputs in (out, None):
            try:
                m(inputs={{"d": d, "b": b}}, outputs=outputs)
            except (AssertionError, TypeError) as error:
                show([type(error).__name__, str(error)])
        """,
        tmp_path,
    )
    infos, call, allocation = shown
    # float64 has no runtime name; bool is stored as uint8 (as neuronx-cc stores it).
    assert infos == {"d": [16, "unknown"], "b": [3, "uint8"]}
    assert call[0] == "AssertionError"  # no array can match an "unknown" tensor
    assert allocation[0] == "TypeError" and "unknown" in allocation[1]  # np.dtype("unknown")
    if layer(runtime) == "double":
        assert "input 'd' is float64[2]; the NEFF expects unknown[2]" in call[1]


def test_bool_tensors_are_passed_as_uint8(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, _ = run_spike(
        runtime,
        f"""
        m = SpikeModel.load_from_neff({str(neffs["flags"])!r})
        for dtype in (bool, np.uint8):
            try:
                out = m(inputs={{"b": SpikeTensor.from_numpy(np.ones(3, dtype), "b")}})
                show(out["output0"].numpy().dtype.name)
            except AssertionError:
                show("AssertionError")
        """,
        tmp_path,
    )
    assert shown == ["AssertionError", "uint8"]


def test_zero_dimensional_tensors_cannot_pass_through_spike(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, _ = run_spike(
        runtime,
        f"""
        m = SpikeModel.load_from_neff({str(neffs["scalar"])!r})
        s = SpikeTensor.from_numpy(np.float32(2), "s")
        show(list(s.shape))
        try:
            m(inputs={{"s": s}})
        except AssertionError as error:
            show("AssertionError")
        """,
        tmp_path,
    )
    # spike's from_numpy goes through np.ascontiguousarray, which makes 0-d arrays 1-d.
    assert shown == [[1], "AssertionError"]


def test_fast_loading_neffs_load_and_the_lnc_setting_must_match(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
    script = f"""
        for neff in ({str(neffs["fast"])!r}, {str(neffs["k"])!r}):  # lnc 1, lnc 2
            try:
                show(SpikeModel.load_from_neff(neff).output_tensors_info["output0"].shape)
            except NrtError as error:
                show(str(error))
        """
    fast, k = run_spike(runtime, script, tmp_path, NEURON_LOGICAL_NC_CONFIG="1")[0]
    assert fast == [2]  # the uncompressed payload was read
    assert k.startswith("NRT Error (toolchain double): Failed to load model ")
    assert k.endswith("k.neff: it was compiled for lnc=2 but NEURON_LOGICAL_NC_CONFIG=1")
    assert run_spike(runtime, script, tmp_path, NEURON_LOGICAL_NC_CONFIG="2")[0][1] == [4, 8]


def test_files_that_are_not_neffs_are_refused(
    runtime: Path, neffs: dict[str, Path], tmp_path: Path
) -> None:
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
        runtime,
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
    assert "Spike Error: Failed to open NEFF file: missing.neff" in errors["missing.neff"][1]
    assert events == []


# --- the core on its own: what libnrt and spike's C++ check --------------------------------


def test_the_core_checks_memory_and_lifetimes_as_spike_does(
    neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, _ = run_spike(
        FAKE_RUNTIME,
        f"""
        from spike._spike import Spike
        core = spike.get_spike_singleton()

        def attempt(call):
            try:
                result = call()
                show(["ok", result if isinstance(result, (int, str)) else repr(result)])
            except Exception as error:
                show([type(error).__name__, str(error)])

        attempt(Spike)  # a second runtime while one is alive
        t = core.allocate_tensor(8, name="t")
        attempt(lambda: core.tensor_write(t, b"123456789"))
        core.tensor_write(t, b"abcd", 4)
        attempt(lambda: core.tensor_read(t).decode("latin-1"))
        part = core.slice_from_tensor(t, offset=4)
        attempt(lambda: core.tensor_read(part, size=2).decode())
        attempt(lambda: core.tensor_read_to_pybuffer(t, bytearray(4)))
        attempt(lambda: core.tensor_write_from_pybuffer(t, np.ones((4, 4))[:, 0]))
        attempt(lambda: core.tensor_write_from_pybuffer(t, b"xy", 6))
        attempt(lambda: t.name)
        m = core.load_model({str(neffs["fast"])!r})
        info = core.get_tensor_info(m)
        show([repr(info), repr(info.inputs["x"])])
        x = core.allocate_tensor(4, name="x")
        attempt(lambda: core.execute(m, {{"x": x}}, {{"output0": core.allocate_tensor(8)}}))
        attempt(lambda: core.execute(m, {{"x": t}}, {{"output0": core.allocate_tensor(8)}}))
        core.free_tensor(x)
        attempt(lambda: core.tensor_read(x))
        spike.reset()
        attempt(lambda: core.tensor_read(t))
        attempt(lambda: core.execute(m, {{}}, {{}}))
        attempt(lambda: type(spike.get_spike_singleton()).__name__)
        """,
        tmp_path,
    )
    (
        second,
        overflow,
        read,
        sliced,
        small_buffer,
        strided,
        partial,
        name,
        (info, metadata),
        wrong_size,
        right_size,
        freed,
        after_reset,
        unloaded,
        fresh,
    ) = shown
    assert second[0] == "SpikeError" and "a previous instance still exists" in second[1]
    assert overflow[0] == "SpikeError" and "exceeds the tensor bound" in overflow[1]
    assert read == ["ok", "\0\0\0\0abcd"] and sliced == ["ok", "ab"]
    assert small_buffer == ["RuntimeError", "Buffer too small for tensor data"]
    assert strided == ["RuntimeError", "Object does not support buffer protocol"]
    assert partial[0] == "ok" and name == ["ok", "t"]
    assert info == "ModelTensorInfo(inputs=1 tensors, outputs=1 tensors)"
    assert metadata == "TensorMetadata(size=8, dtype='float32', shape=[2])"
    assert wrong_size[0] == "NrtError" and "'x' is 4 bytes on core 0" in wrong_size[1]
    assert right_size == ["ok", "None"]
    assert freed[0] == "SpikeError" and "freed tensor" in freed[1]
    assert after_reset[0] == "SpikeError"  # a closed runtime's tensors are unusable
    assert unloaded[0] == "SpikeError" and "unloaded model" in unloaded[1]
    assert fresh == ["ok", "Spike"]


def test_a_neff_from_a_real_compiler_loads_with_its_io(runtime: Path, tmp_path: Path) -> None:
    golden = Path(__file__).resolve().parents[2] / "shared" / "testdata" / "neff"
    if not (golden / "matmul_small.neff").is_file():
        pytest.skip(f"no real NEFF sample at {golden} (../shared/testdata/neff)")
    shown, events = run_spike(
        runtime,
        f"""
        m = SpikeModel.load_from_neff({str(golden / "matmul_small.neff")!r})
        for infos in (m.input_tensors_info, m.output_tensors_info):
            show({{n: [i.size, i.dtype, i.shape] for n, i in infos.items()}})
        """,
        tmp_path,
    )
    # Its const tensors (weights baked in by the compiler) are not the caller's I/O.
    assert shown == [
        {"y": [65536, "float16", [256, 128]], "x": [65536, "float16", [128, 256]]},
        {"output0": [32768, "float16", [128, 128]]},
    ]
    assert [e["placeholder"] for e in events] == [False]
