"""nkibuild's CPU stand-in for `spike._spike`, spike's native core (nanobind over libnrt).

It offers the core's interface as `../shared/testdata/spike-api.json` records it, so a
Python layer written for spike runs on it, and checks what libnrt and spike's C++ check
(docs/toolchain-double.md lists each rule). It is NOT the Neuron runtime: "device memory"
is host memory and `execute` fills every output with zeros.

It is labelled (`IS_TOOLCHAIN_DOUBLE = True`): a bundle loads placeholder NEFFs only into
this core. Every load, execute and refused execute is appended to `CALLS` and, as one
JSON line, to the file named by NKIBUILD_FAKE_SPIKE_LOG, so a test running a bundle in
another process sees exactly what the runtime received.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import math
import os
import time
from collections.abc import Mapping
from operator import attrgetter
from typing import Any

import numpy as np

from . import _neff

IS_TOOLCHAIN_DOUBLE = True
LOG_ENV = "NKIBUILD_FAKE_SPIKE_LOG"
LNC_ENV = "NEURON_LOGICAL_NC_CONFIG"
CALLS: list[dict[str, Any]] = []

# The only names the runtime's TensorMetadata.dtype takes.
RUNTIME_DTYPES = frozenset(
    {"float32", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32"}
    | {"uint32", "int64", "uint64"}
)
# Bytes per element of every dtype a NEFF tensor map may carry, including those the
# runtime has no name for (older placeholder NEFFs spell bool, float64 and fp8 names).
_ITEMSIZE = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "float8_e5m2": 1, "float8_e4m3fn": 1, "float8_e4m3": 1,
}  # fmt: skip
_DOUBLE = "nkibuild toolchain double: computes nothing, outputs are zeros"
_EXEC_EVENT = "nc_exec_running"


class SpikeRuntimeError(RuntimeError):
    pass


class SpikeError(SpikeRuntimeError):
    pass


class NrtError(SpikeRuntimeError):
    pass


def _spike_error(message: str) -> SpikeError:
    return SpikeError(f"Spike Error (toolchain double): {message}")


def _nrt_error(message: str) -> NrtError:
    return NrtError(f"NRT Error (toolchain double): {message}")


def _made_by_the_runtime(self: object) -> None:
    # The native classes bind no constructor: their objects come from the runtime only.
    raise TypeError(f"{type(self).__name__} objects are handed out by Spike; none is made here")


def _made(cls: type, **attributes: Any) -> Any:
    made = object.__new__(cls)
    for name, value in attributes.items():
        setattr(made, f"_{name}", value)
    return made


# --- trace sessions (the runtime's system trace is process-wide) ----------------------

_TRACES: list[SystemTraceSession] = []
_tracking_ids = itertools.count(1)


class SystemTraceSession:
    def __init__(self, core_id: int | None = None) -> None:
        """Record the executions on `core_id` (every core if None) until stopped."""
        self._core_id = core_id
        self._events: list[dict[str, Any]] = []
        _TRACES.append(self)

    def stop(self) -> None:
        """Stop recording (also done on leaving a `with` block)."""
        if self in _TRACES:
            _TRACES.remove(self)

    def fetch_events_json(self) -> str:
        """The events recorded since the last fetch or drain, as JSON; "" if none."""
        events = self._taken_events("fetch")
        return json.dumps({"events": events}) if events else ""

    def drain_events(self) -> None:
        self._taken_events("drain")

    def __enter__(self) -> SystemTraceSession:
        return self

    def __exit__(self, *args) -> None:
        self.stop()

    def _taken_events(self, action: str) -> list[dict[str, Any]]:
        if self not in _TRACES:
            raise _spike_error(f"cannot {action} the events of a stopped trace session")
        events, self._events = self._events, []
        return events

    def _record(self, core_id: int, start_ns: int, stop_ns: int) -> None:
        if self._core_id not in (None, core_id):
            return
        tracking_id = next(_tracking_ids)
        for phase, stamp in (("start", start_ns), ("stop", stop_ns)):
            data = {"nc_timestamp_ns": stamp, "toolchain_double": True}
            self._events.append(
                {"event_type": _EXEC_EVENT, "phase": phase, "tracking_id": tracking_id}
                | {"nc_idx": core_id, "data": data}
            )


# --- metadata, tensors and models --------------------------------------------------------


class TensorMetadata:
    __init__ = _made_by_the_runtime
    size = property(attrgetter("_size"))  # bytes
    dtype = property(attrgetter("_dtype"))  # the runtime's name, or "unknown"
    shape = property(lambda self: list(self._shape))


def _metadata(tensor: _neff.NeffTensor) -> TensorMetadata:
    return _made(
        TensorMetadata,
        size=math.prod(tensor.shape) * _ITEMSIZE[tensor.dtype],
        dtype=tensor.dtype if tensor.dtype in RUNTIME_DTYPES else "unknown",
        shape=tuple(tensor.shape),
    )


class ModelTensorInfo:
    __init__ = _made_by_the_runtime
    # A new dict per access, as nanobind converts the runtime's map each time.
    inputs = property(lambda self: dict(self._inputs))
    outputs = property(lambda self: dict(self._outputs))


class NrtTensor:
    __init__ = _made_by_the_runtime
    core_id = property(attrgetter("_core_id"))
    size = property(attrgetter("_size"))  # bytes
    name = property(attrgetter("_name"))

    @property
    def va(self) -> int:
        """Address of its bytes (host memory here, not device HBM)."""
        self._check_usable()
        if self._size == 0:
            return 0
        window = (ctypes.c_char * self._size).from_buffer(self._memory, self._offset)
        return ctypes.addressof(window)

    def _check_usable(self) -> None:
        if self._memory is None or self._runtime._closed:
            raise _spike_error(f"tensor {self._name!r} was freed (or its runtime closed)")

    def _bytes(self) -> memoryview:
        return memoryview(self._memory)[self._offset : self._offset + self._size]


def _tensor(
    runtime: Spike, memory: bytearray, offset: int, size: int, core_id: int, name: str | None
) -> NrtTensor:
    return _made(
        NrtTensor,
        runtime=runtime,
        memory=memory,
        offset=offset,
        size=size,
        core_id=core_id,
        name="unnamed_tensor" if name is None else name,  # the runtime's default name
        owner=offset == 0 and size == len(memory),
        written={"bytes": size},  # what was last written into it, for the log
    )


class NrtModel:
    __init__ = _made_by_the_runtime
    neff_path = property(attrgetter("_neff_path"))
    core_id = property(attrgetter("_core_id"))
    rank_id = property(attrgetter("_rank_id"))
    world_size = property(attrgetter("_world_size"))
    is_collective = property(attrgetter("_is_collective"))

    def __repr__(self) -> str:
        return f"<NrtModel of {self._neff_path} on core {self._core_id}: {_DOUBLE}>"

    def _check_loaded(self) -> None:
        if self._contents is None or self._runtime._closed:
            raise _spike_error(f"the model of {self._neff_path} is no longer loaded")


# --- the runtime -------------------------------------------------------------------------


class Spike:
    _alive = False  # whether a runtime is open in this process: only one may be
    _closed = False  # then its models and tensors are unusable

    def __init__(self, verbose_level: int = 0) -> None:
        if Spike._alive:
            raise _spike_error("a Spike runtime already exists in this process; close it first")
        Spike._alive = True

    @staticmethod
    def get_visible_neuron_core_count() -> int:
        """From NEURON_RT_VISIBLE_CORES ("0-3,6") or NEURON_RT_NUM_CORES; else one core."""
        visible = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
        if visible:
            spans = [part.partition("-") for part in visible.split(",")]
            return sum(int(high) - int(low) + 1 if high else 1 for low, _, high in spans)
        number = os.environ.get("NEURON_RT_NUM_CORES", "").strip()
        return int(number) if number.isdigit() else 1

    def close(self) -> int:
        """Close the runtime: its tensors and models become unusable. Returns 0."""
        if not self._closed:
            self._closed = True
            Spike._alive = False
        return 0

    def load_model(
        self,
        neff_file: str,
        core_id: int = 0,
        cc_enabled: bool = False,
        rank_id: int = 0,
        world_size: int = 1,
    ) -> NrtModel:
        self._check_open()
        path = str(neff_file)
        contents = _load_neff(path)
        placeholder = contents.info.get("nkibuild_placeholder") is True
        _record({"event": "load", "path": path, "core_id": core_id, "placeholder": placeholder})
        return _made(
            NrtModel,
            runtime=self,
            contents=contents,
            neff_path=path,
            core_id=core_id,
            rank_id=rank_id,
            world_size=world_size,
            is_collective=cc_enabled,
        )

    def unload_model(self, model: NrtModel) -> None:
        model._contents = None

    def execute(
        self,
        model: NrtModel,
        inputs: Mapping[str, NrtTensor],
        outputs: Mapping[str, NrtTensor],
        ntff_name: str | None = None,
        save_trace: bool = False,
    ) -> None:
        """Run `model` once: check the tensor sets, zero the outputs, record the call."""
        model._check_loaded()
        sets = {"input": _tensor_set(inputs), "output": _tensor_set(outputs)}
        inputs_written = {name: dict(tensor._written) for name, tensor in sets["input"].items()}
        call = {"path": model._neff_path, "inputs": inputs_written}
        try:
            _check_tensor_sets(model, sets)
        except NrtError as error:
            _record({"event": "rejected"} | call | {"error": f"NrtError: {error}"})
            raise
        started = time.perf_counter_ns()
        for tensor in sets["output"].values():  # the whole "kernel"
            tensor._bytes()[:] = bytes(tensor.size)
        stopped = time.perf_counter_ns()
        for trace in list(_TRACES):
            trace._record(model._core_id, started, stopped)
        if save_trace:
            with open(ntff_name or "profile.ntff", "w", encoding="utf-8") as profile:
                profile.write(f"not a profile: {model._neff_path} ran on the {_DOUBLE}\n")
        outputs_called = {"outputs": list(sets["output"]), "save_trace": save_trace}
        _record({"event": "call"} | call | outputs_called)

    def allocate_tensor(self, size: int, core_id: int = 0, name: str | None = None) -> NrtTensor:
        self._check_open()
        if size < 0:  # the binding takes a size_t
            raise OverflowError(f"a tensor size cannot be negative ({size})")
        return _tensor(self, bytearray(size), 0, size, core_id, name)

    def slice_from_tensor(
        self, source: NrtTensor, offset: int = 0, size: int = 0, name: str | None = None
    ) -> NrtTensor:
        """A view of `size` bytes (0: the rest) of `source` from `offset`."""
        source._check_usable()
        size = source.size - offset if size == 0 else size
        if offset < 0 or size < 0 or offset + size > source.size:
            raise _nrt_error(
                f"a slice of {size} bytes at offset {offset} does not fit in "
                f"{source.name!r} ({source.size} bytes)"
            )
        return _tensor(
            source._runtime, source._memory, source._offset + offset, size, source.core_id, name
        )

    def free_tensor(self, tensor: NrtTensor) -> None:
        """Release a tensor's memory (a slice of it keeps the bytes it views)."""
        if tensor._owner:
            tensor._memory = None

    def tensor_write(self, tensor: NrtTensor, data: bytes, offset: int = 0) -> None:
        if not isinstance(data, bytes):
            raise TypeError(f"tensor_write takes bytes, not {type(data).__name__}")
        _write(tensor, memoryview(data), offset)
        tensor._written = {"bytes": len(data)}

    def tensor_read(self, tensor: NrtTensor, offset: int = 0, size: int = 0) -> bytes:
        """`size` bytes (0: the rest) from `offset`."""
        return _read(tensor, offset, size)

    def tensor_write_from_pybuffer(
        self, tensor: NrtTensor, buffer: object, offset: int = 0
    ) -> None:
        view = _byte_view(buffer, writable=False)
        _write(tensor, view, offset)
        # For the log only (the runtime itself sees bytes): an array's dtype and shape.
        if isinstance(buffer, np.ndarray):
            tensor._written = {"dtype": buffer.dtype.name, "shape": list(buffer.shape)}
        else:
            tensor._written = {"bytes": view.nbytes}

    def tensor_read_to_pybuffer(
        self, tensor: NrtTensor, buffer: object, offset: int = 0, size: int = 0
    ) -> None:
        view = _byte_view(buffer, writable=True)
        data = _read(tensor, offset, size)
        if view.nbytes < len(data):
            raise RuntimeError(f"a {view.nbytes}-byte buffer cannot take {len(data)} bytes")
        view[: len(data)] = data

    def get_tensor_info(self, model: NrtModel) -> ModelTensorInfo:
        """The model's inputs and outputs (non-const tensors of its NEFF)."""
        model._check_loaded()
        return _made(
            ModelTensorInfo,
            inputs=_unordered(model._contents, "input"),
            outputs=_unordered(model._contents, "output"),
        )

    def _check_open(self) -> None:
        if self._closed:
            raise _spike_error("this Spike runtime was closed")


