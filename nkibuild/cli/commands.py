"""Handlers of the `nkibuild` subcommands; each returns an exit code."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild.errors import UsageError
from nkibuild.quantities import format_size
from nkibuild.text import printable

if TYPE_CHECKING:
    from nkibuild.context import BuildContext, Layout
    from nkibuild.graph.report import BuildSummary
    from nkibuild.graph.snapshot import Graph
    from nkibuild.manifest.model import Manifest
    from nkibuild.plan import BuildUnit
    from nkibuild.release import ReleaseResult
    from nkibuild.session import BuildSession
    from nkibuild.settings import BuildOptions
    from nkibuild.verify import BundleUnderTest, Check

EXIT_OK, EXIT_BUILD_FAILED = 0, 1
DEFAULT_MANIFEST = "nkibuild.yaml"


def _context(
    args: argparse.Namespace, *, reads_state: bool = False, session: BuildSession | None = None
) -> BuildContext:
    """The project's context (in `session`, if given); `reads_state`: for a command that
    reads the build dir's state, which then defaults to the options its last build used
    (its toolchain)."""
    from nkibuild.context import load_context
    from nkibuild.graph.run import recorded_options

    _require_manifest(args)
    options = _build_options(args)
    build_dir, dist_dir = Path(args.build_dir), Path(args.dist_dir)
    if reads_state:
        options = replace(options, recorded=recorded_options(build_dir / "state"))
    return load_context(Path(args.manifest), build_dir, dist_dir, options, session)


def _build_options(args: argparse.Namespace) -> BuildOptions:
    from nkibuild.settings import BuildOptions

    return BuildOptions(**_given_options(args))


def _given_options(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's build options, by `BuildOptions` field."""
    return {
        "toolchain": args.toolchain,
        "compiler": args.compiler,
        "use_cache": not getattr(args, "no_cache", False),
        "cache_dir": getattr(args, "cache_dir", None),
        "remote_cache": getattr(args, "remote_cache", None),
        "cache_read_only": getattr(args, "cache_read_only", False),
        "max_compile_memory": getattr(args, "max_compile_memory", None),
        "compile_timeout": getattr(args, "compile_timeout", None),
        "compile_retries": getattr(args, "compile_retries", None),
        "retry_failed": getattr(args, "retry_failed", False),
        "executor": getattr(args, "executor", "local"),
        "ray_address": getattr(args, "ray_address", None),
    }


def _prepared_graph(args: argparse.Namespace) -> tuple[Graph, Layout, BuildSession]:
    """The build's task graph: from the last build's snapshot when nothing it was made
    from changed (the project is then loaded only if a task runs), else from the project."""
    from nkibuild.context import Layout
    from nkibuild.graph.snapshot import GraphRequest, prepared
    from nkibuild.session import BuildSession

    session = BuildSession()
    layout = Layout(Path(args.build_dir).resolve(), Path(args.dist_dir).resolve())
    options = {name: repr(value) for name, value in _given_options(args).items()}
    request = GraphRequest(
        Path(args.manifest),
        layout.state_dir,
        options,
        lambda: _context(args, session=session),
        session.compiler_versions,
    )
    return prepared(request), layout, session


def build(args: argparse.Namespace) -> int:
    graph, layout, session = _prepared_graph(args)
    from nkibuild.cli.buildreport import recorded
    from nkibuild.cli.display import PlainDisplay, RichDisplay, use_rich
    from nkibuild.graph.run import RunOptions, run_graph

    for notice in graph.toolchain.notices:
        print(f"warning: {notice}", file=sys.stderr)
    if use_rich(sys.stdout) and not args.json_summary:
        display = RichDisplay()
    else:  # with --json, stdout carries only the JSON document
        display = PlainDisplay(sys.stderr if args.json_summary else sys.stdout)
    options = RunOptions(
        selection=tuple(args.tasks),
        jobs=max(1, args.jobs),
        keep_going=args.keep_going,
    )
    try:
        with recorded("build", args.report, session.cache_stats, display) as record:
            summary = run_graph(graph, layout, session, options, record.display)
    finally:  # an interrupted build leaves no heartbeat thread or live display behind
        display.close()
    _print_failures(summary)
    for error in summary.runtime_errors:
        print(error.rstrip(), file=sys.stderr)
    if args.json_summary:
        print(json.dumps(summary.to_json(), indent=2))
    return EXIT_OK if summary.ok and not record.report_failed else EXIT_BUILD_FAILED


