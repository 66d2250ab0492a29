"""nkibuild toolchain double: a fake `spike` (the Neuron runtime binding from aws-neuron/nkipy).

It speaks spike's documented API, reads a NEFF's tensor map to learn its inputs and
outputs, checks every call as strictly as a runtime (exact names, dtypes, shapes),
records what it received, and returns zero-filled outputs of the NEFF's shapes and
dtypes. It never computes a kernel and never touches a device: it exists so that
the bundles' marshalling can be tested exactly. Standard library and NumPy only
(ml_dtypes for bfloat16, imported when one appears): it runs where nkibuild is not
installed.

Calls are kept in `CALLS`, and appended as JSON lines to the file named by
NKIBUILD_FAKE_SPIKE_LOG, for tests that run bundles in another process.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__version__ = "0.0.0+nkibuild.fake"
IS_TOOLCHAIN_DOUBLE = True
HEADER_BYTES = 1024
LOG_ENV = "NKIBUILD_FAKE_SPIKE_LOG"
CALLS: list[dict[str, Any]] = []


class SpikeError(RuntimeError):
    """What the double raises where the real runtime would fail."""


@dataclass(frozen=True)
class TensorMetadata:
    size: int  # bytes
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class BenchmarkResult:
    """Timings of the double's own (zero-filling) call: not of any kernel."""

    mean_ms: float
    min_ms: float
    max_ms: float
    std_ms: float
    iterations: int


class SpikeTensor:
    def __init__(self, array: np.ndarray, name: str, core_id: int = 0) -> None:
        self._array = array
        self.name = name
        self.core_id = core_id

    @classmethod
    def from_numpy(cls, array: np.ndarray, name: str, core_id: int = 0) -> SpikeTensor:
        return cls(np.array(array, copy=True), name, core_id)  # "copies to the device"

    @property
    def dtype(self) -> str:
        return self._array.dtype.name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._array.shape)

    def numpy(self) -> np.ndarray:
        return np.array(self._array, copy=True)

    def __repr__(self) -> str:
        return f"SpikeTensor({self.name!r}, {self.dtype}{list(self.shape)}, toolchain double)"


class SpikeModel:
    def __init__(self, path: str, name: str | None, core_id: int, tensors: dict[str, Any]) -> None:
        self.path = path
        self.name = name or os.path.basename(path)
        self.core_id = core_id
        self.input_tensors_info = _infos(tensors, "input")
        self.output_tensors_info = _infos(tensors, "output")

    @classmethod
    def load_from_neff(
        cls,
        path: str,
        name: str | None = None,
        core_id: int = 0,
        cc_enabled: bool = False,
        rank_id: int = 0,
        world_size: int = 1,
    ) -> SpikeModel:
        model = cls(str(path), name, core_id, _read_tensor_map(str(path)))
        _record({"event": "load", "path": str(path), "core_id": core_id})
        return model

    def __call__(
        self, inputs: dict[str, SpikeTensor], outputs: dict[str, SpikeTensor] | None = None
    ) -> dict[str, SpikeTensor]:
        _check_tensors("input", inputs, self.input_tensors_info)
        if outputs is None:
            outputs = {n: _zeros(n, info) for n, info in self.output_tensors_info.items()}
        else:
            _check_tensors("output", outputs, self.output_tensors_info)
            for tensor in outputs.values():
                tensor._array[...] = 0
        _record(
            {
                "event": "call",
                "path": self.path,
                "inputs": {
                    n: {"dtype": t.dtype, "shape": list(t.shape)} for n, t in inputs.items()
                },
                "outputs": sorted(outputs),
            }
        )
        return outputs

    def benchmark(
        self,
        inputs: dict[str, SpikeTensor],
        outputs: dict[str, SpikeTensor] | None = None,
        warmup_iter: int = 5,
        benchmark_iter: int = 5,
    ) -> BenchmarkResult:
        for _ in range(warmup_iter):
            self(inputs, outputs)
        times = []
        for _ in range(benchmark_iter):
            started = time.perf_counter()
            self(inputs, outputs)
            times.append((time.perf_counter() - started) * 1000)
        _record({"event": "benchmark", "path": self.path, "iterations": benchmark_iter})
        values = np.array(times)
        return BenchmarkResult(
            float(values.mean()), float(values.min()), float(values.max()), float(values.std()),
            benchmark_iter,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"SpikeModel({self.path!r}) - nkibuild toolchain double, computes nothing"


def _read_tensor_map(path: str) -> dict[str, Any]:
    """The first subgraph's tensor map: every subgraph has the kernel's full I/O."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        payload = gzip.decompress(data[HEADER_BYTES:])
        with tarfile.open(fileobj=io.BytesIO(payload)) as archive:
            member = archive.extractfile("sg00/tensor_map.json")
            if member is None:
                raise KeyError("sg00/tensor_map.json")
            return json.loads(member.read())
    except (OSError, EOFError, KeyError, ValueError, tarfile.TarError) as error:
        raise SpikeError(f"cannot load {path}: not a readable NEFF ({error})") from None


def _infos(tensors: dict[str, Any], kind: str) -> dict[str, TensorMetadata]:
    found = {}
    for name, entry in tensors.items():
        if entry.get("kind") == kind and not entry.get("is_const"):
            shape = tuple(entry["tf_shape"])
            size = int(np.prod(shape, dtype=np.int64)) * _numpy_dtype(entry["dtype"]).itemsize
            found[name] = TensorMetadata(size, entry["dtype"], shape)
    return found


def _check_tensors(
    kind: str, given: dict[str, SpikeTensor], expected: dict[str, TensorMetadata]
) -> None:
    if set(given) != set(expected):
        raise SpikeError(
            f"{kind} names {sorted(given)} do not match the NEFF's {kind}s {sorted(expected)}"
        )
    for name, tensor in given.items():
        want = expected[name]
        if tensor.dtype != want.dtype or tensor.shape != want.shape:
            raise SpikeError(
                f"{kind} {name!r} is {tensor.dtype}{list(tensor.shape)}; "
                f"the NEFF expects {want.dtype}{list(want.shape)}"
            )


def _zeros(name: str, info: TensorMetadata) -> SpikeTensor:
    return SpikeTensor(np.zeros(info.shape, _numpy_dtype(info.dtype)), name)


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _record(event: dict[str, Any]) -> None:
    CALLS.append(event)
    log = os.environ.get(LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(event) + "\n")
