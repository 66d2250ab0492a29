"""The toolchain double's spike: a CPU core (`spike._spike`) that checks what libnrt
checks, under nkibuild's own Python layer, offering the API that spike-api.json
(../shared/testdata) records of the real spike, and nothing more.

NEFFs come from nkibuild's fake compiler (or its NEFF writer for odd signatures); spike
always runs in a separate interpreter where nkibuild cannot be imported, as in a
virtualenv holding only a bundle.
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
from golden_data import golden_path
from spike_api import api_problems

from nkibuild.toolchain_double.hlo_writer import build_hlo_module
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

FAKE_RUNTIME = (
    Path(__file__).resolve().parents[1] / "nkibuild" / "toolchain_double" / "fake_runtime"
)
BUNDLE_RUNTIME = Path(__file__).resolve().parents[1] / "nkibuild" / "bundle" / "runtime.py"


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
    script: str, tmp_path: Path, setup: str = "", **env: str
) -> tuple[list[Any], list[dict[str, Any]]]:
    """Run `setup` and `script` in a clean interpreter; return what it show()ed and the log."""
    log = tmp_path / "spike.jsonl"
    log.unlink(missing_ok=True)
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


def test_the_runtime_directory_holds_only_the_runtime_doubles() -> None:
    # It goes on PYTHONPATH as a whole: anything else there would be importable too.
    entries = {p.name for p in FAKE_RUNTIME.iterdir() if p.name != "__pycache__"}
    assert entries == {"spike", "nrtpy", "_nkibuild_double_host.py"}


def test_tensor_info_comes_from_the_neff(neffs: dict[str, Path], tmp_path: Path) -> None:
    shown, events = run_spike(
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


def test_benchmark_times_the_fake_call(neffs: dict[str, Path], tmp_path: Path) -> None:
    shown, events = run_spike(
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
    assert mode_error == "benchmark mode must be 'device' or 'host', not 'wall'"
    assert [e["event"] for e in events] == ["load"] + ["call"] * 10
    assert events[1]["inputs"]["w"] == {"dtype": "bfloat16", "shape": [8]}


# (call, exception type, the double's message). spike's layer raises ValueError (names) and
# AssertionError (core, shape, dtype), and reads `.tensor_ref` of what it is given
# (AttributeError); a missing tensor fails in the runtime's execute (NrtError, the core's).
STRICT_CASES = [
    ('m(inputs={"x": x})', "NrtError", "leave out ['w'] of the NEFF's ['w', 'x']"),
    ('m(inputs={"x": x, "w": w, "z": w})', "ValueError", "model 'k' has no input named z"),
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
    ('m(inputs={"x": x, "w": w}, outputs={"output0": x})', "NrtError", "leave out ['output1']"),
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
        assert raised == kind, (call, text)
        assert message in text, (call, text)
        assert runtime_error == (kind == "NrtError")  # NrtError and SpikeError are RuntimeErrors
    # Only the core sees a call the layer let through: it records the ones it refused.
    rejected = [e for e in events if e["event"] == "rejected"]
    assert [e["error"].partition(":")[0] for e in rejected] == ["NrtError", "NrtError"]
    assert rejected[0]["inputs"] == {"x": {"dtype": "float32", "shape": [4, 8]}}
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
    neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, _ = run_spike(
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
    assert "input 'd' is float64[2]; the NEFF expects unknown[2]" in call[1]


def test_bool_tensors_are_passed_as_uint8(neffs: dict[str, Path], tmp_path: Path) -> None:
    shown, _ = run_spike(
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
            show("AssertionError")
        """,
        tmp_path,
    )
    # spike's from_numpy goes through np.ascontiguousarray, which makes 0-d arrays 1-d.
    assert shown == [[1], "AssertionError"]


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
    assert k.startswith("NRT Error (toolchain double): cannot load ")
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
        assert kind == "NrtError" and f"cannot load {name}: not a NEFF: " in message
    assert "header size field is 0" in errors["zeros.neff"][1]
    assert "truncated file?" in errors["truncated.neff"][1]
    assert "shorter than the 1024-byte header" in errors["short.neff"][1]
    assert "not a readable tar archive" in errors["payload.neff"][1]
    # A file that cannot be opened is spike's own error, as in spike.
    assert errors["missing.neff"] == [
        "SpikeError",
        "Spike Error (toolchain double): cannot open NEFF file missing.neff: "
        "No such file or directory",
    ]
    assert events == []


# --- the core on its own: what libnrt and spike's C++ check --------------------------------


