"""`SpikeProfiler`: a runtime whose executes note where they were called from: on rank 0,
each execute appends its PID, call site and kernel to `debug_rank_0.txt`."""

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
        if _rank() == 0:  # one record per call, not one per rank
            file, line = self._call_site()
            kernel = os.path.basename(getattr(model, "neff_path", "") or "").replace(".neff", "")
            with open("debug_rank_0.txt", "a", encoding="utf-8") as debug:
                debug.write(f"PID: {os.getpid()}\nSOURCE: {file}:{line}\n")
                debug.write(f"KERNEL: {kernel}\n---\n" if kernel else "---\n")
        return self._spike.execute(model, inputs, outputs, ntff_name, save_trace)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spike, name)

    def _call_site(self) -> tuple[str, int]:
        """The innermost caller frame in the target file (default: the main script)."""
        target = self.target_file or (os.path.basename(sys.argv[0]) if sys.argv else "")
        frame = inspect.currentframe()
        while target and frame:
            if target in frame.f_code.co_filename:
                return frame.f_code.co_filename, frame.f_lineno
            frame = frame.f_back
        raise RuntimeError(
            f"no caller in {target or 'the main script'!r} on the stack: name the file that "
            "calls the kernels with SpikeProfiler(target_file=...)"
        )


def _rank() -> int:
    # Looked up, not imported: importing spike must not import torch.
    distributed = sys.modules.get("torch.distributed")
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank())
    return 0
