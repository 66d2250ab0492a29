"""Release stage: every project of a monorepo, every target, one task graph, one dist/.

All manifests are validated before anything builds (every problem reported at
once). The projects' task graphs are joined into one, namespaced by distribution,
so `-j` spreads across projects and identical kernels compile once (equal cache
keys wait for each other, then hit the cache). Wheels are built into a staging
directory and published to OUT only if OUT does not already hold a different wheel
of the same name and version; then SHA256SUMS and the reports are written, and the
provenance statement of the published wheels (release/provenance.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from nkibuild import fsutil
from nkibuild.bundle import distributions, split_targets
from nkibuild.bundle.wheel import wheel_file_name
from nkibuild.cache.key import file_sha256
from nkibuild.confine import read_regular
from nkibuild.context import BuildContext
from nkibuild.errors import ManifestError, UsageError
from nkibuild.graph.report import BuildSummary, Display
from nkibuild.graph.run import RunOptions, pending_tasks, run_task_graph
from nkibuild.graph.state import BACKEND_NAME
from nkibuild.graph.tasks import task_dicts
from nkibuild.session import BuildSession, SessionDirs
from nkibuild.settings import BuildOptions

RELEASE_DIR = "build/nkibuild-release"  # under the root: state and staged wheels
SUMS_FILE = "SHA256SUMS"


@dataclass(frozen=True)
class ReleaseOptions:
    root: Path
    out: Path
    targets: tuple[str, ...] = ()  # empty: every target of every project
    only: tuple[str, ...] = ()  # distribution names; empty: every project
    jobs: int = 1
    keep_going: bool = False
    allow_mixed_compilers: bool = False
    shard: tuple[int, int] | None = None  # (index, count), 1-based: compile this part only
    sign: bool = False  # sign the provenance statement with sigstore
    build: BuildOptions = field(default_factory=BuildOptions)

    @property
    def release_dir(self) -> Path:
        return self.root.resolve() / RELEASE_DIR


@dataclass
class ReleaseResult:
    summary: BuildSummary
    projects: list[BuildContext]
    published: list[Path] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    provenance: list[Path] = field(default_factory=list)  # the statement, its signature
    digests: dict[str, str] = field(default_factory=dict)  # OUT's wheels' sha256, by name

    @property
    def ok(self) -> bool:
        return self.summary.ok and not self.refused

    @property
    def notices(self) -> list[str]:
        """The projects' toolchain notices, each once (they share the environment)."""
        return sorted({notice for p in self.projects for notice in p.toolchain.notices})


def load_projects(
    options: ReleaseOptions, session: BuildSession | None = None
) -> list[BuildContext]:
    """Every selected project, validated together: one ManifestError lists all problems.

    All projects run in one `session` (one memory budget for the machine; equal cache
    keys compile once); its frontend workers are still per project."""
    from nkibuild.context import load_context
    from nkibuild.release.discover import discover

    manifests = discover(options.root)
    if not manifests:
        raise UsageError(f"no nkibuild.yaml under {options.root}")
    session = session if session is not None else BuildSession()
    contexts, problems = [], []
    staging = options.release_dir / "dist"
    for manifest in manifests:
        try:
            contexts.append(
                load_context(manifest, manifest.parent / "build", staging, options.build, session)
            )
        except ManifestError as error:
            problems += error.diagnostics
    if problems:
        raise ManifestError(problems)
    return _selected(contexts, options)


def _selected(contexts: list[BuildContext], options: ReleaseOptions) -> list[BuildContext]:
    names = {c.manifest.package.name for c in contexts}
    unknown = sorted(set(options.only) - names)
    if unknown:
        raise UsageError(
            f"--only {', '.join(unknown)}: no such project (found {', '.join(sorted(names))})"
        )
    chosen = [c for c in contexts if not options.only or c.manifest.package.name in options.only]
    if not options.targets:
        return chosen
    idle = [t for t in options.targets if all(u.target != t for c in chosen for u in c.units)]
    if idle:
        raise UsageError(f"--targets {', '.join(idle)}: no selected project builds for it")
    return [_narrowed(c, options.targets) for c in chosen]


def _narrowed(project: BuildContext, targets: tuple[str, ...]) -> BuildContext:
    """The project's units for `targets` only; UsageError if one of its wheels would then
    lack NEFFs: a kernel variant none of whose targets is selected, or the split part of
    a target that is not (a release is whole or not at all)."""
    units = tuple(u for u in project.units if u.target in targets)
    kept = {(u.kernel, u.variant) for u in units}
    lacking = sorted(
        {f"{u.kernel}/{u.variant}" for u in project.units if (u.kernel, u.variant) not in kept}
    )
    lacking += [f"its {t} part" for t in split_targets(project.manifest) if t not in targets]
    if lacking:
        raise UsageError(
            f"--targets {','.join(targets)}: {project.manifest.package.name}'s wheels would "
            f"have no NEFF for {', '.join(lacking)}; select their targets too, or leave the "
            "project out (--only)"
        )
    return replace(project, units=units)