def test_the_core_checks_memory_and_lifetimes_as_spike_does(
    neffs: dict[str, Path], tmp_path: Path
) -> None:
    shown, _ = run_spike(
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
        meta = info.inputs["x"]
        show([[meta.size, meta.dtype, meta.shape], list(info.outputs)])
        attempt(spike.TensorMetadata)  # made by the runtime only
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
        (metadata, outputs),
        constructed,
        wrong_size,
        right_size,
        freed,
        after_reset,
        unloaded,
        fresh,
    ) = shown
    assert second[0] == "SpikeError" and "already exists" in second[1]
    assert overflow[0] == "SpikeError" and "a 9-byte write at offset 0 exceeds" in overflow[1]
    assert read == ["ok", "\0\0\0\0abcd"] and sliced == ["ok", "ab"]
    assert small_buffer == ["RuntimeError", "a 4-byte buffer cannot take 8 bytes"]
    assert strided == ["RuntimeError", "expected a C-contiguous buffer, got ndarray"]
    assert partial[0] == "ok" and name == ["ok", "t"]
    assert metadata == [8, "float32", [2]] and outputs == ["output0"]
    assert constructed[0] == "TypeError"
    assert wrong_size[0] == "NrtError" and "'x' is 4 bytes on core 0" in wrong_size[1]
    assert right_size == ["ok", "None"]
    assert freed == [
        "SpikeError",
        "Spike Error (toolchain double): tensor 'x' was freed (or its runtime closed)",
    ]
    assert after_reset[0] == "SpikeError"  # a closed runtime's tensors are unusable
    assert unloaded[0] == "SpikeError" and "no longer loaded" in unloaded[1]
    assert fresh == ["ok", "Spike"]


def test_a_neff_from_a_real_compiler_loads_with_its_io(tmp_path: Path) -> None:
    golden = golden_path("neff/matmul_small.neff")
    shown, events = run_spike(
        f"""
        m = SpikeModel.load_from_neff({str(golden)!r})
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


# --- the API: spike-api.json, no more and no less ------------------------------------------


def test_the_double_offers_exactly_spikes_api() -> None:
    api = golden_path("spike-api.json")
    assert api_problems(api, FAKE_RUNTIME, exact=True) == []


def test_the_api_check_notices_what_differs(tmp_path: Path) -> None:
    # The check above must be able to fail: a changed default, a name spike does not
    # have and one the double lacks are each reported.
    api = json.loads(golden_path("spike-api.json").read_text())
    modules = api["modules"]
    load = modules["spike_model"]["SpikeModel"]["members"]["load_from_neff"]["params"]
    next(p for p in load if p["name"] == "core_id")["default"] = "1"
    del modules["spike_tensor"]["SpikeTensor"]["members"]["write_from_numpy"]
    modules["logger"]["set_level"] = {"kind": "function", "params": []}
    changed = tmp_path / "spike-api.json"
    changed.write_text(json.dumps(api))
    problems = api_problems(changed, FAKE_RUNTIME, exact=True)
    assert len(problems) == 3, problems
    assert problems[0].startswith("spike.logger.set_level: missing")
    assert problems[1].startswith("spike.spike_model.SpikeModel.load_from_neff: parameters")
    assert problems[2] == "spike.spike_tensor.SpikeTensor: not in spike's API: ['write_from_numpy']"


def test_the_bundle_runtime_passes_bool_and_fp8_as_the_neff_stores_them(tmp_path: Path) -> None:
    # spike's layer refuses a bool array for the uint8 tensor a NEFF stores bool in; the
    # bundle runtime's conversion makes every array one the layer accepts.
    pytest.importorskip("ml_dtypes")
    neff = tmp_path / "stored.neff"
    declared = [("m", "bool"), ("q", "float8_e4m3fn"), ("r", "float8_e4m3")]
    write_neff(
        neff,
        compiler_version="2.23.0.0+nkibuild.fake",
        inputs=[NeffTensor(name, dtype, (4,)) for name, dtype in declared],
        outputs=[NeffTensor("output0", "float32", (4,))],
        num_tpb=1,
        placeholder=True,
    )
    shown, _ = run_spike(
        f"""
        import importlib.util, ml_dtypes
        spec = importlib.util.spec_from_file_location("bundle_runtime", {str(BUNDLE_RUNTIME)!r})
        runtime = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(runtime)
        m = SpikeModel.load_from_neff({str(neff)!r})
        arrays = {{"m": np.ones(4, bool), "q": np.ones(4, ml_dtypes.float8_e4m3fn),
                   "r": np.ones(4, ml_dtypes.float8_e4m3)}}
        for convert in (lambda a: a, runtime.as_neff_storage):
            inputs = {{n: SpikeTensor.from_numpy(convert(a), n) for n, a in arrays.items()}}
            try:
                m(inputs=inputs)
                show("ok")
            except AssertionError as error:
                show(str(error))
        show([runtime.as_neff_storage(a).dtype.name for a in arrays.values()])
        """,
        tmp_path,
    )
    as_given, converted, dtypes = shown
    assert "input 'm' is bool[4]; the NEFF expects uint8[4]" in as_given
    assert converted == "ok"
    assert dtypes == ["uint8", "int8", "float8_e4m3"]  # e4m3 already passes spike's check
