"""The toolchain boundary: the only code that runs neuronx-cc or imports a frontend.

`resolve_toolchain` decides once per build which compiler runs and which
version it is; every later stage receives the resulting `Toolchain` value.
"""

from __future__ import annotations

import glob
import itertools
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from nkibuild import interrupts
from nkibuild.errors import ToolchainError, UsageError
from nkibuild.text import printable
from nkibuild.toolchain.nki import NkiFrontend, detect, has_nkipy_tracer

TOOLCHAIN_MODES = ("auto", "neuron", "fake")
COMPILER_NAME = "neuronx-cc"
VERSION_PREFIX = "NeuronX Compiler version "

NO_COMPILER_HELP = (
    "neuronx-cc was not found on PATH, in this Python's virtualenv or in a Neuron SDK\n"
    "  virtualenv (/opt/aws_neuronx_venv_*).\n"
    "  To build real NEFFs, install the Neuron compiler into this environment, e.g.\n"
    "    python -m pip install neuronx-cc \\\n"
    "      --extra-index-url https://pip.repos.neuron.amazonaws.com\n"
    "  or activate the Neuron SDK virtualenv. To try nkibuild without it, pass\n"
    "  --toolchain fake: nkibuild's toolchain double writes placeholder NEFFs\n"
    "  (labelled as such, never loadable on a device)."
)

VERSION_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Toolchain:
    """The toolchain chosen for a build, resolved once; everything that differs between
    the real Neuron tools and nkibuild's double is a value here, so no later stage
    needs to know which one it got."""

    name: str  # "neuron" or "double": shown to people and part of extraction configs
    compiler_command: tuple[str, ...]  # argv prefix that runs neuronx-cc
    compiler_version: str
    python: str  # interpreter that runs frontend workers
    neuron_cc_flags: str  # NEURON_CC_FLAGS: neuronx-cc appends it, so it changes output
    worker_path: tuple[str, ...] = ()  # prepended to frontend workers' PYTHONPATH
    runtime_path: tuple[str, ...] = ()  # prepended to sys.path where bundles run (spike)
    label: str = ""  # how `describe` qualifies the compiler
    notices: tuple[str, ...] = ()  # said once at the start of a build
    nki: NkiFrontend = field(default_factory=NkiFrontend)  # the NKI and route of nki kernels

    def describe(self) -> str:
        return f"neuronx-cc {self.compiler_version}{self.label}"

    def compiler_environment(self) -> dict[str, str] | None:
        """The environment neuronx-cc runs in: NEURON_CC_FLAGS exactly as keys record it."""
        return compiler_environment(self.neuron_cc_flags)


def compiler_environment(flags: str) -> dict[str, str] | None:
    """This process's environment with NEURON_CC_FLAGS set to `flags` (unset if empty),
    for `subprocess`'s `env`; None when it already is so: the child inherits it as it
    is, without a copy of the environment per compile."""
    if os.environ.get("NEURON_CC_FLAGS") == (flags or None):
        return None
    env = {k: v for k, v in os.environ.items() if k != "NEURON_CC_FLAGS"}
    return {**env, "NEURON_CC_FLAGS": flags} if flags else env


# The Deep Learning AMIs put the Neuron SDK in virtualenvs such as
# /opt/aws_neuronx_venv_pytorch_2_9; newest-looking name first.
SDK_VENV_GLOB = "/opt/aws_neuronx_venv_*/bin"


def find_compiler(configured: Path | None = None) -> Path | None:
    """The real neuronx-cc: as configured, else PATH, this Python's virtualenv, the SDK's."""
    if configured is not None:
        return _configured_compiler(configured)
    venvs = os.pathsep.join(map(str, _venv_bin_dirs()))
    found = shutil.which(COMPILER_NAME) or shutil.which(COMPILER_NAME, path=venvs)
    return Path(found) if found else None


_SET_BY = "(set by --compiler, NKIBUILD_NEURONX_CC or `compiler: path:` in the manifest)"


def _configured_compiler(configured: Path) -> Path:
    """The configured compiler, `~` and `~user` expanded (a shell leaves `--compiler=~/x`
    and a quoted variable alone)."""
    try:
        expanded = configured.expanduser()
    except RuntimeError:  # `~nosuchuser/...`, or `~` without HOME
        raise ToolchainError(
            f"the configured neuronx-cc {printable(str(configured))}: its '~' names no user "
            f"with a home directory {_SET_BY}"
        ) from None
    if not (expanded.is_file() and os.access(expanded, os.X_OK)):
        raise ToolchainError(
            f"the configured neuronx-cc {printable(str(expanded))} is not an executable file "
            f"{_SET_BY}"
        )
    return expanded


