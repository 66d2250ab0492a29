"""nkibuild's toolchain double for `spike`, the Neuron runtime binding from aws-neuron/nkipy.

This is NOT the Neuron runtime. It never computes a kernel and never touches a device:
every call returns (or fills) outputs of the NEFF's shapes and dtypes with zeros. It
exists so that code handing tensors to spike (nkibuild's generated bundles) can be
tested exactly where libnrt and Trainium are missing.

What it does imitate, from spike's own source, is everything a caller can get wrong:

- `SpikeModel.load_from_neff` reads the NEFF's tensor map (a non-NEFF file fails to
  load); `input_tensors_info` / `output_tensors_info` map names to
  `TensorMetadata(size, dtype, shape)`, in no meaningful order (spike builds them from
  a C++ unordered_map; here they come in reverse tensor-map order), with spike's dtype
  names: a NEFF dtype that spike's runtime has no name for is reported as "unknown".
- A call is checked as spike checks it: unknown names raise ValueError; a wrong shape,
  dtype or core raises AssertionError (raised explicitly here, so also under
  `python -O`, where spike's asserts vanish); missing names raise NrtError (in spike
  the runtime's execute fails). fp8 arrays (ml_dtypes float8_e4m3 / float8_e5m2) are
  accepted for int8 tensors, as spike accepts them. `SpikeTensor.from_numpy` uses
  `np.ascontiguousarray`, which turns a 0-d array into shape (1,), as spike does.
- `model(inputs, outputs=None)` returns the allocated outputs, but returns None when
  the caller passes `outputs` (it fills those), as spike does.

Every load, call, rejected call and benchmark is appended to `CALLS` and, as one JSON
line, to the file named by NKIBUILD_FAKE_SPIKE_LOG, so tests running a bundle in
another process see exactly what the runtime received.

Standard library and NumPy only; ml_dtypes is imported only to allocate a bfloat16
output. It must not import nkibuild: it runs in environments where only a bundle is
installed.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import _neff

__version__ = "0.0.0+nkibuild.fake"
IS_TOOLCHAIN_DOUBLE = True
LOG_ENV = "NKIBUILD_FAKE_SPIKE_LOG"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
CALLS: list[dict[str, Any]] = []

# The only names spike's TensorMetadata.dtype takes (its dtype_to_string); others: "unknown".
RUNTIME_DTYPES = frozenset(
    {"float32", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32"}
    | {"uint32", "int64", "uint64"}
)
UNKNOWN_DTYPE = "unknown"
# Bytes per element of every dtype string a NEFF tensor map may carry, including those
# spike has no name for (nkibuild's fake compiler writes bool, float64 and fp8 names).
_ITEMSIZE = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e4m3": 1,
}  # fmt: skip
# Real NEFFs carry fp8 I/O as int8, and spike lets these ml_dtypes arrays through for it.
_FP8_FOR_INT8 = frozenset({"float8_e4m3", "float8_e5m2"})
_DOUBLE = "nkibuild toolchain double: computes nothing, outputs are zeros"

__all__ = [
    "CALLS",
    "IS_TOOLCHAIN_DOUBLE",
    "BenchmarkResult",
    "NrtError",
    "NrtModel",
    "NrtTensor",
    "SpikeError",
    "SpikeModel",
    "SpikeRuntimeError",
    "SpikeTensor",
    "TensorMetadata",
]


# spike's exception hierarchy: SpikeError (spike's own checks, e.g. an unreadable file)
# and NrtError (the runtime refused: a bad NEFF, a failed execute) share one base.
class SpikeRuntimeError(RuntimeError):
    """Base of the runtime's errors."""


class SpikeError(SpikeRuntimeError):
    """spike's own failures, such as a NEFF file that cannot be opened."""


class NrtError(SpikeRuntimeError):
    """What the Neuron runtime reports: a file it cannot load, an execute it cannot run."""


@dataclass(frozen=True)
class TensorMetadata:
    size: int  # bytes
    dtype: str  # one of RUNTIME_DTYPES or "unknown"
    shape: list[int]

    def __repr__(self) -> str:
        return f"TensorMetadata(size={self.size}, dtype='{self.dtype}', shape={self.shape})"


@dataclass
class NrtTensor:
    """A "device" buffer: here, bytes in host memory."""

    core_id: int
    size: int
    name: str
    memory: bytearray = field(repr=False)