def preflight(projects: Sequence[BuildContext], options: ReleaseOptions) -> None:
    """Refuse a release that cannot be published consistently, before building anything."""
    from packaging.utils import canonicalize_name

    claimed: dict[tuple[str, str], Path] = {}  # what a wheel installs -> whose it is
    for project, package in ((p, d) for p in projects for d in distributions(p.manifest)):
        path = project.manifest.path
        for claim in (
            ("distribution", canonicalize_name(package.name)),
            ("import package", package.import_name.lower()),  # one on case-blind disks
        ):
            other = claimed.setdefault(claim, path)
            if other != path:
                raise UsageError(
                    f"two projects build the {claim[0]} {claim[1]!r}: {other} and {path}; "
                    "rename one"
                )
    _check_out_dir(projects, options.out)
    versions = {p.toolchain.compiler_version for p in projects}
    if len(versions) > 1 and not options.allow_mixed_compilers:
        raise UsageError(
            f"the projects would be compiled by different neuronx-cc versions "
            f"({', '.join(sorted(versions))}); use one compiler, or --allow-mixed-compilers"
        )


def _check_out_dir(projects: Sequence[BuildContext], out: Path) -> None:
    """A version about to be built that OUT holds already under another file name (PEP
    440: `1.0` is `1.0.0`), or under the same name but not published by an earlier release
    into OUT (not in its SHA256SUMS), came from elsewhere: refuse before building. Wheels
    an earlier release published are compared after the build instead (a rerun that
    produces the same bytes is fine; other bytes are refused then)."""
    try:
        listed = set(_sums(out))
    except OSError:
        listed = set()
    released: dict[object, list[str]] = {}
    for wheel in out.glob("*.whl"):
        released.setdefault(_release_of(wheel.name), []).append(wheel.name)
    clashes = [
        name if name == wheel.name else f"{name} (the version of {wheel.name})"
        for project in projects
        for wheel in staged_wheels(project)
        for name in released.get(_release_of(wheel.name), [])
        if name != wheel.name or name not in listed
    ]
    if clashes:
        raise UsageError(
            f"{out} already holds {', '.join(sorted(clashes))}: the same versions (PEP 440), "
            f"not published as these files by a release into it (its {SUMS_FILE}); bump "
            "them or use another --out"
        )


def _release_of(wheel_name: str) -> object:
    """(canonical name, Version) of a wheel file name: equal for equal releases."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    try:
        return parse_wheel_filename(wheel_name)[:2]
    except InvalidWheelFilename:
        return wheel_name


def _sums(out: Path) -> dict[str, str]:
    """SHA256SUMS of OUT as name -> digest, read as a bounded regular file."""
    lines = read_regular(out / SUMS_FILE, 64 << 20).decode(errors="replace").splitlines()
    return {name: digest for digest, _, name in (line.partition("  ") for line in lines)}


def release(options: ReleaseOptions, display: Display, session: BuildSession) -> ReleaseResult:
    from nkibuild.release import provenance
    from nkibuild.release.report import write_reports
    from nkibuild.release.shard import assign, shard_units

    began = provenance.start(options.root)  # the revision the build starts from
    projects = load_projects(options, session)
    preflight(projects, options)
    identity = provenance.signing_identity() if options.sign and not options.shard else None
    dirs = [
        SessionDirs(options.release_dir, swept=(options.out,)),
        *(SessionDirs(p.layout.build_dir, swept=(p.layout.dist_dir,)) for p in projects),
    ]
    # Settings come from the command line and environment, which every project shares.
    memory = projects[0].settings.max_compile_memory
    with session.running(dirs, max_compile_memory=memory, jobs=options.jobs):
        dicts, config = release_graph(projects, options)
        selection: tuple[str, ...] = ()
        if options.shard:  # this shard's compile tasks (doit adds the extractions they need)
            index, count = options.shard
            shards = assign(shard_units(projects, projects[0].settings.cache.local_dir), count)
            selection = tuple(unit.task for unit in shards[index - 1])
        run = RunOptions(jobs=options.jobs, keep_going=options.keep_going, selection=selection)
        summary = (
            run_task_graph(session, dicts, config, run, display)
            if selection or not options.shard
            else BuildSummary()
        )
        result = ReleaseResult(summary, projects)
        if options.shard:  # a shard's NEFFs went to the caches; the final job packages
            return result
        try:
            if summary.ok:
                _publish(result, options)
            if result.ok:  # the provenance statement of what was published, signed if asked
                statement = provenance.write_statement(result, options, began)
                result.provenance.append(statement)
                if identity is not None:
                    result.provenance.append(provenance.sign_statement(statement, identity))
        finally:  # also when signing failed: the wheels and the statement are out
            write_reports(result, options.out)
    return result


def release_graph(
    projects: Sequence[BuildContext], options: ReleaseOptions
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All projects' tasks as one graph, and the doit configuration that runs it."""
    # Each project's tasks renamed `<distribution>/<task>`, so projects never clash.
    dicts = [
        {**task, "basename": f"{p.manifest.package.name}/{task['basename']}"}
        for p in projects
        for task in task_dicts(p)
    ]
    config = {
        "dep_file": str(options.release_dir / "state" / "doit-state.json"),
        "backend": BACKEND_NAME,
        "default_tasks": [f"{p.manifest.package.name}/wheel" for p in projects],
    }
    return dicts, config


