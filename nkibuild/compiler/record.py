"""What a unit's compile directory holds once its compile finished: `result.json`
(a `CompiledNeff`), written last so that its presence marks completion."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nkibuild.cache import file_sha256
from nkibuild.errors import BuildError
from nkibuild.fsutil import atomic_write_text
from nkibuild.manifest.model import TensorSpec

NEFF_FILE = "model.neff"
LOG_FILE = "compile.log"
RESULT_FILE = "result.json"
KEY_FILE = "key.json"  # the cache key's inputs, for `nkibuild explain`
# The peak memory of the unit's last compile attempt that left no result.json (an attempt
# that was retried, e.g. after the OOM killer took it), for scheduling the next; a
# finished compile's peak is in result.json.
PEAK_FILE = "peak-memory.json"
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
    neff_version: str = ""  # the NEFF format, "2.0" ("": a record from before it was kept)

    def to_json(self) -> dict[str, object]:
        data = dict(vars(self))
        data["neff_path"] = NEFF_FILE
        data["inputs"] = [t.to_json() for t in self.inputs]
        data["outputs"] = [t.to_json() for t in self.outputs]
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
    # could leave torn is recompiled, never used. One line: json's C encoder does not
    # indent.
    atomic_write_text(out_dir / RESULT_FILE, json.dumps(result.to_json()), durable=False)


def last_result(out_dir: Path) -> CompiledNeff | None:
    """What `out_dir`'s result.json records, for whichever key (None: none, or damaged)."""
    try:
        return load_result(out_dir)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def recorded_result(out_dir: Path, unit: str) -> CompiledNeff:
    """The compile `out_dir` records, for a later stage. The record is not fsync'd (see
    `write_result`): one a power loss tore under stats the outputs check still trusts is
    a BuildError, and removed, so that the next build compiles the unit again instead of
    failing the same way for ever."""
    result = last_result(out_dir)
    if result is None:
        (out_dir / RESULT_FILE).unlink(missing_ok=True)
        raise BuildError(
            f"the compile record {out_dir / RESULT_FILE} is missing or damaged; it was "
            "removed, and the next build compiles the unit again",
            unit=unit,
        )
    return result


def is_finished(result: CompiledNeff, digest: str) -> bool:
    """Whether `result` is the finished compile for the key `digest`, its NEFF intact."""
    try:
        return result.cache_key == digest and file_sha256(result.neff_path) == result.sha256
    except OSError:
        return False


def finished_result(out_dir: Path, digest: str) -> CompiledNeff | None:
    """The finished, intact NEFF in `out_dir` for the key `digest`, if there is one
    (e.g. from an earlier run whose doit state was lost when it was killed)."""
    result = last_result(out_dir)
    return result if result is not None and is_finished(result, digest) else None
