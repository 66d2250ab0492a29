"""`nkibuild explain`: why a build unit is (or would be) rebuilt, input by input.

It compares what the last build ran with (the extraction records in the state
dir and each compile's `key.json`) with what a build would use now, and looks
the new cache key up in the caches, so a cache miss names its cause.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nkibuild.cache import CacheKey
from nkibuild.compiler import KEY_FILE, cache_key, finished_result
from nkibuild.context import BuildContext
from nkibuild.errors import UsageError
from nkibuild.frontends import METADATA_FILE, load_artifact
from nkibuild.graph.records import extract_record_path, file_hashes, read_json_object
from nkibuild.graph.tasks import extract_config, extract_files
from nkibuild.plan import BuildUnit

KEY_FIELDS = {
    "hlo": "HLO module (normalized content hash)",
    "compile_args": "compiler arguments",
    "compiler_version": "compiler version",
    "neuron_cc_flags": "NEURON_CC_FLAGS",
    "target": "target",
    "lnc": "logical NeuronCores (lnc)",
    "key_schema": "nkibuild's cache key format",
}


# What the next build does for a unit, and the head line that says so. Only the last
# three replace the NEFF for certain: a re-extraction whose HLO comes out the same
# keeps the NEFF in the build directory, so it must not read as "rebuilt".
ACTIONS = {
    "none": "up to date",
    "re-extract": "re-extracted; recompiled only if its HLO changes",
    "re-extract-and-rebuild": "re-extracted, then rebuilt (compiled or from a cache)",
    "fetch": "NEFF taken from the cache (no compile)",
    "compile": "recompiled",
    "known-failure": "fails at once: its compile is a known failure",
}
REBUILDS = ("re-extract-and-rebuild", "fetch", "compile")


@dataclass(frozen=True)
class Explanation:
    unit: str
    action: str  # a key of ACTIONS
    reasons: tuple[str, ...]
    outcome: str  # what the next build would do for this unit, in words

    @property
    def rebuild(self) -> bool:
        """Whether the next build replaces the unit's NEFF for certain."""
        return self.action in REBUILDS

    def to_json(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "action": self.action,
            "rebuild": self.rebuild,
            "reasons": list(self.reasons),
            "outcome": self.outcome,
        }

    def render(self) -> str:
        head = f"{self.unit}: {ACTIONS[self.action]}"
        lines = [head, *(f"  - {reason}" for reason in self.reasons), f"  => {self.outcome}"]
        return "\n".join(lines)


def explain_unit(context: BuildContext, unit: BuildUnit) -> Explanation:
    extract_reasons = _extract_changes(context, unit)
    hlo_hash = None if extract_reasons else _current_hlo_hash(context, unit)
    key = cache_key(unit, hlo_hash or "", context.toolchain)
    recorded = read_json_object(context.layout.compile_dir(unit) / KEY_FILE)
    if recorded is None:
        compile_reasons = ["never compiled in this build directory"]
    else:
        current = key.to_json()
        if hlo_hash is None:
            del current["hlo"]  # unknown until the extraction reruns
        compile_reasons = _key_changes(recorded, current)
        if not (extract_reasons or compile_reasons or _neff_intact(context, unit, recorded)):
            compile_reasons.append("the NEFF of the last build is missing or damaged")
    known_key = None if hlo_hash is None else key
    action, outcome = _next_step(context, known_key, bool(extract_reasons), compile_reasons)
    return Explanation(unit.name, action, (*extract_reasons, *compile_reasons), outcome)


def _extract_changes(context: BuildContext, unit: BuildUnit) -> list[str]:
    spec = unit.extract
    record = read_json_object(extract_record_path(context.layout.state_dir, spec.name))
    if record is None:
        return [f"extraction {spec.name} never ran in this build directory"]
    changes = _file_changes(
        record.get("files", {}),
        file_hashes(context.manifest.root, extract_files(context, spec)),
    )
    changes += _config_changes(record.get("config", {}), extract_config(context, spec))
    if not changes and not (context.layout.extract_dir(spec) / METADATA_FILE).is_file():
        changes.append(f"the extracted HLO of {spec.name} is missing")
    return changes