# --- helpers -----------------------------------------------------------------------------


def _load_neff(path: str) -> _neff.NeffContents:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        raise _spike_error(f"cannot open NEFF file {path}: {error.strerror}") from None
    try:
        contents = _neff.read(data)
    except _neff.NeffReadError as error:
        raise _nrt_error(f"cannot load {path}: not a NEFF: {error}") from None
    for tensor in contents.tensors:
        if tensor.dtype not in _ITEMSIZE:
            raise _nrt_error(
                f"cannot load {path}: tensor {tensor.name!r} has dtype {tensor.dtype!r}"
            )
    configured, lnc = os.environ.get(LNC_ENV, "").strip(), contents.info.get("num_tpb")
    # A NEFF runs on as many physical cores as it was compiled for (its lnc).
    if configured and isinstance(lnc, int) and configured != str(lnc):
        raise _nrt_error(
            f"cannot load {path}: it was compiled for lnc={lnc} but {LNC_ENV}={configured}"
        )
    return contents


def _tensor_set(tensors: object) -> dict[str, NrtTensor]:
    """What the binding accepts for Mapping[str, NrtTensor]; freed tensors are refused."""
    if not isinstance(tensors, Mapping) or not all(
        isinstance(k, str) and isinstance(v, NrtTensor) for k, v in tensors.items()
    ):
        raise TypeError(f"execute takes a mapping of names to NrtTensor, not {tensors!r}")
    for tensor in tensors.values():
        tensor._check_usable()
    return dict(tensors)


