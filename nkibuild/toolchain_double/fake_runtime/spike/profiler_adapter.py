"""`SpikeProfiler`: a runtime whose executes note where they were called from (spike's
`profiler_adapter.py`): rank 0 appends PID, call site and kernel to `debug_rank_0.txt`."""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

from ._spike import Spike


class SpikeProfiler:
    """Wraps its own runtime (`Spike(verbose_level)`); everything but execute is delegated."""

    def __init__(self, verbose_level: int = 0, target_file: str | None = None) -> None:
        self._spike = Spike(verbose_level)
        self.target_file = target_file

    def execute(
        self,
        model: Any,
        inputs: Any,
        outputs: Any,
        ntff_name: str | None = None,
        save_trace: bool = False,
    ) -> None:
        rank = _rank()
        if rank == 0:
            file, line = self._find_source_loc()
            with open(f"debug_rank_{rank}.txt", "a", encoding="utf-8") as debug:
                debug.write(f"PID: {os.getpid()}\nSOURCE: {file}:{line}\n")
                if getattr(model, "neff_path", None):
                    kernel = os.path.basename(model.neff_path).replace(".neff", "")
                    debug.write(f"KERNEL: {kernel}\n")
                debug.write("---\n")
        return self._spike.execute(model, inputs, outputs, ntff_name, save_trace)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spike, name)

    def _find_source_loc(self) -> tuple[str, int]:
        """The innermost caller frame in the target file (default: the main script)."""
        target = self.target_file or (os.path.basename(sys.argv[0]) if sys.argv else None)
        if not target:
            raise RuntimeError(
                "Error finding target profiling file. Manually specify it in "
                "SpikeProfiler(target_file='your_file.py'): no sys.argv"
            )
        frame = inspect.currentframe()
        while frame:
            if target in frame.f_code.co_filename:
                return frame.f_code.co_filename, frame.f_lineno
            frame = frame.f_back
        raise RuntimeError(
            f"Error finding target profiling file: {target}. "
            "Manually specify it in SpikeProfiler(target_file='your_file.py')"
        )


def _rank() -> int:
    # Imported only here: importing spike must not import torch.
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank())
    return 0