def explain(args: argparse.Namespace) -> int:
    """Exit 0 whether or not units would be rebuilt: it is a report, not a check."""
    from nkibuild.graph.explain import explain as explain_units

    explanations = explain_units(_context(args, reads_state=True), args.units)
    if args.json:
        print(json.dumps([e.to_json() for e in explanations], indent=2))
    else:
        print("\n".join(e.render() for e in explanations))
    return EXIT_OK


def verify(args: argparse.Namespace) -> int:
    import tempfile

    from nkibuild.toolchain import resolve_toolchain
    from nkibuild.verify import bundle_of_wheel
    from nkibuild.verify import verify as run_checks

    with tempfile.TemporaryDirectory(prefix="nkibuild-verify-") as scratch:
        if args.wheel is not None:
            bundle = bundle_of_wheel(args.wheel, Path(scratch))
        else:
            bundle = _built_bundle(args)
            if bundle is None:
                return EXIT_BUILD_FAILED
        bundle = _with_baseline(args, bundle)
        double = resolve_toolchain("fake") if args.with_double else None
        checks = run_checks(bundle, args.mode, double=double, update_baseline=args.update_baseline)
    if args.json:
        print(json.dumps([c.to_json() for c in checks], indent=2))
    else:
        _print_checks(checks, bundle.baseline)
    return EXIT_OK if all(c.ok for c in checks) else EXIT_BUILD_FAILED


def _print_failures(summary: BuildSummary) -> None:
    for failure in summary.failures:
        print(f"\n{failure.name} failed:\n{failure.detail}", file=sys.stderr)


def _with_baseline(args: argparse.Namespace, bundle: BundleUnderTest) -> BundleUnderTest:
    """The bundle with its baseline where --out says, else in the project's build dir.

    Never next to a wheel: that is often a release folder, whose contents SHA256SUMS lists.
    """
    wheel_record = f"{args.wheel.name}.verify.json" if args.wheel is not None else None
    if args.out is not None:
        baseline = args.out / (wheel_record or bundle.baseline.name)
    elif wheel_record is not None:
        baseline = Path(args.build_dir) / "state" / "verify-baselines" / wheel_record
    else:
        return bundle  # the project's own: build/state/verify-baseline.json
    baseline.parent.mkdir(parents=True, exist_ok=True)
    return replace(bundle, baseline=baseline)


def _built_bundle(args: argparse.Namespace) -> BundleUnderTest | None:
    """Bring the project's bundle up to date (an incremental build up to `bundle`)."""
    from nkibuild.cli.display import PlainDisplay
    from nkibuild.graph.run import RunOptions, run_build
    from nkibuild.verify import bundle_of_project
    from nkibuild.verify.sources import project_sources

    context = _context(args, reads_state=True)
    display = PlainDisplay(sys.stderr)
    try:
        summary = run_build(context, RunOptions(selection=("bundle",)), display)
    finally:
        display.close()
    _print_failures(summary)
    if not summary.ok:
        return None
    layout = context.layout
    # The project's kernel sources too: verify runs them on the CPU against their references.
    sources = project_sources(context.manifest, context.toolchain.python)
    return bundle_of_project(layout.bundle_dir(context.manifest), layout.state_dir, sources)


def _print_checks(checks: list[Check], baseline: Path) -> None:
    for check in checks:
        figures = check.figures
        measured = figures.get("max_abs_error")
        error = f"max abs error {measured:.3g}" if measured is not None else ""
        detail = check.skipped or figures.get("note") or error
        status = "FAILED" if not check.ok else check.status  # ok, or skipped: not a pass
        print(
            f"{check.kernel}/{check.variant} [{check.mode}]: {status}"
            + (f" ({detail})" if detail else "")
        )
        for problem in check.problems:
            print(f"    {problem}")
    failed = sum(not c.ok for c in checks)
    verdict = "all ok" if not failed else f"{failed} failed"
    skipped = sum(c.status == "skipped" for c in checks)
    verdict += f" ({skipped} skipped: nothing compared)" if skipped else ""
    print(f"{len(checks)} checks: {verdict}; baseline: {baseline}")