def _differences(before: dict[str, Any], now: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, value before, value now) of each key whose value changed, in key order."""
    return [
        (key, before.get(key), now.get(key))
        for key in sorted(before.keys() | now.keys())
        if before.get(key) != now.get(key)
    ]


def _file_changes(before: dict[str, str | None], now: dict[str, str | None]) -> list[str]:
    changes = []
    for path, old, new in _differences(before, now):
        if old is None:
            changes.append(f"file {path} is new to this kernel")
        elif new is None:
            changes.append(f"file {path} is gone")
        else:
            changes.append(f"file {path} changed (sha256 {old[:12]}... -> {new[:12]}...)")
    return changes


def _config_changes(before: dict[str, Any], now: dict[str, Any]) -> list[str]:
    changes = []
    for key, old, new in _differences(before, now):
        if key == "passed_env":
            names = [name for name, _, _ in _differences(old or {}, new or {})]
            # Values may be secrets: name the variables only.
            changes.append(f"passed environment variables changed: {', '.join(names)}")
        elif key == "versions":
            versions = ", ".join(
                f"{name} {old_version or 'absent'} -> {new_version or 'absent'}"
                for name, old_version, new_version in _differences(old or {}, new or {})
            )
            changes.append(f"frontend packages changed: {versions}")
        else:
            changes.append(f"extraction setting {key}: {_show(old)} -> {_show(new)}")
    return changes


def _current_hlo_hash(context: BuildContext, unit: BuildUnit) -> str | None:
    try:
        return load_artifact(context.layout.extract_dir(unit.extract)).content_hash
    except (OSError, ValueError, KeyError):
        return None


def _key_changes(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
    return [
        f"{KEY_FIELDS[field]}: {_show(recorded.get(field))} -> {_show(current[field])}"
        for field in sorted(current, key=list(KEY_FIELDS).index)
        if recorded.get(field) != current[field]
    ]


def _neff_intact(context: BuildContext, unit: BuildUnit, recorded: dict[str, Any]) -> bool:
    digest = CacheKey(tuple(sorted(recorded.items()))).digest
    return finished_result(context.layout.compile_dir(unit), digest) is not None


def _next_step(
    context: BuildContext, key: CacheKey | None, re_extract: bool, compile_reasons: list[str]
) -> tuple[str, str]:
    """The action (a key of ACTIONS) and what it means for this unit, in words; `key` is
    the unit's cache key now, None while its HLO is unknown."""
    if re_extract and not compile_reasons:
        # Every kernel of an edited file re-extracts; most come out with the same HLO.
        return "re-extract", (
            "re-extract; if the HLO comes out the same, the NEFF in the build directory is "
            "kept (no compile), otherwise it is compiled or taken from a cache"
        )
    if key is None:
        return "re-extract-and-rebuild", (
            "re-extract first, then compile or take the NEFF from a cache: which one is "
            "known once the new HLO is"
        )
    if not compile_reasons:
        return "none", "nothing to do: the NEFF in the build directory is current"
    from nkibuild.cache import open_cache_chain

    settings = context.settings.cache
    chain = open_cache_chain(settings.local_dir, settings.remote_url, read_only=True)
    where = chain.locate(key) if chain else None
    if where is not None:
        return "fetch", f"no compile: key {key.digest[:16]} is in the cache at {where}"
    failed = chain.known_failure(key) if chain else None
    if failed is not None:
        failure = failed.meta["failure"]
        return "known-failure", (
            f"no compile: key {key.digest[:16]} failed to compile before ({failure['message']}, "
            f"exit status {failure['returncode']}), as the cache at {failed.location} records; "
            "the build reports that failure (--retry-failed compiles it again)"
        )
    return "compile", f"compile with neuronx-cc: key {key.digest[:16]} is in no cache"


def _show(value: Any) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "`" + " ".join(value) + "`"
    if isinstance(value, str) and len(value) == 64:
        return value[:12] + "..."  # a digest
    return json.dumps(value) if not isinstance(value, str) else repr(value)


def explain(context: BuildContext, names: list[str]) -> list[Explanation]:
    """Explanations for the named units, kernels or `compile:` tasks (all units if none)."""
    units = context.units
    chosen = [] if names else list(units)
    for name in names:
        plain = name.removeprefix("compile:")
        matches = [u for u in units if plain in (u.name, u.kernel, f"{u.kernel}/{u.variant}")]
        if not matches:
            import difflib

            close = difflib.get_close_matches(plain, [u.name for u in units], n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else "; see `nkibuild plan`"
            raise UsageError(f"no build unit matches {name!r}{hint}")
        chosen += [u for u in matches if u not in chosen]
    return [explain_unit(context, unit) for unit in chosen]
