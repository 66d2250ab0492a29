"""The one runtime of the process, created on first use, as in spike's `spike_singleton.py`.

`configure(visible_cores=...)` sets NEURON_RT_VISIBLE_CORES before the runtime exists;
`reset()` closes it (every tensor and model made so far becomes unusable);
`get_spike_singleton()` returns it, creating it on first use. The runtime is closed at
interpreter exit.
"""

from __future__ import annotations

import atexit
import os
import threading
import warnings
from collections.abc import Iterable

from ._spike import Spike
from .logger import get_logger

logger = get_logger()

_runtime: Spike | None = None
_lock = threading.Lock()


def configure(visible_cores: Iterable[int] | None = None) -> None:
    """Choose the visible NeuronCores; only before the runtime is created (or after reset())."""
    with _lock:
        if _runtime is not None:
            raise RuntimeError(
                "Cannot configure: Spike runtime is already active. "
                "Call spike.reset() first to close the runtime, then configure()."
            )
    if visible_cores is not None:
        cores = _core_list(visible_cores)
        if cores:
            os.environ["NEURON_RT_VISIBLE_CORES"] = ",".join(map(str, cores))
            logger.info("NEURON_RT_VISIBLE_CORES=%s", os.environ["NEURON_RT_VISIBLE_CORES"])


def _core_list(visible_cores: Iterable[int]) -> list[int]:
    if isinstance(visible_cores, int):
        raise TypeError(
            f"visible_cores must be an iterable, not int. "
            f"Use [{visible_cores}] or ({visible_cores},)"
        )
    cores = list(visible_cores)
    for core in cores:
        if not isinstance(core, int):
            raise TypeError(f"visible_cores must contain integers, got {type(core)}: {core}")
        if core < 0:
            raise ValueError(f"Core ID must be non-negative, got {core}")
    return cores


def reset() -> None:
    """Close the runtime if there is one; existing tensors and models become invalid."""
    global _runtime
    with _lock:
        if _runtime is None:
            return
        warnings.warn(
            "spike.reset() called. All existing SpikeTensor and SpikeModel objects are now "
            "invalid and should not be used.",
            UserWarning,
            stacklevel=2,
        )
        _runtime.close()
        _runtime = None


def get_spike_singleton() -> Spike:
    """The process's runtime, created on first use (thread-safe)."""
    global _runtime
    runtime = _runtime
    if runtime is not None:
        return runtime
    with _lock:
        if _runtime is None:
            _runtime = Spike()
        return _runtime


def _close_at_exit() -> None:
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.close()


atexit.register(_close_at_exit)