def release(args: argparse.Namespace) -> int:
    from nkibuild.cli.buildreport import recorded
    from nkibuild.cli.display import PlainDisplay
    from nkibuild.release import ReleaseOptions, check
    from nkibuild.release import release as run_release
    from nkibuild.release.shard import parse_shard
    from nkibuild.session import BuildSession

    options = ReleaseOptions(
        root=args.root,
        out=args.out.resolve(),
        targets=tuple(t.strip() for t in (args.targets or "").split(",") if t.strip()),
        only=tuple(args.only),
        jobs=max(1, args.jobs),
        keep_going=args.keep_going,
        allow_mixed_compilers=args.allow_mixed_compilers,
        shard=parse_shard(args.shard) if args.shard else None,
        sign=args.sign,
        build=_build_options(args),
    )
    if args.check:
        problems = check(options)
        if args.json:
            print(json.dumps({"ok": not problems, "problems": problems}, indent=2))
        else:
            for problem in problems:
                print(problem)
            print("release is up to date" if not problems else f"{len(problems)} problems")
        return EXIT_OK if not problems else EXIT_BUILD_FAILED
    # With --json, stdout carries only the JSON document; progress goes to stderr.
    display = PlainDisplay(sys.stderr if args.json else sys.stdout)
    session = BuildSession()
    try:
        with recorded("release", args.report, session.cache_stats, display) as record:
            result = run_release(options, record.display, session)
    finally:
        display.close()
    for notice in result.notices:
        print(f"warning: {notice}", file=sys.stderr)
    _print_failures(result.summary)
    if options.shard:
        code = _shard_done(result, options.shard, args.json)
        return EXIT_BUILD_FAILED if record.report_failed else code
    for refused in result.refused:
        print(f"refused: {refused}", file=sys.stderr)
    if args.json:
        from nkibuild.release.report import build_report

        print(json.dumps({**build_report(result), "out": str(options.out)}, indent=2))
    else:
        count = len(result.published)
        print(f"{count} wheel{'s' if count != 1 else ''} in {options.out}; see release-report.md")
        for written in result.provenance:
            print(f"provenance: {written}")
    return EXIT_OK if result.ok and not record.report_failed else EXIT_BUILD_FAILED


def verify_provenance(args: argparse.Namespace) -> int:
    from nkibuild.verify.provenance import check_wheel, statement_for

    checks = [check_wheel(wheel, args.statement or statement_for(wheel)) for wheel in args.wheels]
    if args.json:
        print(json.dumps([c.to_json() for c in checks], indent=2))
    else:
        for check in checks:
            print(f"{check.wheel.name}: {'ok' if check.ok else 'FAILED'} ({check.statement})")
            for line in (*check.notes, *check.problems):
                print(f"    {line}")
    return EXIT_OK if all(c.ok for c in checks) else EXIT_BUILD_FAILED


def _shard_done(result: ReleaseResult, shard: tuple[int, int], as_json: bool) -> int:
    index, count = shard
    outcomes = result.summary.outcomes
    compiled = [o.name for o in outcomes if ":" in o.name and "/compile" in o.name]
    if as_json:
        document = {"shard": {"index": index, "count": count}, "compile_units": compiled}
        print(json.dumps({**document, **result.summary.to_json()}, indent=2))
    else:
        print(f"shard {index}/{count}: {len(compiled)} compile units, NEFFs in the caches")
    return EXIT_OK if result.summary.ok else EXIT_BUILD_FAILED


def plan(args: argparse.Namespace) -> int:
    manifest, units = _checked_plan(args)
    if args.json:
        print(json.dumps([unit.to_json() for unit in units], indent=2, default=str))
        return EXIT_OK
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{manifest.package.name} {manifest.package.version}: {len(units)} build units"
    )
    for column in ("unit", "frontend", "inputs", "neuronx-cc arguments"):
        table.add_column(column)
    for unit in units:
        inputs = ", ".join(f"{t.dtype}[{','.join(map(str, t.shape))}]" for t in unit.extract.inputs)
        table.add_row(unit.name, unit.extract.frontend, inputs, " ".join(unit.compile_args()))
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return EXIT_OK