def _check_tensor_sets(model: NrtModel, sets: dict[str, dict[str, NrtTensor]]) -> None:
    """Refuse an execute the runtime would refuse: it knows names, sizes and cores."""
    for kind, given in sets.items():
        expected = {t.name: t for t in model._contents.tensors if t.kind == kind}
        unknown, missing = sorted(set(given) - set(expected)), sorted(set(expected) - set(given))
        if unknown or missing:
            raise _nrt_error(
                f"cannot execute {model._neff_path}: the {kind} tensors name unknown "
                f"{unknown} and leave out {missing} of the NEFF's {sorted(expected)}"
            )
        for name, tensor in given.items():
            size = _metadata(expected[name]).size
            if tensor.size != size or tensor.core_id != model._core_id:
                raise _nrt_error(
                    f"cannot execute {model._neff_path}: {kind} {name!r} is "
                    f"{tensor.size} bytes on core {tensor.core_id}; the NEFF expects "
                    f"{size} bytes on core {model._core_id}"
                )


def _unordered(contents: _neff.NeffContents, kind: str) -> dict[str, TensorMetadata]:
    """The runtime fills these dicts from an unordered_map: a caller that relies on their
    order is wrong and should find out here. So the order is the reverse of the NEFF's
    own (parameter ids for inputs, output numbers for outputs, else tensor-map order)."""
    rank = {name: i for i, name in enumerate(contents.parameter_order)}

    def position(tensor: _neff.NeffTensor) -> float:
        number = tensor.name.removeprefix("output")
        if kind == "output" and number.isdigit():
            return int(number)
        return rank.get(tensor.name, math.inf)  # a stable sort keeps the rest in map order

    ordered = sorted((t for t in contents.tensors if t.kind == kind), key=position)
    return {t.name: _metadata(t) for t in reversed(ordered)}


