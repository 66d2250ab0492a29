"""A fake `neuronx-cc` for machines without the Neuron SDK: nkibuild's toolchain double.

Run as `python -m nkibuild.toolchain_double.fake_neuronxcc ARGS`. It takes the real
compiler's command line and option rules (NEURON_CC_FLAGS appended, lnc defaults and
NCC_EARG001) and writes a *placeholder* NEFF with the HLO module's signature and a record
(`nkibuild_fake_compile.json`) of the argv and the input's SHA-256, so the output depends
deterministically on the input and the flags (docs/toolchain-double.md).

Exit codes: 0 success, 1 bad options or a failed compile, 70 unreadable HLO (as the real
compiler), 2 a misconfigured fault variable. The `NKIBUILD_FAKE_CC_*` variables make it
misbehave on purpose (exit, crash, hang, write garbage, burn CPU, hold memory) or count
and time its runs, for tests: docs/toolchain-double.md lists them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from nkibuild.toolchain_double import compiler_version

FAKE_COMPILER_VERSION = compiler_version()
VERSION_LINE = f"NeuronX Compiler version {FAKE_COMPILER_VERSION}"
# Each target's default logical NeuronCore config, also the largest it supports.
DEFAULT_LNC = {"inf2": 1, "trn1": 1, "trn1n": 1, "trn2": 2, "trn3": 2}
FAULTS = ("exit1", "exit70", "kill9", "hang", "empty", "garbage", "hugelog")
EXIT_HLO_ERROR = 70
HUGE_LOG_BYTES = 5 * 2**20
RECORD_MEMBER = "nkibuild_fake_compile.json"


class _UsageError(Exception):
    """A command-line error (exit 1, as the real compiler's argument errors)."""


class _CompileError(Exception):
    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # Raise instead of exiting so main() returns an int like the rest of its paths.
        raise _UsageError(message)


def main(argv: list[str] | None = None) -> int:
    argv = [*(sys.argv[1:] if argv is None else argv)]
    argv += shlex.split(os.environ.get("NEURON_CC_FLAGS", ""))
    if "compile" in argv:
        _append_line("NKIBUILD_FAKE_CC_COUNTER", shlex.join(argv))
    try:
        args, unknown = _parser().parse_known_args(argv)
        _check_unknown(unknown)
    except _UsageError as exc:
        print(f"neuronx-cc: error: {exc}", file=sys.stderr)
        return 1
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    if args.version:
        print(VERSION_LINE)
        return 0
    if args.command != "compile":
        print("neuronx-cc: error: expected --version or the compile command", file=sys.stderr)
        return 1
    return _compile(args, argv)


def _process_start_time() -> float:
    """When this process started (epoch seconds), from /proc; now where /proc is absent."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat: start time, clock ticks after boot
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.time()
    # Age from two clocks that both count from boot (btime is only whole seconds).
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def _append_line(variable: str, line: str) -> None:
    path = os.environ.get(variable)
    if path:
        # One append-mode write per line: concurrent compiles never interleave their lines.
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


# --- command line ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="neuronx-cc", description="nkibuild's fake neuronx-cc")
    parser.add_argument("--version", action="store_true")
    commands = parser.add_subparsers(dest="command")
    compile_ = commands.add_parser("compile")
    compile_.add_argument("input")
    compile_.add_argument("--framework", required=True)
    compile_.add_argument("--target", required=True, choices=tuple(DEFAULT_LNC))
    compile_.add_argument("--output", "-o", default="file.neff")
    compile_.add_argument("--lnc", "--logical-nc-config", dest="lnc", type=int, choices=(1, 2))
    compile_.add_argument("-O", "--optlevel", type=int, choices=(1, 2, 3), default=2)
    compile_.add_argument("--auto-cast", choices=("none", "matmult", "all"), default="none")
    compile_.add_argument(
        "--auto-cast-type", choices=("bf16", "fp16", "tf32", "fp8_e4m3"), default="bf16"
    )
    compile_.add_argument("--enable-fast-loading-neuron-binaries", action="store_true")
    compile_.add_argument("--model-type")
    compile_.add_argument("--pipeline", nargs="+")
    compile_.add_argument("--logfile", default="log-neuron-cc.txt")
    compile_.add_argument("--verbose", action="store_true")
    compile_.add_argument("--internal-tensorizer-opt-level", type=int)
    return parser


def _check_unknown(unknown: list[str]) -> None:
    """Tolerate unknown `--internal-*` flags (`--internal-x=v`, or `--internal-x v` at the end)."""
    flag_may_take_value = False
    for arg in unknown:
        if arg.startswith("--internal-"):
            flag_may_take_value = "=" not in arg
        elif flag_may_take_value and not arg.startswith("-"):
            flag_may_take_value = False
        else:
            raise _UsageError(f"unrecognized arguments: {arg}")


# --- compile ---------------------------------------------------------------------------


class _Log:
    """The compile log; errors also go to stderr, as the real compiler prints them."""

    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close)

    def info(self, message: str) -> None:
        self._file.write(f"INFO: {message}\n")

    def error(self, message: str) -> None:
        self._file.write(f"ERROR: {message}\n")
        self._file.flush()
        print(f"ERROR: {message}", file=sys.stderr)

    def close(self) -> None:
        self._file.close()


def _compile(args: argparse.Namespace, argv: list[str]) -> int:
    try:
        log = _Log(args.logfile)
    except OSError as exc:
        print(f"ERROR: cannot write log file {args.logfile}: {exc.strerror}", file=sys.stderr)
        return 1
    log.info(f"{VERSION_LINE}: this is nkibuild's toolchain double, not the real neuronx-cc")
    log.info(f"command: {shlex.join(['neuronx-cc', *argv])}")
    started = _process_start_time()
    try:
        lnc = _check_options(args)
        ballast = _use_resources()
        fault = _fault(args)
        if fault:
            return _inject(fault, args, log)
        _write_placeholder(args, argv, lnc, log)
        del ballast  # held until here: the memory must stay in use for the whole compile
        log.info("Compiler status PASS")
        _append_line("NKIBUILD_FAKE_CC_TIMES", f"{started:.6f} {time.time():.6f}")
    except _CompileError as exc:
        log.error(str(exc))
        return exc.exit_code
    finally:
        log.close()
    print("Compiler status PASS")
    return 0


def _check_options(args: argparse.Namespace) -> int:
    """Apply the real compiler's option rules; return the logical NeuronCore count."""
    if args.framework != "XLA":
        raise _CompileError(f"--framework {args.framework} is not supported (expected XLA)")
    lnc = DEFAULT_LNC[args.target] if args.lnc is None else args.lnc
    if lnc > DEFAULT_LNC[args.target]:
        raise _CompileError(
            f"[NCC_EARG001] --logical-nc-config 2 is not supported on target {args.target}; "
            f"{args.target} supports only logical NeuronCore config 1"
        )
    return lnc


def _env_number(name: str) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else 0.0
    except ValueError:
        raise _CompileError(f"{name}={raw!r} is not a number", exit_code=2) from None


def _use_resources() -> bytearray:
    """Burn CPU and hold memory as the environment asks; return the memory to keep."""
    deadline = time.perf_counter() + _env_number("NKIBUILD_FAKE_CC_CPU_SECONDS")
    while time.perf_counter() < deadline:
        pass
    ballast = bytearray(int(_env_number("NKIBUILD_FAKE_CC_MEMORY_MB") * 2**20))
    # bytearray() memory may be lazily mapped zero pages: write one byte per page.
    ballast[::4096] = b"\1" * len(range(0, len(ballast), 4096))
    return ballast


def _fault(args: argparse.Namespace) -> str | None:
    fault = os.environ.get("NKIBUILD_FAKE_CC_FAULT", "")
    if not fault:
        return None
    if fault not in FAULTS:
        raise _CompileError(
            f"NKIBUILD_FAKE_CC_FAULT={fault!r} is not one of {', '.join(FAULTS)}", exit_code=2
        )
    match = os.environ.get("NKIBUILD_FAKE_CC_FAULT_MATCH", "")
    # nkibuild passes paths relative to the compile's work dir, which lies in the unit's.
    paths = (os.path.abspath(args.input), os.path.abspath(args.output))
    if match and not any(match in path for path in paths):
        return None
    once = os.environ.get("NKIBUILD_FAKE_CC_FAULT_ONCE")
    if once:
        try:
            os.close(os.open(once, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        except FileExistsError:
            return None  # it fired before
    return fault


def _inject(fault: str, args: argparse.Namespace, log: _Log) -> int:
    log.info(f"NKIBUILD_FAKE_CC_FAULT={fault}: failing on purpose")
    if fault == "hugelog":
        filler = "fake tensorizer pass: nothing to see here, padding the log on purpose"
        for _ in range(HUGE_LOG_BYTES // len(filler)):
            log.info(filler)
    if fault in ("exit1", "exit70", "hugelog"):
        log.error(f"injected fault {fault}")
        return EXIT_HLO_ERROR if fault == "exit70" else 1
    if fault == "kill9":
        log.close()
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        log.close()
        while True:
            time.sleep(3600)
    # garbage: deterministic noise, long enough to look like a NEFF header but not parse as one
    noise = (hashlib.sha256(b"nkibuild fake garbage %d" % i).digest() for i in range(128))
    with open(args.output, "wb") as f:
        f.write(b"".join(noise) if fault == "garbage" else b"")
    print("Compiler status PASS")
    return 0


def _content_identity(path: str) -> str:
    """sha256 of the HLO with each file it names replaced by that file's own sha256.

    Like a compiler that reads the kernel's compiled BIR file rather than
    recording where it was, so the NEFF depends on what is compiled, not on the
    directory the artifact sits in.
    """
    from nkibuild.formats.backend_config import rewrite_paths

    def file_digest(reference: str) -> str:
        return "sha256:" + hashlib.sha256(Path(reference).read_bytes()).hexdigest()

    data = rewrite_paths(Path(path).read_bytes(), os.path.isfile, file_digest)
    return hashlib.sha256(data).hexdigest()


def _portable(argv: list[str], args: argparse.Namespace) -> list[str]:
    """argv with file paths cut to their names: the NEFF must not depend on where it was built."""
    paths = {str(p) for p in (args.input, args.output, args.logfile) if p}
    return [os.path.basename(item) if item in paths else item for item in argv]


def _write_placeholder(args: argparse.Namespace, argv: list[str], lnc: int, log: _Log) -> None:
    # Imported here so `--version` and argument errors stay fast (no protobuf import).
    from nkibuild.formats.hlo import HloFormatError, read_hlo_file
    from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

    try:
        module = read_hlo_file(args.input)
        input_sha256 = _content_identity(args.input)
    except (HloFormatError, OSError) as exc:
        raise _CompileError(f"cannot read the HLO module: {exc}", EXIT_HLO_ERROR) from None
    log.info(
        f"HLO module {module.name}: {len(module.parameters)} parameters, "
        f"{len(module.outputs())} outputs; target {args.target}, lnc {lnc}, -O{args.optlevel}"
    )
    inputs = [NeffTensor(p.name, p.shape.dtype, p.shape.dims) for p in module.parameters]
    outputs = [NeffTensor(f"output{i}", s.dtype, s.dims) for i, s in enumerate(module.outputs())]
    record = {
        "argv": _portable(argv, args),
        "input_sha256": input_sha256,
        "target": args.target,
        "lnc": lnc,
    }
    try:
        write_neff(
            args.output,
            compiler_version=FAKE_COMPILER_VERSION,
            inputs=inputs,
            outputs=outputs,
            num_tpb=lnc,
            placeholder=True,
            extra_members={RECORD_MEMBER: json.dumps(record, indent=2, sort_keys=True).encode()},
            compress=not args.enable_fast_loading_neuron_binaries,
        )
    except ValueError as exc:  # e.g. a dtype NEFFs cannot carry
        raise _CompileError(f"cannot compile {args.input}: {exc}") from None
    except OSError as exc:
        raise _CompileError(f"cannot write {args.output}: {exc.strerror}") from None
    log.info(f"wrote placeholder NEFF {args.output} (no executable code)")


if __name__ == "__main__":
    sys.exit(main())
