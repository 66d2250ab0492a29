"""`nkibuild` command line; exit codes in EXIT_CODES (also in README.md and docs/cli.md)."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from nkibuild import __version__
from nkibuild.confine import UnreadableFile
from nkibuild.errors import NkibuildError, UsageError, storage_error
from nkibuild.quantities import parse_duration, parse_retries, parse_size

T = TypeVar("T")

EXIT_USAGE = 2
MAX_AGE_DAYS = 36500  # `cache prune --max-age`: a century
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE, as the shell reports a C tool the pipe killed
# tests/test_cli_ux.py checks that README.md says exactly this.
EXIT_CODES = (
    "Exit codes: 0 ok, 1 build failure or failed check, 2 usage, manifest or toolchain "
    "error (nothing was built), 130 interrupted, 141 output closed (e.g. by `| head`)."
)


def main(argv: Sequence[str] | None = None) -> int:
    try:  # Ctrl-C as early as the command line's parse is still "interrupted", exit 130
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.invoked_in = Path.cwd()  # before -C: what `init` tells the user to `cd` to
    if getattr(args, "cache_key_file", None) is not None:
        args.cache_key_file = args.cache_key_file.absolute()  # before -C, as the user typed it
    if args.directory:
        try:
            os.chdir(args.directory)
        except OSError as error:
            parser.error(f"-C {args.directory}: {error.strerror}")
    try:
        _export_cache_trust(args)
        code = int(args.handler(args))
        sys.stdout.flush()  # a closed pipe shows here, where it is handled, not at exit
        return code
    except NkibuildError as error:
        print(error.render(), file=sys.stderr)
        return error.exit_code
    except BrokenPipeError:
        return _output_closed()
    except UnreadableFile as error:  # a FIFO, a device, an oversize file
        print(UsageError(f"cannot read {error}").render(), file=sys.stderr)
        return UsageError.exit_code
    except OSError as error:
        refused = storage_error(error)
        if refused is None:
            raise
        print(refused.render(), file=sys.stderr)
        return refused.exit_code


def _export_cache_trust(args: argparse.Namespace) -> None:
    """Cache entry signing flags go to the environment, where every opener of the cache
    chain (compile, explain, Ray workers on this machine) reads them; checked here so a
    bad key stops the command at once (exit 2), before anything is built."""
    key_file = getattr(args, "cache_key_file", None)
    required = getattr(args, "require_signed_cache", False)
    if key_file is None and not required:
        return
    from nkibuild.cache.trust import ENV_KEY, ENV_KEY_FILE, ENV_REQUIRE, trust_from_environment

    if key_file is not None:
        os.environ[ENV_KEY_FILE] = str(key_file)
        os.environ.pop(ENV_KEY, None)  # the command line wins over the environment
    if required:
        os.environ[ENV_REQUIRE] = "1"
    trust_from_environment()


def _output_closed() -> int:
    """Whoever read our output went away (`nkibuild plan | head`): stop quietly, as a C
    tool killed by SIGPIPE would. The streams go to /dev/null so that the interpreter's
    last flush of them cannot print a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            os.dup2(devnull, stream.fileno())
    return EXIT_OUTPUT_CLOSED


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nkibuild",
        description="Declarative builds of AWS Neuron kernels: nkibuild.yaml -> NEFFs -> wheels.",
        epilog=EXIT_CODES,
    )
    parser.add_argument("--version", action="version", version=f"nkibuild {__version__}")
    parser.add_argument("-C", dest="directory", metavar="DIR", help="run as if started in DIR")
    parser.set_defaults(handler=lambda _args: parser.print_help() or EXIT_USAGE)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    project = _project_options()
    from nkibuild.cli import commands as cmd

    _add(
        commands,
        "build",
        cmd.build,
        "build NEFFs and the wheel (incremental)",
        project,
        _build_options(),
    )
    plan = _add(commands, "plan", cmd.plan, "show the resolved build matrix", project)
    plan.add_argument("--json", action="store_true", help="print the units as JSON")
    explain = _add(
        commands,
        "explain",
        cmd.explain,
        "say what the next build does with each unit and why",
        project,
        _toolchain_option(),
        _cache_options(),
    )
    explain.add_argument("units", nargs="*", metavar="UNIT", help="units or kernels (default: all)")
    explain.add_argument("--json", action="store_true", help="print the explanations as JSON")
    verify = _add(
        commands,
        "verify",
        cmd.verify,
        "run the bundle's kernels on sample inputs and compare with their references",
        project,
        _toolchain_option(),
        _cache_options(),
    )
    verify.add_argument(
        "wheel", nargs="?", type=Path, help="a bundle wheel [default: build the project's bundle]"
    )
    verify.add_argument(
        "--mode", choices=("auto", "neuron", "simulate", "reference"), default="auto",
        help="how the kernels run (compared with reference mode) [default: auto]",
    )  # fmt: skip
    verify.add_argument(
        "--with-double", action="store_true",
        help="also run neuron mode through nkibuild's fake spike, for every target",
    )  # fmt: skip
    verify.add_argument(
        "--update-baseline", action="store_true", help="record these results as the baseline"
    )
    verify.add_argument("--json", action="store_true", help="print the checks as JSON")
    verify.add_argument(
        "--out", type=Path, metavar="DIR",
        help="where the baseline is kept [default: BUILD_DIR/state/, also for a WHEEL]",
    )  # fmt: skip
    release = _add(
        commands,
        "release",
        cmd.release,
        "build and publish every project under ROOT for every target (monorepo CI)",
        _toolchain_option(),
        _compile_options(),
        _cache_options(),
    )
    release.add_argument("root", nargs="?", default=".", type=Path, help="[default: .]")
    release.add_argument("--out", type=Path, default=Path("dist"), help="[default: dist]")
    release.add_argument(
        "--targets", help="comma-separated targets to build (default: each project's own)"
    )
    release.add_argument("--only", nargs="+", default=[], metavar="NAME",
                         help="only these distributions")  # fmt: skip
    release.add_argument("-j", "--jobs", type=int, default=1, help="parallel tasks [default: 1]")
    release.add_argument(
        "--shard", metavar="I/N",
        help="compile only the I-th of N balanced parts (into the caches); package nothing",
    )  # fmt: skip
    release.add_argument("-k", "--keep-going", action="store_true",
                         help="build every project a failure does not block")  # fmt: skip
    release.add_argument(
        "--check", action="store_true",
        help="build nothing; exit 1 unless everything is up to date and OUT matches",
    )  # fmt: skip
    release.add_argument(
        "--allow-mixed-compilers", action="store_true",
        help="allow projects compiled by different neuronx-cc versions",
    )  # fmt: skip
    release.add_argument(
        "--json", action="store_true",
        help="print the release report (or --check's problems, a shard's summary) as JSON",
    )  # fmt: skip
    _report_option(release)
    release.add_argument(
        "--sign", action="store_true",
        help="sign the provenance statement with sigstore (needs nkibuild[sign] and an OIDC "
        "identity, e.g. a CI job's)",
    )  # fmt: skip
    provenance = _add(
        commands,
        "verify-provenance",
        cmd.verify_provenance,
        "check wheels against a release's provenance statement",
    )
    provenance.add_argument(
        "wheels", nargs="+", type=Path, metavar="WHEEL", help="wheels a release published"
    )
    provenance.add_argument(
        "--statement", type=Path, metavar="FILE",
        help="the statement [default: provenance.intoto.json next to each wheel]",
    )  # fmt: skip
    provenance.add_argument("--json", action="store_true", help="print the checks as JSON")
    _add(
        commands, "validate", cmd.validate, "check the manifest and report every problem",
        project, _toolchain_option(),
    )  # fmt: skip
    _add(commands, "list", cmd.list_tasks, "list the build's tasks", project, _toolchain_option())
    clean = _add(commands, "clean", cmd.clean, "remove the build directory", project)
    clean.add_argument("--all", action="store_true", help="also remove the dist directory")
    doctor = _add(
        commands, "doctor", cmd.doctor, "show which toolchain pieces and caches are found", project
    )
    doctor.add_argument("--json", action="store_true", help="print the report as JSON")
    doctor.add_argument(
        "--toolchain", choices=("auto", "neuron", "fake"),
        help="report for this toolchain: with fake, what the toolchain double stands in for "
        "is not missing [default: env NKIBUILD_TOOLCHAIN, else auto]",
    )  # fmt: skip
    cache = _add(commands, "cache", cmd.cache, "show, verify or trim the local NEFF cache")
    cache.add_argument("action", choices=("stats", "verify", "prune", "clear"))
    cache.add_argument(
        "--json", action="store_true",
        help="print the cache's location, entries, size and each tier's hits, misses "
        "and errors over the last builds after the action as JSON",
    )  # fmt: skip
    cache.add_argument("--cache-dir", type=Path, help="[default: NKIBUILD_CACHE_DIR or user cache]")
    cache.add_argument(
        "--remote-cache", metavar="URL",
        help="stats: also count the entries and bytes of this remote cache (lists its prefix)",
    )  # fmt: skip
    cache.add_argument(
        "--max-size", type=_size, metavar="SIZE",
        help="prune: keep at most this much, e.g. 20G, 500M",
    )  # fmt: skip
    cache.add_argument(
        "--max-age", type=_days, metavar="DAYS", help="prune: drop entries unused this long"
    )
    _signing_options(cache)
    inspect = _add(commands, "inspect", cmd.inspect, "show what a NEFF file holds")
    inspect.add_argument("neff", type=Path, help="a .neff file")
    inspect.add_argument("--json", action="store_true", help="print the fields as JSON")
    init = _add(commands, "init", cmd.init, "scaffold a manifest and an example kernel")
    init.add_argument("path", nargs="?", default=".", help="directory to create the project in")
    return parser