def validate(args: argparse.Namespace) -> int:
    from nkibuild.settings import resolve_settings
    from nkibuild.toolchain.nki import check_manifest, detect

    manifest, units = _checked_plan(args)
    check_manifest(manifest, detect(resolve_settings(_build_options(args), manifest).toolchain))
    kernels, units_count = len(manifest.kernels), len(units)
    print(
        f"{args.manifest}: ok ({kernels} kernel{'s' * (kernels != 1)}, "
        f"{units_count} build unit{'s' * (units_count != 1)})"
    )
    return EXIT_OK


def list_tasks(args: argparse.Namespace) -> int:
    from nkibuild.graph.snapshot import task_name
    from nkibuild.graph.tasks import task_dicts

    for task in task_dicts(_context(args, reads_state=True)):
        print(f"{task_name(task):<48} {task.get('doc', '')}")
    return EXIT_OK


def clean(args: argparse.Namespace) -> int:
    from nkibuild.cli.clean import clean as remove_outputs

    dist_dir = Path(args.dist_dir) if args.all else None
    for line in remove_outputs(Path(args.build_dir), dist_dir, Path(args.manifest)):
        print(line)
    return EXIT_OK


def doctor(args: argparse.Namespace) -> int:
    from nkibuild.cli.doctor import run

    return run(args.json, args.toolchain)


def cache(args: argparse.Namespace) -> int:
    """With --json: one JSON document on stdout; the action's own lines (what it removed
    or found corrupt) go to stderr, so that a script reads stdout as JSON."""
    from nkibuild.cli.cachejson import state

    if not args.json:
        return _cache_action(args)[0]
    with contextlib.redirect_stdout(sys.stderr):
        code, usage = _cache_action(args)
    document = state(args, usage)
    print(json.dumps({"action": args.action, "ok": code == 0, **document}, indent=2))
    return code


def _cache_action(args: argparse.Namespace) -> tuple[int, tuple[int, int]]:
    """Run the cache action; its exit code and the local cache's (entries, bytes) after it."""
    from nkibuild.cache import UNFINISHED_AFTER_S, LocalCache
    from nkibuild.cache.trust import trust_from_environment
    from nkibuild.settings import default_cache_dir

    store = LocalCache(args.cache_dir or default_cache_dir(), trust=trust_from_environment())
    if args.action == "prune" and args.max_size is None and args.max_age is None:
        raise UsageError("cache prune needs --max-size and/or --max-age")
    problems: list[str] = []
    removed = []
    if args.action == "verify":
        problems = store.verify()
        for problem in problems:
            print(problem if "left in place" in problem else f"corrupt, discarded: {problem}")
        print(f"{len(problems)} corrupt entries")
    elif args.action == "clear":
        removed = store.clear()
    elif args.action == "prune":
        max_age = args.max_age * 86400 if args.max_age is not None else None
        removed = store.prune(max_bytes=args.max_size, max_age_s=max_age)
    if removed:
        print(f"removed {len(removed)} entries ({format_size(sum(e.size for e in removed))})")
    if args.action in ("verify", "prune", "clear"):
        unfinished = store.remove_unfinished(older_than_s=UNFINISHED_AFTER_S)
        if unfinished:
            print(f"removed {unfinished} unfinished writes (from killed builds)")
    for notice in store.notices:  # things found in the cache that are not nkibuild's
        print(f"warning: {notice}", file=sys.stderr)
    for failure in store.failures:  # e.g. a read-only cache: say so, never "removed"
        print(f"error: {failure}", file=sys.stderr)
    entries = store.entries()
    usage = (len(entries), sum(e.size for e in entries))
    print(f"{store.root}: {usage[0]} entries, {format_size(usage[1])}")
    if args.action == "stats" and not args.json:  # --json prints these figures as JSON
        from nkibuild.cli.cachejson import stats_lines

        print("\n".join(stats_lines(args, usage)))
    return EXIT_BUILD_FAILED if problems or store.failures else EXIT_OK, usage