@dataclass(frozen=True)
class NrtModel:
    neff_path: str
    core_id: int
    rank_id: int
    world_size: int
    is_collective: bool
    contents: _neff.NeffContents = field(repr=False)

    def __repr__(self) -> str:
        return f"NrtModel({self.neff_path!r}, core_id={self.core_id}) [{_DOUBLE}]"


@dataclass
class BenchmarkResult:
    """spike's benchmark result, but the times are of the double's own call (which only
    zero-fills the outputs), never of a kernel on a device."""

    mean_ms: float
    min_ms: float
    max_ms: float
    std_dev_ms: float
    iterations: int
    warmup_iterations: int
    durations_ms: list[float] = field(default_factory=list)

    def __repr__(self) -> str:
        return (
            f"BenchmarkResult(mean={self.mean_ms:.4f}ms, min={self.min_ms:.4f}ms, "
            f"max={self.max_ms:.4f}ms, std_dev={self.std_dev_ms:.4f}ms, "
            f"iterations={self.iterations}, warmup_iterations={self.warmup_iterations}) "
            "[toolchain double: timing of a fake call]"
        )


class SpikeTensor:
    """A tensor "on the device": its bytes live in `tensor_ref.memory`."""

    def __init__(
        self, tensor_ref: NrtTensor, shape: Any, dtype: np.dtype, name: str | None = None
    ) -> None:
        self.tensor_ref = tensor_ref
        self.shape: tuple[int, ...] = (shape,) if isinstance(shape, int) else tuple(shape)
        self.dtype = dtype
        self.name = name

    @classmethod
    def from_numpy(cls, array: Any, name: str | None = None, core_id: int = 0) -> SpikeTensor:
        # As spike: ascontiguousarray, which also makes a 0-d array one-dimensional.
        array = np.ascontiguousarray(array)
        memory = bytearray(array.tobytes())
        ref = NrtTensor(core_id, len(memory), name or "unnamed_tensor", memory)
        return cls(ref, array.shape, array.dtype, name)

    def numpy(self) -> np.ndarray:
        array = np.frombuffer(self.tensor_ref.memory, dtype=self.dtype)
        return array.reshape(self.shape).copy()  # a copy: later calls must not change it

    def write_from_numpy(self, array: Any) -> None:
        array = np.ascontiguousarray(array)
        expected = math.prod(self.shape) * np.dtype(self.dtype).itemsize
        if array.nbytes != expected:
            raise ValueError(f"Size mismatch: source {array.nbytes} bytes, target {expected} bytes")
        self.tensor_ref.memory[:] = array.tobytes()

    def __repr__(self) -> str:
        return f"SpikeTensor(shape={self.shape}, dtype={self.dtype}, name={self.name})"