def _venv_bin_dirs() -> list[Path]:
    dirs = [Path(sys.executable).parent]
    if os.environ.get("VIRTUAL_ENV"):
        dirs.append(Path(os.environ["VIRTUAL_ENV"]) / "bin")
    return dirs + sorted(map(Path, glob.glob(SDK_VENV_GLOB)), reverse=True)


def resolve_toolchain(
    mode: str, compiler: Path | None = None, memo: VersionMemo | None = None
) -> Toolchain:
    """Pick the toolchain for `mode`; never falls back from auto/neuron to the double.

    `memo` holds the version queries already started in this session (a release
    resolves one toolchain per project; `start_version_query` may have started one).
    """
    if mode not in TOOLCHAIN_MODES:
        raise UsageError(f"unknown toolchain {mode!r}; choose one of {', '.join(TOOLCHAIN_MODES)}")
    if mode == "fake":
        return _double()
    found = _required_compiler(mode, compiler)
    flags, notices = neuron_cc_flags()
    return Toolchain(
        name="neuron",
        compiler_command=(str(found),),
        compiler_version=_asked_version(found, memo),
        python=sys.executable,
        neuron_cc_flags=flags,
        notices=notices,
        nki=detect(mode),
    )


def _required_compiler(mode: str, compiler: Path | None) -> Path:
    found = find_compiler(compiler)
    if found is None:
        raise ToolchainError(f"toolchain {mode!r}: {NO_COMPILER_HELP}")
    return found


def start_version_query(mode: str, compiler: Path | None, memo: VersionMemo) -> None:
    """Start `--version` of the compiler `mode` and `compiler` pick, in the background:
    a real neuronx-cc takes seconds to answer, and the caller loads the manifest meanwhile.

    A guess made before the final settings are known: `resolve_toolchain` joins it only
    if it resolves the same command with the same stamp, and `cancel_unanswered` ends it
    otherwise. What would fail here is left for `resolve_toolchain` to report.
    """
    if mode not in TOOLCHAIN_MODES or mode == "fake":  # the double answers in-process
        return
    try:
        key = _memo_key(_required_compiler(mode, compiler))
    except (ToolchainError, OSError):
        return
    if key not in memo:
        memo[key] = VersionQuery(key[0])


def cancel_unanswered(memo: VersionMemo) -> None:
    """End (and forget) the queries `start_version_query` guessed and nobody joined."""
    for key, query in list(memo.items()):
        if not query.answered:
            query.cancel()
            del memo[key]


def neuron_cc_flags() -> tuple[str, tuple[str, ...]]:
    """NEURON_CC_FLAGS as it enters cache keys, and notices about what was left out.

    `--cache_dir` names torch-neuronx's compile cache: it would override the
    NEURON_COMPILE_CACHE_URL an extraction worker sets (graphs would land elsewhere)
    and changes no NEFF, so workers never see it and keys never include it.
    """
    flags = os.environ.get("NEURON_CC_FLAGS", "")
    try:
        kept, dropped = without_cache_dir(flags)
    except ValueError as error:  # an unbalanced quote, a trailing backslash
        raise ToolchainError(
            f"NEURON_CC_FLAGS={printable(flags)!r} cannot be split into words as a shell "
            f"would ({error}); neuronx-cc reads it that way"
        ) from None
    if not dropped:
        return flags, ()
    notice = (
        f"NEURON_CC_FLAGS sets {' '.join(dropped)}: ignored for extraction (each frontend "
        "worker dumps graphs into its own directory) and not part of cache keys"
    )
    return kept, (notice,)


def without_cache_dir(flags: str) -> tuple[str, list[str]]:
    """`flags` without `--cache_dir X` / `--cache_dir=X`, and the words removed."""
    kept: list[str] = []
    dropped: list[str] = []
    words = iter(shlex.split(flags))
    for word in words:
        if word == "--cache_dir":
            dropped += [word, *itertools.islice(words, 1)]
        else:
            (dropped if word.startswith("--cache_dir=") else kept).append(word)
    return (shlex.join(kept) if dropped else flags), dropped


def _double() -> Toolchain:
    """nkibuild's toolchain double: its compiler, its frontends and spike on the paths.

    It stands in only for what cannot run here: the real nkipy tracer runs on a CPU,
    so where it is installed, workers use it rather than the double's.
    """
    from nkibuild import toolchain_double

    flags, notices = neuron_cc_flags()
    worker_path = [str(toolchain_double.FAKES_DIR)]
    if not has_nkipy_tracer():
        worker_path.append(str(toolchain_double.FAKE_NKIPY_DIR))

    return Toolchain(
        name="double",
        compiler_command=toolchain_double.COMPILER_COMMAND,
        compiler_version=toolchain_double.compiler_version(),  # asked in-process: no start-up
        python=sys.executable,
        neuron_cc_flags=flags,
        worker_path=tuple(worker_path),
        runtime_path=(str(toolchain_double.FAKE_RUNTIME_DIR),),
        label=toolchain_double.LABEL,
        notices=notices,
        nki=detect("fake"),
    )