def inspect(args: argparse.Namespace) -> int:
    """Header fields, checksum, compiler, cores and I/O of a NEFF; exit 1 if corrupt."""
    from nkibuild.formats.neff import read_neff

    info = read_neff(args.neff, verify_checksum=False)
    if args.json:
        print(json.dumps(info.to_json(), indent=2))
        return EXIT_OK if info.checksum_ok else EXIT_BUILD_FAILED
    kind = (
        "PLACEHOLDER from nkibuild's toolchain double (no executable code)"
        if info.placeholder
        else "compiled"
    )

    def _dims(shape: tuple[int, ...]) -> str:
        return ",".join(map(str, shape))

    # Every string below comes from the file: escaped, so a NEFF cannot drive the
    # terminal or add lines (--json escapes them as JSON does).
    version = ".".join(map(str, info.format_version))
    subgraphs = printable(", ".join(info.subgraphs))
    cores = f"{info.num_tpb} ({len(info.subgraphs)} subgraphs: {subgraphs})"
    lines = [
        f"{printable(str(args.neff))}: NEFF, {kind}",
        f"  compiler:   neuronx-cc {printable(info.compiler_version)}",
        f"  format:     packaging {info.packaging_version}, version {version}",
        f"  build:      {printable(info.build)}",
        f"  cores:      {cores}",
        f"  checksum:   {'ok' if info.checksum_ok else 'MISMATCH (payload corrupt)'}",
        f"  payload:    {info.payload_size} bytes",
        "  inputs:",
        *(f"    {printable(t.name)}: {printable(t.dtype)}[{_dims(t.shape)}]" for t in info.inputs),
        "  outputs:",
        *(f"    {printable(t.name)}: {printable(t.dtype)}[{_dims(t.shape)}]" for t in info.outputs),
    ]
    print("\n".join(lines))
    return EXIT_OK if info.checksum_ok else EXIT_BUILD_FAILED


def init(args: argparse.Namespace) -> int:
    from nkibuild.cli.scaffold import EDITABLE_INSTALL, scaffold

    directory = Path(args.path)
    for done in scaffold(directory):
        print(done)
    cd = _cd_into(directory, args.invoked_in)
    print(f"next: {cd}nkibuild build --toolchain fake")
    print(f"install it editable (needs this environment's nkibuild): {cd}{EDITABLE_INSTALL}")
    return EXIT_OK


def _cd_into(directory: Path, invoked_in: Path) -> str:
    """`cd DIR && ` to get from where the user ran nkibuild (before -C) into `directory`."""
    target = directory.resolve()
    if target == invoked_in.resolve():
        return ""
    relative = os.path.relpath(target, invoked_in)
    # A short relative path is what the user typed; climbing out of the tree reads worse.
    shown = str(target) if relative.startswith("..") else relative
    return f"cd {shlex.quote(shown)} && "


def _checked_plan(args: argparse.Namespace) -> tuple[Manifest, tuple[BuildUnit, ...]]:
    """The manifest and its units (from the plan cache a build shares); its warnings on
    stderr, where they stay out of `plan --json`."""
    from nkibuild.manifest.advice import manifest_warnings
    from nkibuild.plan import load_plan

    _require_manifest(args)
    manifest, units = load_plan(Path(args.manifest), Path(args.build_dir) / "state")
    for warning in manifest_warnings(manifest):
        print(warning.render(), file=sys.stderr)
    return manifest, units


def _require_manifest(args: argparse.Namespace) -> None:
    """A missing manifest usually means "not in a project": say so and how to get into one."""

    manifest = Path(args.manifest)
    if manifest.exists():
        return
    if args.manifest != DEFAULT_MANIFEST:  # the user named it with -f
        raise UsageError(f"error: {manifest}: no such manifest (in {Path.cwd()})")
    command = getattr(args, "command", "build")
    raise UsageError(
        f"error: no {DEFAULT_MANIFEST} in {Path.cwd()}: this is not an nkibuild project\n"
        f"  start a project here:       nkibuild init\n"
        f"  use the project in DIR:     nkibuild -C DIR {command}\n"
        f"  use another manifest file:  nkibuild {command} -f FILE"
    )