class SpikeModel:
    """A loaded NEFF. Calls check their tensors like spike and return zeros."""

    def __init__(self, model_ref: NrtModel, name: str, neff_path: Path) -> None:
        self.model_ref = model_ref
        self.name = name
        self.neff_path = neff_path
        tensors = model_ref.contents.tensors
        self._neff_dtypes = {t.name: t.dtype for t in tensors}
        self.input_tensors_info = _tensors_info(tensors, "input")
        self.output_tensors_info = _tensors_info(tensors, "output")

    @classmethod
    def load_from_neff(
        cls,
        neff_path: Path | str,
        name: str | None = None,
        core_id: int = 0,
        cc_enabled: bool = False,
        rank_id: int = 0,
        world_size: int = 1,
    ) -> SpikeModel:
        path = Path(neff_path)
        try:
            data = path.read_bytes()
        except OSError as error:
            raise SpikeError(
                f"Spike Error: Failed to open NEFF file: {path} ({error.strerror})"
            ) from None
        try:
            contents = _neff.read(data)
        except _neff.NeffReadError as error:
            raise NrtError(_nrt(f"Failed to load model {path}: not a NEFF: {error}")) from None
        _check_loadable(path, contents)
        model_ref = NrtModel(str(path), core_id, rank_id, world_size, cc_enabled, contents)
        model = cls(model_ref, path.stem if name is None else name, path)
        _record(
            {
                "event": "load",
                "path": str(path),
                "core_id": core_id,
                "placeholder": contents.info.get("nkibuild_placeholder") is True,
            }
        )
        return model

    def allocate_output_tensors(self) -> list[SpikeTensor]:
        tensors = []
        for name, info in self.output_tensors_info.items():
            if info.dtype == UNKNOWN_DTYPE:
                # spike does np.dtype("unknown") here, which raises TypeError.
                raise TypeError(
                    f"cannot allocate output {name!r}: spike has no dtype for the NEFF's "
                    f"{self._neff_dtypes[name]!r} (it reports 'unknown')"
                )
            zeros = np.zeros(info.shape, _numpy_dtype(info.dtype))
            tensors.append(SpikeTensor.from_numpy(zeros, name, core_id=self.model_ref.core_id))
        return tensors

    def __call__(
        self,
        inputs: Mapping[str, SpikeTensor],
        outputs: Mapping[str, SpikeTensor] | None = None,
        save_trace: bool = False,
        ntff_name: str | None = None,
    ) -> dict[str, SpikeTensor] | None:
        allocated = outputs is None
        checked = self._checked_outputs(inputs, outputs)
        _execute(checked)
        _record(
            {
                "event": "call",
                "path": str(self.neff_path),
                "inputs": _specs(inputs),
                "outputs": list(checked),
                "outputs_given": not allocated,
            }
        )
        return checked if allocated else None

    def benchmark(
        self,
        inputs: Mapping[str, SpikeTensor],
        outputs: Mapping[str, SpikeTensor] | None = None,
        warmup_iter: int = 5,
        benchmark_iter: int = 5,
        mode: str = "device",
    ) -> BenchmarkResult:
        """Run the fake call repeatedly and time it: the result says nothing about a kernel."""
        if mode not in ("device", "host"):
            raise ValueError(f"Invalid benchmark mode '{mode}'. Use 'device' or 'host'.")
        if benchmark_iter < 1:
            raise RuntimeError("benchmark_iter must be at least 1: no executions to time")
        checked = self._checked_outputs(inputs, outputs)
        for _ in range(warmup_iter):
            _execute(checked)
        durations = []
        for _ in range(benchmark_iter):
            started = time.perf_counter()
            _execute(checked)
            durations.append((time.perf_counter() - started) * 1000)
        _record(
            {
                "event": "benchmark",
                "path": str(self.neff_path),
                "inputs": _specs(inputs),
                "outputs": list(checked),
                "warmup_iter": warmup_iter,
                "benchmark_iter": benchmark_iter,
                "mode": mode,
            }
        )
        mean = sum(durations) / len(durations)
        return BenchmarkResult(
            mean_ms=mean,
            min_ms=min(durations),
            max_ms=max(durations),
            std_dev_ms=math.sqrt(sum((d - mean) ** 2 for d in durations) / len(durations)),
            iterations=len(durations),
            warmup_iterations=warmup_iter,
            durations_ms=durations,
        )

    def _checked_outputs(
        self, inputs: Mapping[str, SpikeTensor], outputs: Mapping[str, SpikeTensor] | None
    ) -> dict[str, SpikeTensor]:
        """The outputs to fill (allocated if None) once the call passed spike's checks.

        A rejected call is recorded too: a test should see what a wrong caller sent.
        """
        try:
            if outputs is None:
                allocated = self.allocate_output_tensors()
                outputs = dict(zip(self.output_tensors_info, allocated, strict=True))
            self._validate(inputs, outputs)
        except Exception as error:
            _record(
                {
                    "event": "rejected",
                    "path": str(self.neff_path),
                    "inputs": _specs(inputs),
                    "error": f"{type(error).__name__}: {error}",
                }
            )
            raise
        return dict(outputs)

    def _validate(
        self, inputs: Mapping[str, SpikeTensor], outputs: Mapping[str, SpikeTensor]
    ) -> None:
        # spike's order: unknown names (ValueError), then each tensor's core, shape and
        # dtype (assert); names it was not given only fail in the runtime's execute.
        given = {"input": inputs, "output": outputs}
        expected = {"input": self.input_tensors_info, "output": self.output_tensors_info}
        for kind, tensors in given.items():
            if not isinstance(tensors, Mapping):
                raise TypeError(f"{kind}s must be a dict of name -> SpikeTensor, not {tensors!r}")
            unknown = sorted(set(tensors) - set(expected[kind]))
            if unknown:
                raise ValueError(
                    f"unknown {kind}(s) {unknown} for model '{self.name}'; "
                    f"the NEFF's {kind}s are {sorted(expected[kind])}"
                )
        for kind, tensors in given.items():
            for name, tensor in tensors.items():
                self._check_tensor(kind, name, tensor, expected[kind][name])
        for kind, tensors in given.items():
            missing = sorted(set(expected[kind]) - set(tensors))
            if missing:
                raise NrtError(
                    _nrt(
                        f"execute of model '{self.name}' failed: no tensor for {kind}(s) "
                        f"{missing}; the NEFF's {kind}s are {sorted(expected[kind])}"
                    )
                )

    def _check_tensor(self, kind: str, name: str, tensor: Any, want: TensorMetadata) -> None:
        if not isinstance(tensor, SpikeTensor):
            raise TypeError(
                f"{kind} {name!r} is a {type(tensor).__name__}, not a SpikeTensor "
                "(make one with SpikeTensor.from_numpy)"
            )
        if tensor.tensor_ref.core_id != self.model_ref.core_id:
            raise AssertionError(
                f"{kind} {name!r} is on core {tensor.tensor_ref.core_id} but model "
                f"'{self.name}' is loaded on core {self.model_ref.core_id}"
            )
        dtype = np.dtype(tensor.dtype).name
        dtype_ok = dtype == want.dtype or (want.dtype == "int8" and dtype in _FP8_FOR_INT8)
        if not dtype_ok or tensor.shape != tuple(want.shape):
            unnamed = ""
            if want.dtype == UNKNOWN_DTYPE:
                unnamed = f" (spike has no dtype for the NEFF's {self._neff_dtypes[name]!r})"
            raise AssertionError(
                f"{kind} {name!r} is {dtype}{list(tensor.shape)}; the NEFF expects "
                f"{want.dtype}{want.shape}{unnamed}"
            )

    def __repr__(self) -> str:
        return (
            f"SpikeModel(name={self.name!r}, neff={str(self.neff_path)!r}, "
            f"core_id={self.model_ref.core_id}) [{_DOUBLE}]"
        )


