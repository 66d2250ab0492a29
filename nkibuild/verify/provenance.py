"""`nkibuild verify-provenance`: is a wheel one a release's provenance statement vouches for?

The statement (`provenance.intoto.json`, an in-toto Statement v1 with a SLSA
provenance v1 predicate) lists each wheel it covers as a subject (name and sha256)
and, per project, the materials and tools its bundle recorded in `_build.json`.
A wheel passes when its sha256 is a subject and its own provenance summary lists
exactly the materials (by path and sha256) and tools (by name and version) that the
statement lists for its project. `project_dependencies` is the one mapping from a
summary to the statement's entries; the release writes with it, this module reads.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from nkibuild.bundle.buildinfo import FILE_NAME, BuildInfo, BuildInfoError
from nkibuild.cache.key import file_sha256
from nkibuild.confine import read_regular
from nkibuild.errors import UsageError
from nkibuild.formats.jsonlimits import JsonLimitError, JsonLimits, load_json
from nkibuild.verify import MAX_BUILD_INFO_BYTES, MAX_WHEEL_BYTES, opened_wheel

STATEMENT_FILE = "provenance.intoto.json"
# Earlier releases' statements, which a later release into the same folder keeps.
KEPT_STATEMENTS = "provenance-*.intoto.json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"


@dataclass(frozen=True)
class ProvenanceCheck:
    """One wheel against one statement; `problems` empty: it passed."""

    wheel: Path
    statement: Path
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what was checked, for the report

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "wheel": str(self.wheel),
            "statement": str(self.statement),
            "ok": self.ok,
            "problems": list(self.problems),
            "notes": list(self.notes),
        }


def project_dependencies(info: BuildInfo, directory: str) -> list[dict[str, Any]]:
    """The statement's resolvedDependencies for one project's bundle: its manifest and
    sources (named by their path from the release root, `directory` being the project's)
    and the tools that built it, each annotated with the project and its role."""
    assert info.provenance is not None
    summary = info.provenance
    files = [("manifest", summary.manifest), *(("source", m) for m in summary.sources)]
    tools = [*((t.name, t.version) for t in summary.tools), ("nkibuild", info.nkibuild_version)]
    described = [
        {
            "name": f"{directory}/{material.path}" if directory not in ("", ".") else material.path,
            "digest": {"sha256": material.sha256},
            "annotations": {"project": info.package, "role": role, "path": material.path},
        }
        for role, material in files
    ]
    described += [
        {
            "uri": f"pkg:pypi/{name}@{quote(version, safe='')}",
            "name": name,
            "annotations": {"project": info.package, "role": "tool", "version": version},
        }
        for name, version in sorted(set(tools))
    ]
    return described


def wheel_build_info(wheel: Path) -> BuildInfo | None:
    """The `_build.json` of a bundle wheel; None for a wheel without one (a split
    bundle's per-target NEFF part). UsageError if it is not a readable wheel."""
    with opened_wheel(wheel) as archive:
        members = [n for n in archive.namelist() if n.count("/") == 1]
        records = [n for n in members if n.endswith(f"/{FILE_NAME}")]
        if not records:
            return None
        if len(records) > 1:
            raise UsageError(f"{wheel}: more than one package with {FILE_NAME}")
        if archive.getinfo(records[0]).file_size > MAX_BUILD_INFO_BYTES:
            raise zipfile.BadZipFile(f"{records[0]} is larger than {MAX_BUILD_INFO_BYTES}")
        text = archive.read(records[0]).decode("utf-8", errors="replace")
    try:
        return BuildInfo.from_text(text)
    except BuildInfoError as error:
        raise UsageError(f"{wheel}: {error.of(records[0])}") from None


def read_statement(path: Path) -> dict[str, Any]:
    """The statement at `path`, checked for the fields this module reads.

    UsageError if it cannot be read; ValueError (the problem) if it is not a
    provenance statement nkibuild wrote."""
    try:
        text = read_regular(path, JsonLimits().max_bytes)
    except OSError as error:
        raise UsageError(
            f"{path}: cannot read the provenance statement ({error.strerror or error}); "
            f"a release writes {STATEMENT_FILE} next to its wheels, or pass --statement FILE"
        ) from None
    try:  # bounded: a statement is a file anyone can hand over
        statement = load_json(text)
    except JsonLimitError as error:
        raise ValueError(f"{path} is not JSON ({error})") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise ValueError(f"{path} is not an in-toto Statement v1 (_type {STATEMENT_TYPE})")
    if statement.get("predicateType") != PREDICATE_TYPE:
        raise ValueError(f"{path}: predicateType is not {PREDICATE_TYPE}")
    _require_list(statement, ("subject",), path)
    _require_list(statement, ("predicate", "buildDefinition", "resolvedDependencies"), path)
    _require_digest_sets(statement["subject"], path)
    return statement


def digests_of(statement: dict[str, Any]) -> set[str]:
    """The sha256 of every subject of a statement `read_statement` returned."""
    return {digest for subject in statement["subject"] if (digest := _sha256(subject))}


def statement_for(wheel: Path) -> Path:
    """The statement in the wheel's folder that lists its digest: the latest release's,
    else a kept earlier one; the latest release's if none does (it then says why not)."""
    latest = wheel.parent / STATEMENT_FILE
    try:
        digest = _wheel_sha256(wheel)
    except UsageError:
        return latest
    for path in (latest, *sorted(wheel.parent.glob(KEPT_STATEMENTS))):
        try:
            if digest in digests_of(read_statement(path)):
                return path
        except (UsageError, ValueError):
            continue
    return latest


def _require_list(document: dict[str, Any], keys: tuple[str, ...], path: Path) -> None:
    value: Any = document
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise ValueError(f"{path}: {'.'.join(keys)} is not a list of objects")


def _require_digest_sets(subjects: list[dict[str, Any]], path: Path) -> None:
    """Each subject's digest is an in-toto DigestSet: an object of algorithm -> hex string."""
    for index, subject in enumerate(subjects):
        digest = subject.get("digest")
        if not isinstance(digest, dict):
            raise ValueError(f"{path}: subject[{index}].digest is not an object")
        for algorithm, value in digest.items():
            if not isinstance(value, str):
                raise ValueError(f"{path}: subject[{index}].digest.{algorithm} is not a string")


def check_wheel(wheel: Path, statement_path: Path) -> ProvenanceCheck:
    digest = _wheel_sha256(wheel)
    try:
        statement = read_statement(statement_path)
    except ValueError as error:
        return ProvenanceCheck(wheel, statement_path, (str(error),))
    problems = _subject_problems(wheel.name, digest, statement["subject"])
    if problems:
        return ProvenanceCheck(wheel, statement_path, tuple(problems))
    notes = [f"sha256 {digest[:12]}… is a subject of the statement"]
    info = wheel_build_info(wheel)
    if info is None:
        notes.append(f"no {FILE_NAME} (a per-target NEFF part): its digest is all there is")
    elif info.provenance is None:
        problems.append(
            f"its {FILE_NAME} has no provenance summary (built by nkibuild "
            f"{info.nkibuild_version}, which did not record one)"
        )
    else:
        recorded = _entries(project_dependencies(info, ""), info.package)
        listed = statement["predicate"]["buildDefinition"]["resolvedDependencies"]
        problems = _summary_problems(info.package, recorded, _entries(listed, info.package))
        if not problems:
            tools = sum(role == "tool" for role, _ in recorded)
            notes.append(f"{len(recorded) - tools} materials and {tools} tools agree")
    return ProvenanceCheck(wheel, statement_path, tuple(problems), tuple(notes))


def _wheel_sha256(wheel: Path) -> str:
    """Hashed through the bounded reader; UsageError for a missing or unreadable wheel."""
    try:
        return file_sha256(wheel, MAX_WHEEL_BYTES)
    except FileNotFoundError:
        raise UsageError(f"{wheel}: no such wheel") from None
    except OSError as error:
        raise UsageError(f"{wheel}: not a readable wheel ({error.strerror or error})") from None


def _subject_problems(name: str, digest: str, subjects: list[dict[str, Any]]) -> list[str]:
    """in-toto matches subjects by digest; a subject of the same name with another
    digest is named, because it says which wheel the release did build."""
    digests = {_sha256(s): s.get("name") for s in subjects}
    if digest in digests:
        return []
    same_name = [_sha256(s) for s in subjects if s.get("name") == name]
    if same_name:
        return [
            f"{name}: sha256 {digest} is not a subject; the statement lists {name} with "
            f"sha256 {same_name[0]}: this is not the wheel the release built"
        ]
    listed = ", ".join(sorted(str(n) for n in digests.values())) or "nothing"
    return [f"{name}: sha256 {digest} is not a subject of the statement (it lists {listed})"]


def _sha256(descriptor: dict[str, Any]) -> str | None:
    digest = descriptor.get("digest")
    return digest.get("sha256") if isinstance(digest, dict) else None


def _summary_problems(
    project: str, recorded: dict[tuple[str, str], str], stated: dict[tuple[str, str], str]
) -> list[str]:
    if not stated:
        return [f"the statement lists no materials of project {project!r}"]
    problems = []
    for key in sorted(recorded.keys() | stated.keys()):
        role, name = key
        what = "version" if role == "tool" else "sha256"
        if key not in stated:
            problems.append(f"{role} {name}: in the wheel's {FILE_NAME}, not in the statement")
        elif key not in recorded:
            problems.append(f"{role} {name}: in the statement, not in the wheel's {FILE_NAME}")
        elif recorded[key] != stated[key]:
            problems.append(
                f"{role} {name}: the wheel records {what} {recorded[key]}, "
                f"the statement {stated[key]}"
            )
    return problems


def _entries(descriptors: list[dict[str, Any]], project: str) -> dict[tuple[str, str], str]:
    """(role, path or tool name) -> sha256 or version, for one project's entries."""
    entries = {}
    for descriptor in descriptors:
        notes = descriptor.get("annotations")
        if not isinstance(notes, dict) or notes.get("project") != project:
            continue
        role = str(notes.get("role"))
        if role == "tool":
            entries[(role, str(descriptor.get("name")))] = str(notes.get("version"))
        else:
            entries[(role, str(notes.get("path")))] = str(_sha256(descriptor))
    return entries