def _publish(result: ReleaseResult, options: ReleaseOptions) -> None:
    """Copy staged wheels to OUT; a different wheel already there under the same name
    (the same version with other contents) is never replaced. SHA256SUMS is written
    first, listing what is about to be copied: a release stopped in between leaves no
    wheel in OUT that SHA256SUMS does not list, so its rerun takes them for its own
    (preflight) and completes."""
    staged = {w.name: (w, file_sha256(w)) for p in result.projects for w in staged_wheels(p)}
    options.out.mkdir(parents=True, exist_ok=True)
    present = _digests(options.out)
    # Every wheel in OUT, and the staged ones not there yet: OUT once they are copied.
    sums = result.digests = {**{name: digest for name, (_, digest) in staged.items()}, **present}
    text = "".join(f"{sums[name]}  {name}\n" for name in sorted(sums))
    fsutil.atomic_write_text(options.out / SUMS_FILE, text)
    for name, (wheel, digest) in staged.items():
        published = options.out / name
        if name not in present:
            fsutil.atomic_copy(wheel, published)
        elif present[name] != digest:
            result.refused.append(
                f"{published} already exists with other contents: this version was "
                "released before; bump the version"
            )
            continue
        result.published.append(published)


def _digests(out: Path) -> dict[str, str]:
    return {wheel.name: file_sha256(wheel) for wheel in out.glob("*.whl")}


def check(options: ReleaseOptions) -> list[str]:
    """Why the release is not up to date, or []: doit would run nothing, and OUT holds
    exactly the wheels the last release built, with matching SHA256SUMS. Builds nothing."""
    projects = load_projects(options)
    preflight(projects, options)
    problems = [f"{task} would run" for task in pending_tasks(*release_graph(projects, options))]
    present = _digests(options.out)
    for staged in (wheel for project in projects for wheel in staged_wheels(project)):
        if staged.name not in present:
            problems.append(f"{options.out / staged.name} is missing")
        elif not staged.exists() or present[staged.name] != file_sha256(staged):
            problems.append(f"{options.out / staged.name} differs from what the build produced")
    return problems + _sums_problems(options.out, present) + _provenance_problems(options.out)


def staged_wheels(project: BuildContext) -> list[Path]:
    """Where the project's wheels are staged (the main one, then one per split target)."""
    return [project.layout.dist_dir / wheel_file_name(p) for p in distributions(project.manifest)]


def _sums_problems(out: Path, present: dict[str, str]) -> list[str]:
    sums = out / SUMS_FILE
    if not sums.exists():
        return [f"{sums} is missing"]
    listed = _sums(out)
    problems = [f"{name} is not in {SUMS_FILE}" for name in sorted(present.keys() - listed)]
    problems += [
        f"{name} is listed in {SUMS_FILE} but missing" for name in sorted(listed.keys() - present)
    ]
    problems += [
        f"{name} does not match its sha256 in {SUMS_FILE}"
        for name in sorted(present.keys() & listed)
        if present[name] != listed[name]
    ]
    return problems


def _provenance_problems(out: Path) -> list[str]:
    """Each wheel in OUT must be one a release into OUT built: a subject, by name and
    digest, of its latest statement or of an earlier one kept there, and as that
    statement describes it."""
    from nkibuild.verify.provenance import STATEMENT_FILE, check_wheel, read_statement
    from nkibuild.verify.provenance import statement_for as statement_of

    if not (out / STATEMENT_FILE).exists():
        return [f"{out / STATEMENT_FILE} is missing"]
    problems = []
    for wheel in sorted(out.glob("*.whl")):
        check = check_wheel(wheel, statement_of(wheel))
        problems += [f"{check.statement}: {problem}" for problem in check.problems]
        if check.ok and wheel.name not in {
            s.get("name") for s in read_statement(check.statement)["subject"]
        }:
            problems.append(
                f"{check.statement}: {wheel.name}: sha256 is a subject's, "
                "but no release into OUT published it under that name"
            )
    return problems
