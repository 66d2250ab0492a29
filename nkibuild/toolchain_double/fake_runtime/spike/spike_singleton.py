"""The one runtime of the process, made on first use, and what configures and closes it."""

from __future__ import annotations

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
    """Choose the visible NeuronCores; only before the runtime is made (or after reset())."""
    with _lock:
        if _runtime is not None:
            raise RuntimeError(
                "the runtime is running, so its visible cores are fixed: "
                "spike.reset() it before configure()"
            )
    if visible_cores is None:
        return
    if isinstance(visible_cores, int):
        raise TypeError(f"visible_cores takes an iterable of core ids, such as [{visible_cores}]")
    cores = list(visible_cores)
    for core in cores:
        if not isinstance(core, int):
            raise TypeError(f"visible_cores holds {core!r}, which is not an int core id")
        if core < 0:
            raise ValueError(f"visible_cores holds {core}: core ids start at 0")
    if cores:
        os.environ["NEURON_RT_VISIBLE_CORES"] = ",".join(map(str, cores))
        logger.info("toolchain double: visible cores %s", os.environ["NEURON_RT_VISIBLE_CORES"])


def reset() -> None:
    """Close the runtime if there is one; existing tensors and models become invalid."""
    global _runtime
    with _lock:
        if _runtime is None:
            return
        warnings.warn(
            "spike.reset() closed the runtime: tensors and models made before it are unusable",
            UserWarning,
            stacklevel=2,
        )
        _runtime.close()
        _runtime = None


def get_spike_singleton() -> Spike:
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = Spike()
        return _runtime