def _nrt(message: str) -> str:
    return f"NRT Error (toolchain double): {message}"


def _check_loadable(path: Path, contents: _neff.NeffContents) -> None:
    """Refuse what the runtime would refuse at load time."""
    for tensor in contents.tensors:
        if tensor.dtype not in _ITEMSIZE:
            raise NrtError(
                _nrt(f"Failed to load model {path}: {tensor.name!r} has dtype {tensor.dtype!r}")
            )
    configured, lnc = os.environ.get(LNC_ENV, "").strip(), contents.info.get("num_tpb")
    # A NEFF runs on as many physical cores as it was compiled for (its lnc).
    if configured and isinstance(lnc, int) and configured != str(lnc):
        raise NrtError(
            _nrt(
                f"Failed to load model {path}: it was compiled for lnc={lnc} but "
                f"{LNC_ENV}={configured}"
            )
        )


def _tensors_info(tensors: tuple[_neff.NeffTensor, ...], kind: str) -> dict[str, TensorMetadata]:
    # Reversed on purpose: spike's dicts come from an unordered_map, so a caller that
    # relies on their order is wrong, and should find out here.
    return {
        t.name: TensorMetadata(
            size=math.prod(t.shape) * _ITEMSIZE[t.dtype],
            dtype=t.dtype if t.dtype in RUNTIME_DTYPES else UNKNOWN_DTYPE,
            shape=list(t.shape),
        )
        for t in reversed(tensors)
        if t.kind == kind
    }


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # only here: float32-only users need not install it

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _execute(outputs: Mapping[str, SpikeTensor]) -> None:
    """The whole "kernel": zero every output buffer."""
    for tensor in outputs.values():
        memory = tensor.tensor_ref.memory
        memory[:] = bytes(len(memory))


def _specs(tensors: Any) -> Any:
    if not isinstance(tensors, Mapping):
        return repr(tensors)
    return {
        name: (
            {"dtype": np.dtype(t.dtype).name, "shape": list(t.shape)}
            if isinstance(t, SpikeTensor)
            else {"type": type(t).__name__}
        )
        for name, t in tensors.items()
    }


def _record(event: dict[str, Any]) -> None:
    CALLS.append(event)
    log = os.environ.get(LOG_ENV)
    if log:
        # One O_APPEND write per record: processes sharing the log never interleave lines.
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, (json.dumps(event) + "\n").encode())
        finally:
            os.close(fd)
