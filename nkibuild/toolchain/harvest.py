"""Find the kernel's module among what torch-xla dumped into NEURON_COMPILE_CACHE_URL.

A graph-extraction run writes `neuronxcc-<version>/MODULE_<hash>+<flags>/` directories,
one per XLA graph: runtime glue and parameter loading as well as the kernel. The
kernel's module is the one holding the NKI custom-call; size alone misleads.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from nkibuild.errors import BuildError
from nkibuild.formats.backend_config import NKI_CUSTOM_CALLS
from nkibuild.formats.hlo import HloFormatError, read_hlo

HLO_FILE = "model.hlo_module.pb"
FLAGS_FILE = "compile_flags.json"


@dataclass(frozen=True)
class DumpedModule:
    directory: Path
    hlo: bytes
    flags: tuple[str, ...]
    nki_calls: int
    size: int


def module_dirs(cache_dir: Path) -> set[Path]:
    return {path.parent for path in cache_dir.glob(f"neuronxcc-*/MODULE_*/{HLO_FILE}")}


def find_modules(cache_dir: Path, since: Collection[Path] = ()) -> list[DumpedModule]:
    """Modules dumped under `cache_dir`, except those in `since` (seen before this job)."""
    return [_dumped(directory) for directory in sorted(module_dirs(cache_dir) - set(since))]


def choose_kernel_module(modules: Sequence[DumpedModule], kernel: str) -> DumpedModule:
    candidates = [module for module in modules if module.nki_calls]
    if len(candidates) == 1:
        return candidates[0]
    if not modules:
        raise BuildError(
            f"no HLO module was dumped for {kernel} (did the kernel run on an XLA device, "
            "and was xm.mark_step() reached?)"
        )
    if not candidates and len(modules) == 1:
        return modules[0]
    listing = "; ".join(
        f"{m.directory.name} ({m.size} bytes, {m.nki_calls} NKI calls)" for m in modules
    )
    if not candidates:
        raise BuildError(
            f"none of the dumped modules of {kernel} holds an NKI kernel custom-call: {listing}"
        )
    raise BuildError(
        f"several dumped modules of {kernel} hold an NKI kernel custom-call, so which one is "
        f"the kernel is ambiguous: {listing}; extract one kernel call per kernel"
    )


def _dumped(directory: Path) -> DumpedModule:
    hlo = (directory / HLO_FILE).read_bytes()
    try:
        calls = sum(1 for call in read_hlo(hlo).custom_calls if call.target in NKI_CUSTOM_CALLS)
    except HloFormatError:
        calls = 0
    return DumpedModule(directory, hlo, _flags(directory / FLAGS_FILE), calls, len(hlo))


def _flags(path: Path) -> tuple[str, ...]:
    try:
        flags = json.loads(path.read_text())
    except (OSError, ValueError):
        return ()
    return tuple(str(flag) for flag in flags) if isinstance(flags, list) else ()
