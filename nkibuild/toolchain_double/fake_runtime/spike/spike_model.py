"""`SpikeModel`: a NEFF loaded into the runtime, called with named tensors, and the
`BenchmarkResult` of timing it."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ._spike import NrtModel, SystemTraceSession, TensorMetadata
from .logger import get_logger
from .spike_singleton import get_spike_singleton
from .spike_tensor import SpikeTensor

logger = get_logger()

_FP8_FOR_INT8 = frozenset({"float8_e4m3", "float8_e5m2"})


@dataclass
class BenchmarkResult:
    """Milliseconds per execution of a benchmark, and their summary."""

    mean_ms: float
    min_ms: float
    max_ms: float
    std_dev_ms: float
    iterations: int
    warmup_iterations: int
    durations_ms: list[float] = field(default_factory=list)


class SpikeModel:
    """A loaded NEFF; `input_tensors_info` / `output_tensors_info` map names to metadata."""

    def __init__(self, model_ref: NrtModel, name: str, neff_path: Path) -> None:
        self.model_ref = model_ref
        self.name = name
        self.neff_path = neff_path
        info = get_spike_singleton().get_tensor_info(model_ref)
        self.input_tensors_info: dict[str, TensorMetadata] = info.inputs
        self.output_tensors_info: dict[str, TensorMetadata] = info.outputs

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
        """Load `neff_path` on `core_id`; the model's name defaults to the file's stem."""
        path = Path(neff_path)
        logger.info("toolchain double: loading %s", path)
        ref = get_spike_singleton().load_model(str(path), core_id, cc_enabled, rank_id, world_size)
        return cls(ref, path.stem if name is None else name, path)

    def allocate_output_tensors(self) -> list[SpikeTensor]:
        tensors = []
        for name, info in self.output_tensors_info.items():
            # spike makes np.dtype(info.dtype): the runtime's "unknown" is a TypeError.
            if info.dtype == "unknown":
                raise TypeError(
                    f"output {name!r} of {self.neff_path} has a dtype the runtime cannot "
                    "name ('unknown'): no array can be allocated for it"
                )
            array = np.zeros(info.shape, dtype=_numpy_dtype(info.dtype))
            tensors.append(SpikeTensor.from_numpy(array, name, core_id=self.model_ref.core_id))
        return tensors

    def __call__(
        self,
        inputs: Mapping[str, SpikeTensor],
        outputs: Mapping[str, SpikeTensor] | None = None,
        save_trace: bool = False,
        ntff_name: str | None = None,
    ) -> dict[str, SpikeTensor] | None:
        """Execute; returns the outputs it allocated, or None when `outputs` were given."""
        allocated = outputs is None
        input_refs, output_refs, outputs = self._refs(inputs, outputs)
        if ntff_name is None:  # the profile goes next to the NEFF, as spike puts it
            ntff_name = str(Path(self.neff_path).with_suffix("")) + ".ntff"
        get_spike_singleton().execute(
            self.model_ref, input_refs, output_refs, save_trace=save_trace, ntff_name=ntff_name
        )
        return dict(outputs) if allocated else None

    def benchmark(
        self,
        inputs: Mapping[str, SpikeTensor],
        outputs: Mapping[str, SpikeTensor] | None = None,
        warmup_iter: int = 5,
        benchmark_iter: int = 5,
        mode: str = "device",
    ) -> BenchmarkResult:
        """Time `benchmark_iter` executions after `warmup_iter`: "device" reads the runtime's
        execution trace, "host" the wall clock."""
        if mode not in ("device", "host"):
            raise ValueError(f"benchmark mode must be 'device' or 'host', not {mode!r}")
        input_refs, output_refs, _ = self._refs(inputs, outputs)
        runtime = get_spike_singleton()
        with SystemTraceSession(self.model_ref.core_id) as trace:
            for _ in range(warmup_iter):
                runtime.execute(self.model_ref, input_refs, output_refs)
            trace.drain_events()
            durations = []
            for _ in range(benchmark_iter):
                started = time.perf_counter()
                runtime.execute(self.model_ref, input_refs, output_refs)
                durations.append((time.perf_counter() - started) * 1000.0)
            trace_json = trace.fetch_events_json()
        if mode == "device":  # the core records each execution as a start, then a stop event
            events = json.loads(trace_json)["events"] if trace_json else []
            stamps = [event["data"]["nc_timestamp_ns"] for event in events]
            durations = [(b - a) / 1e6 for a, b in zip(stamps[::2], stamps[1::2], strict=True)]
        if not durations:
            raise RuntimeError(f"the {mode} benchmark of {self.name!r} timed no execution")
        return BenchmarkResult(
            mean_ms=statistics.fmean(durations),
            min_ms=min(durations),
            max_ms=max(durations),
            std_dev_ms=statistics.pstdev(durations),
            iterations=len(durations),
            warmup_iterations=warmup_iter,
            durations_ms=durations,
        )

    def _refs(
        self, inputs: Mapping[str, SpikeTensor], outputs: Mapping[str, SpikeTensor] | None
    ) -> tuple[dict[str, Any], dict[str, Any], Mapping[str, SpikeTensor]]:
        """The runtime's input and output tensors of a checked call, and the outputs
        (allocated when not given)."""
        if outputs is None:
            outputs = {t.name: t for t in self.allocate_output_tensors()}
        self._validate_io(inputs, outputs)
        refs = [{k: v.tensor_ref for k, v in given.items()} for given in (inputs, outputs)]
        return refs[0], refs[1], outputs

    def _validate_io(
        self, inputs: Mapping[str, SpikeTensor], outputs: Mapping[str, SpikeTensor]
    ) -> None:
        """spike's checks in spike's order: unknown names (ValueError), then each tensor's
        core, shape and dtype (AssertionError: spike asserts, the double raises it also
        under `python -O`); fp8 arrays pass for the int8 tensors that carry fp8 in a NEFF;
        names left out only fail in the runtime's execute."""
        kinds = (
            ("input", inputs, self.input_tensors_info),
            ("output", outputs, self.output_tensors_info),
        )
        for kind, given, expected in kinds:
            unknown = sorted(set(given) - set(expected))
            if unknown:
                raise ValueError(
                    f"model {self.name!r} has no {kind} named {', '.join(unknown)}; "
                    f"its {kind}s are {', '.join(expected)}"
                )
        for kind, given, expected in kinds:
            for name, tensor in given.items():
                self._check_tensor(kind, name, tensor, expected[name])

    def _check_tensor(self, kind: str, name: str, tensor: Any, want: TensorMetadata) -> None:
        ref = getattr(tensor, "tensor_ref", None)
        if ref is None:  # spike reads tensor.tensor_ref: anything else is an AttributeError
            raise AttributeError(
                f"{kind} {name!r} is a {type(tensor).__name__}, not a SpikeTensor "
                "(make one with SpikeTensor.from_numpy)"
            )
        if ref.core_id != self.model_ref.core_id:
            raise AssertionError(
                f"{kind} {name!r} is on core {ref.core_id} but model {self.name!r} is "
                f"loaded on core {self.model_ref.core_id}"
            )
        dtype = np.dtype(tensor.dtype).name
        fp8_as_int8 = want.dtype == "int8" and dtype in _FP8_FOR_INT8
        if tuple(tensor.shape) != tuple(want.shape) or not (dtype == want.dtype or fp8_as_int8):
            raise AssertionError(
                f"{kind} {name!r} is {dtype}{list(tensor.shape)}; the NEFF expects "
                f"{want.dtype}{want.shape}"
            )


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # only here: float32-only users need not install it

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