def _add(
    commands: argparse._SubParsersAction,
    name: str,
    handler: object,
    help_text: str,
    *parents: argparse.ArgumentParser,
) -> argparse.ArgumentParser:
    sub = commands.add_parser(name, help=help_text, description=help_text, parents=list(parents))
    sub.set_defaults(handler=handler, command=name)
    return sub


def _project_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "-f", "--file", dest="manifest", default="nkibuild.yaml", metavar="MANIFEST",
        help="manifest path [default: nkibuild.yaml]",
    )  # fmt: skip
    options.add_argument(
        "--build-dir", default="build", help="intermediate outputs [default: build]"
    )
    options.add_argument("--dist-dir", default="dist", help="finished wheels [default: dist]")
    return options


def _toolchain_option() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--toolchain",
        choices=("auto", "neuron", "fake"),
        help="auto: the real Neuron toolchain, error if absent; fake: nkibuild's toolchain double "
        "(placeholder NEFFs) [default: env NKIBUILD_TOOLCHAIN, else auto]",
    )
    options.add_argument(
        "--compiler", type=Path, metavar="PATH",
        help="the neuronx-cc to run [default: env NKIBUILD_NEURONX_CC, manifest `compiler: "
        "path:`, PATH, this virtualenv, /opt/aws_neuronx_venv_*]",
    )  # fmt: skip
    return options


