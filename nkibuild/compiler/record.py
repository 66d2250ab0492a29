"""What a unit's compile directory holds once its compile finished: `result.json`
(a `CompiledNeff`), written last so that its presence marks completion."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nkibuild.cache import file_sha256
from nkibuild.fsutil import atomic_write_text
from nkibuild.manifest.model import TensorSpec

NEFF_FILE = "model.neff"
LOG_FILE = "compile.log"
RESULT_FILE = "result.json"
KEY_FILE = "key.json"  # the cache key's inputs, for `nkibuild explain`
PEAK_FILE = "peak-memory.json"  # measured at the last compile, for scheduling the next
COMPILE_OUTPUTS = (NEFF_FILE, RESULT_FILE)


@dataclass(frozen=True)
class CompiledNeff:
    """A verified NEFF for one build unit and what the bundle needs to load it."""

    unit: str
    kernel: str
    variant: str
    target: str
    lnc: int
    neff_path: Path
    sha256: str
    cache_key: str
    compiler_version: str
    placeholder: bool
    inputs: tuple[TensorSpec, ...]  # the NEFF's own names, in parameter order
    outputs: tuple[TensorSpec, ...]
    origin: str  # "compiled", "ray", "cache-local", "cache-remote" or "build-dir"
    compile_seconds: float
    peak_memory: int = 0  # bytes, of the compile that made the NEFF (0: unknown)
    compile_args: tuple[str, ...] = ()
    notices: tuple[str, ...] = ()  # e.g. a corrupt cache entry that was discarded

    def to_json(self) -> dict[str, object]:
        data = dict(vars(self))
        data["neff_path"] = NEFF_FILE
        data["inputs"] = [t.to_json() for t in self.inputs]
        data["outputs"] = [t.to_json() for t in self.outputs]
        data["notices"] = list(self.notices)
        data["compile_args"] = list(self.compile_args)
        return data


def load_result(out_dir: Path) -> CompiledNeff:
    data = json.loads((out_dir / RESULT_FILE).read_text())
    data["neff_path"] = out_dir / NEFF_FILE
    data["inputs"] = tuple(TensorSpec.from_json(t) for t in data["inputs"])
    data["outputs"] = tuple(TensorSpec.from_json(t) for t in data["outputs"])
    data["notices"] = tuple(data.get("notices", ()))
    data["compile_args"] = tuple(data.get("compile_args", ()))
    return CompiledNeff(**data)


def write_result(out_dir: Path, result: CompiledNeff) -> None:
    # Atomic (a killed build leaves none or all of it) but not fsync'd: every reader
    # re-hashes the NEFF against it (`finished_result`, the bundle), so what a power loss
    # could leave torn is recompiled, never used.
    text = json.dumps(result.to_json(), indent=2)
    atomic_write_text(out_dir / RESULT_FILE, text, durable=False)


def finished_result(out_dir: Path, digest: str) -> CompiledNeff | None:
    """The finished, intact NEFF in `out_dir` for the key `digest`, if there is one
    (e.g. from an earlier run whose doit state was lost when it was killed)."""
    try:
        result = load_result(out_dir)
        if result.cache_key == digest and file_sha256(result.neff_path) == result.sha256:
            return result
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None