def _asked_version(launcher: Path, memo: VersionMemo | None) -> str:
    """`neuronx-cc --version`, asked in every build before anything is compiled or
    published: a launcher's stat says nothing of an SDK upgraded behind a wrapper script,
    and a version kept from another build would file NEFFs under another compiler's key.
    Within a build, `memo` answers (a query started while the manifest loaded)."""
    memo = {} if memo is None else memo
    key = _memo_key(launcher)
    query = memo.get(key)
    if query is None:
        query = memo[key] = VersionQuery(key[0])
    try:
        return query.version()
    except ToolchainError:
        del memo[key]  # a failure is not remembered: the next resolve asks again
        raise


def read_compiler_version(command: tuple[str, ...]) -> str:
    """The version token of `neuronx-cc --version`'s `NeuronX Compiler version <X>` line."""
    return VersionQuery(command).version()


class VersionQuery:
    """One `neuronx-cc --version`, started when made and joined by `version()`.

    Only the version token is kept: real output may continue the line (AMI, region),
    and what follows would otherwise enter every cache key. Asked without
    NEURON_CC_FLAGS, which the compiler would append to `--version` too and which
    cannot change its answer.
    """

    def __init__(self, command: tuple[str, ...]) -> None:
        self.command = command
        self._outcome: str | ToolchainError | None = None  # the version, or why there is none
        self._process: subprocess.Popen[str] | None = None
        try:
            with interrupts.deferred():  # started, then the process is in hand
                self._process = subprocess.Popen(
                    [*command, "--version"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=compiler_environment(""),
                )
        except OSError as error:
            self._outcome = ToolchainError(f"could not run {command[-1]} --version: {error}")
        except KeyboardInterrupt:
            self.cancel()
            raise

    @property
    def answered(self) -> bool:
        return isinstance(self._outcome, str)

    def version(self) -> str:
        """The version; waits for the compiler's answer the first time."""
        if self._outcome is None:
            try:
                self._outcome = self._read_answer()
            except ToolchainError as failure:
                self._outcome = failure
        if isinstance(self._outcome, ToolchainError):
            raise self._outcome
        return self._outcome

    def cancel(self) -> None:
        """Stop a query nobody will join; the process is reaped and its pipes closed."""
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            self._process.communicate()

    def _read_answer(self) -> str:
        assert self._process is not None  # else __init__ recorded the failure
        try:
            stdout, stderr = self._process.communicate(timeout=VERSION_TIMEOUT_S)
        except subprocess.TimeoutExpired as error:
            self.cancel()
            raise ToolchainError(f"could not run {self.command[-1]} --version: {error}") from None
        except BaseException:  # interrupted: the query does not outlive the build
            self.cancel()
            raise
        for line in (stdout + stderr).splitlines():
            version = parse_version_line(line)
            if version is not None:
                return version
        raise ToolchainError(
            f"{' '.join(self.command)} --version printed no '{VERSION_PREFIX}<X>' line "
            f"(exit {self._process.returncode}): {(stdout + stderr).strip()[-500:]}"
        )


VersionMemo = dict[tuple[tuple[str, ...], tuple[int, ...]], VersionQuery]


def parse_version_line(line: str) -> str | None:
    """`2.23.6484.0+3b612583` from `NeuronX Compiler version 2.23.6484.0+3b612583 ...`."""
    if not line.startswith(VERSION_PREFIX):
        return None
    words = line[len(VERSION_PREFIX) :].split()
    return words[0] if words else None


def _memo_key(launcher: Path) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The launcher's command, and what changes when it is replaced or the neuronx-cc
    package beside it is upgraded in place: a query started for the old one (while the
    manifest loaded) is not joined. Never kept across builds: a wrapper's stat says
    nothing of the SDK."""
    stamp: list[int] = []
    for item in [launcher, *_installed_package_records(launcher)]:
        info = item.stat()
        stamp += [info.st_mtime_ns, info.st_size]
    return (str(launcher),), tuple(stamp)


def _installed_package_records(launcher: Path) -> list[Path]:
    """The neuronx-cc distribution's RECORD in the launcher's virtualenv, if there is one."""
    environment = launcher.resolve().parent.parent
    pattern = "lib/python*/site-packages/neuronx_cc-*.dist-info/RECORD"
    return sorted(environment.glob(pattern))