def _write(tensor: NrtTensor, data: memoryview, offset: int) -> None:
    _check_bounds(tensor, "write", offset, data.nbytes)
    tensor._bytes()[offset : offset + data.nbytes] = data


def _read(tensor: NrtTensor, offset: int, size: int) -> bytes:
    size = tensor.size - offset if size == 0 else size
    _check_bounds(tensor, "read", offset, size)
    return bytes(tensor._bytes()[offset : offset + size])


def _check_bounds(tensor: NrtTensor, action: str, offset: int, size: int) -> None:
    tensor._check_usable()
    if tensor.size < offset + size:
        raise _spike_error(
            f"a {size}-byte {action} at offset {offset} exceeds the tensor bound of "
            f"{tensor.name!r} ({tensor.size} bytes)"
        )


def _byte_view(buffer: object, *, writable: bool) -> memoryview:
    """The buffer's bytes, as PyBUF_SIMPLE (or PyBUF_WRITABLE) gives them to C."""
    try:
        view = memoryview(buffer)  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):
        # NumPy cannot describe ml_dtypes' formats to memoryview: take the array's bytes.
        whole = isinstance(buffer, np.ndarray) and buffer.flags.c_contiguous
        view = memoryview(buffer.reshape(-1).view(np.uint8)) if whole else None
    if view is None or not view.c_contiguous or (writable and view.readonly):
        wanted = "a writable C-contiguous buffer" if writable else "a C-contiguous buffer"
        raise RuntimeError(f"expected {wanted}, got {type(buffer).__name__}")
    return view.cast("B") if view.ndim != 1 or view.format != "B" else view


def _record(event: dict[str, Any]) -> None:
    CALLS.append(event)
    log = os.environ.get(LOG_ENV)
    if log:
        # One append-mode write per record: processes sharing the log never interleave lines.
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(event) + "\n")