def _checked(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type that reports the parser's own message (argparse would say only
    "invalid value")."""

    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return convert


_size = _checked(parse_size)
_duration = _checked(parse_duration)
_retries = _checked(parse_retries)


def _days(text: str) -> float:
    """`cache prune --max-age`: NaN would prune nothing and a negative age everything,
    so only a finite number of days from 0 to 100 years is taken."""
    try:
        days = float(text)
    except ValueError:
        days = math.nan
    if not (math.isfinite(days) and 0 <= days <= MAX_AGE_DAYS):
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r} is not a number of days from 0 to {MAX_AGE_DAYS}"
        )
    return days


def _compile_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--executor", choices=("local", "ray"), default="local",
        help="where compiles run: this machine, or a Ray cluster [default: local]",
    )  # fmt: skip
    options.add_argument(
        "--ray-address", metavar="ADDR",
        help="the Ray cluster for --executor ray [default: a local Ray instance]",
    )  # fmt: skip
    options.add_argument(
        "--max-compile-memory", type=_size, metavar="SIZE",
        help="memory budget of concurrent compiles, e.g. 64G [default: env "
        "NKIBUILD_MAX_COMPILE_MEMORY, else only -j limits them]",
    )  # fmt: skip
    options.add_argument(
        "--compile-timeout", type=_duration, metavar="DURATION",
        help="stop a compile after this long, e.g. 2h, unless its kernel sets "
        "compile-timeout [default: env NKIBUILD_COMPILE_TIMEOUT, else none]",
    )  # fmt: skip
    options.add_argument(
        "--compile-retries", type=_retries, metavar="N",
        help="retry a compile the OOM killer took, or that hit neuronx-cc's internal error "
        "(exit 70), up to N times [default: env NKIBUILD_COMPILE_RETRIES, else 1]",
    )  # fmt: skip
    options.add_argument(
        "--retry-failed", action="store_true",
        help="compile units whose compile a cache records as failed, instead of reporting "
        "that failure at once [default: env NKIBUILD_RETRY_FAILED]",
    )  # fmt: skip
    return options


def _cache_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--cache-dir", type=Path, help="local NEFF cache [default: env NKIBUILD_CACHE_DIR, "
        "else the user cache dir]",
    )  # fmt: skip
    options.add_argument(
        "--remote-cache", metavar="URL", help="shared remote cache, e.g. s3://bucket/prefix "
        "[default: env NKIBUILD_REMOTE_CACHE, manifest `cache: remote:`]",
    )  # fmt: skip
    options.add_argument(
        "--cache-read-only", action="store_true",
        help="use the caches but never write to them (CI consumers)",
    )  # fmt: skip
    _signing_options(options)
    return options


def _signing_options(options: argparse.ArgumentParser) -> None:
    options.add_argument(
        "--cache-key-file", type=Path, metavar="FILE",
        help="sign cache entries with the shared secret in FILE and check signed ones "
        "[default: env NKIBUILD_CACHE_HMAC_KEY_FILE or NKIBUILD_CACHE_HMAC_KEY]",
    )  # fmt: skip
    options.add_argument(
        "--require-signed-cache", action="store_true",
        help="refuse cache entries not signed with that secret "
        "[default: env NKIBUILD_REQUIRE_SIGNED_CACHE]",
    )  # fmt: skip


def _build_options() -> argparse.ArgumentParser:
    options = argparse.ArgumentParser(
        add_help=False, parents=[_toolchain_option(), _compile_options(), _cache_options()]
    )
    options.add_argument("tasks", nargs="*", metavar="TASK", help="tasks or globs (default: all)")
    options.add_argument("-j", "--jobs", type=int, default=1, help="parallel tasks [default: 1]")
    options.add_argument("-k", "--keep-going", action="store_true", help="continue after failures")
    options.add_argument("--no-cache", action="store_true", help="do not use the NEFF caches")
    options.add_argument("--json", dest="json_summary", action="store_true",
                         help="print the build summary as JSON")  # fmt: skip
    _report_option(options)
    return options


def _report_option(options: argparse.ArgumentParser) -> None:
    options.add_argument(
        "--report", type=Path, metavar="FILE",
        help="write a JSON report of the build to FILE (also of a failed or interrupted "
        "build): per compile unit where its NEFF came from, compile time, peak memory",
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
