"""`neuronx-cc --version` asked in the background while the manifest loads: the answer
is the resolved compiler's, never a guess's or a stale one, and failures stay clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project

from nkibuild.context import BuildContext, load_context
from nkibuild.errors import NkibuildError, ToolchainError
from nkibuild.session import BuildSession
from nkibuild.settings import BuildOptions
from nkibuild.toolchain import (
    cancel_unanswered,
    compiler_environment,
    resolve_toolchain,
    start_version_query,
)


def write_compiler(path: Path, version_body: str) -> Path:
    """An executable `neuronx-cc` whose `--version` runs `version_body` (sh); one that
    exists is replaced (a new file renamed over it, as an install does)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = path.with_name(path.name + ".new")
    new.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then\n{version_body}\nfi\nexit 2\n')
    new.chmod(0o755)
    new.replace(path)
    return path


def counting_compiler(path: Path, version: str, calls: Path) -> Path:
    """A compiler that appends a line to `calls` each time it is asked its version."""
    return write_compiler(
        path, f"echo asked >> {calls}\necho 'NeuronX Compiler version {version}'\nexit 0"
    )


def sleeping_compiler(path: Path) -> Path:
    """A compiler whose `--version` sleeps a minute."""
    return write_compiler(path, "exec sleep 60")


def queries_started(monkeypatch: pytest.MonkeyPatch, compiler: Path) -> list[subprocess.Popen]:
    """The processes started from now on that run `compiler`, as they are started."""
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def recorded(args: Sequence[str], *more: Any, **options: Any) -> subprocess.Popen:
        process = real(args, *more, **options)
        if str(compiler) in args:
            started.append(process)
        return process

    monkeypatch.setattr(subprocess, "Popen", recorded)
    return started


def load_project(project: Path, options: BuildOptions, session: BuildSession) -> BuildContext:
    return load_context(
        project / "nkibuild.yaml", project / "build", project / "dist", options, session
    )


def wait_for(condition: object, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_compiler_is_asked_its_version_once(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    compiler = counting_compiler(tmp_path / "bin/neuronx-cc", "2.5.0.0+abc", calls)
    memo: dict = {}
    start_version_query("neuron", compiler, memo)
    toolchain = resolve_toolchain("neuron", compiler, memo)
    assert toolchain.compiler_version == "2.5.0.0+abc"
    assert calls.read_text() == "asked\n"  # joined, not asked again
    # The next build (a new session's memo) asks again: no answer outlives a build.
    memo.clear()
    start_version_query("neuron", compiler, memo)
    assert resolve_toolchain("neuron", compiler, memo).compiler_version == "2.5.0.0+abc"
    assert calls.read_text() == "asked\nasked\n"


def test_a_compiler_replaced_after_the_query_started_gets_its_new_version(
    tmp_path: Path,
) -> None:
    calls = tmp_path / "calls"
    compiler = counting_compiler(tmp_path / "bin/neuronx-cc", "1.0.0.0", calls)
    memo: dict = {}
    start_version_query("neuron", compiler, memo)
    wait_for(lambda: calls.exists())  # the old compiler is answering 1.0.0.0
    write_compiler(compiler, "echo 'NeuronX Compiler version 2.0.0.0 (newer)'\nexit 0")
    assert resolve_toolchain("neuron", compiler, memo).compiler_version == "2.0.0.0"
    cancel_unanswered(memo)
    assert [query.version() for query in memo.values()] == ["2.0.0.0"]


def test_a_compiler_upgraded_behind_its_wrapper_between_builds_recompiles(
    tmp_path: Path,
) -> None:
    """The wrapper's stat never changes; the SDK behind it does. The second build asks
    again, recompiles, and files the NEFF under the new compiler's key."""
    project = softmax_project(tmp_path / "p", softmax_manifest(defaults="{targets: [trn2]}"))
    answer = tmp_path / "version"
    wrapper = write_compiler(tmp_path / "bin/neuronx-cc", f"cat {answer}\nexit 0")
    wrapper.write_text(
        wrapper.read_text().replace(
            "exit 2", f'exec {sys.executable} -m nkibuild.toolchain_double.fake_neuronxcc "$@"'
        )
    )
    before = wrapper.stat()
    args = ["build", "--toolchain", "neuron", "--compiler", str(wrapper)]
    key_file = project / "build/compile/softmax/default/trn2/key.json"
    for version in ("1.0.0.0", "1.1.0.0"):
        answer.write_text(f"NeuronX Compiler version {version}\n")
        result = run_nkibuild(args, project)
        assert result.returncode == 0, result.stderr
        assert json.loads(key_file.read_text())["compiler_version"] == version
    assert (wrapper.stat().st_mtime_ns, wrapper.stat().st_ctime_ns) == (
        before.st_mtime_ns,
        before.st_ctime_ns,
    )
    assert not (project / "build/state/toolchain.json").exists()  # no version kept


def test_a_version_query_that_fails_while_the_manifest_loads_is_a_clean_error(
    tmp_path: Path,
) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest(defaults="{targets: [trn2]}"))
    compiler = write_compiler(tmp_path / "bin/neuronx-cc", "echo 'segfault in banner'\nexit 3")
    result = run_nkibuild(["build", "--toolchain", "neuron", "--compiler", str(compiler)], project)
    assert result.returncode != 0
    assert (
        f"{compiler} --version printed no 'NeuronX Compiler version <X>' line (exit 3): "
        "segfault in banner"
    ) in result.stderr
    assert "Traceback" not in result.stderr


def test_a_failed_query_is_not_remembered(tmp_path: Path) -> None:
    compiler = write_compiler(tmp_path / "bin/neuronx-cc", "exit 1")
    memo: dict = {}
    start_version_query("neuron", compiler, memo)
    with pytest.raises(ToolchainError, match="printed no 'NeuronX Compiler version <X>' line"):
        resolve_toolchain("neuron", compiler, memo)
    assert memo == {}
    write_compiler(compiler, "echo 'NeuronX Compiler version 3.0'\nexit 0")  # fixed
    assert resolve_toolchain("neuron", compiler, memo).compiler_version == "3.0"


def test_a_compiler_that_cannot_start_is_reported_when_resolved(tmp_path: Path) -> None:
    compiler = tmp_path / "bin/neuronx-cc"
    compiler.parent.mkdir()
    compiler.write_text("#!/no/such/interpreter\n")
    compiler.chmod(0o755)
    memo: dict = {}
    start_version_query("neuron", compiler, memo)  # raises nothing itself
    with pytest.raises(
        ToolchainError,
        match=r"could not run /.*/bin/neuronx-cc --version: \[Errno 2\] No such file",
    ):
        resolve_toolchain("neuron", compiler, memo)


def test_a_guess_the_manifest_overrides_is_stopped_and_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Nothing on the command line or in the environment names a compiler: the guess is
    # the one on PATH, but the manifest names another.
    on_path = sleeping_compiler(tmp_path / "path/neuronx-cc")
    started_guess = queries_started(monkeypatch, on_path)
    monkeypatch.setenv("PATH", f"{on_path.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("NKIBUILD_NEURONX_CC", raising=False)
    monkeypatch.delenv("NKIBUILD_TOOLCHAIN", raising=False)
    named = counting_compiler(tmp_path / "named/neuronx-cc", "4.0.0.0", tmp_path / "calls")
    top = f"compiler: {{path: {named}}}"
    project = softmax_project(tmp_path / "p", softmax_manifest(top=top))
    session = BuildSession()
    started = time.monotonic()
    context = load_project(project, BuildOptions(toolchain="neuron"), session)
    assert time.monotonic() - started < 30  # the guess was not waited for
    assert context.toolchain.compiler_command == (str(named),)
    assert context.toolchain.compiler_version == "4.0.0.0"
    assert [query.command for query in session.compiler_versions.values()] == [(str(named),)]
    assert_stopped(started_guess)


def test_a_manifest_in_error_stops_the_query_started_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiler = sleeping_compiler(tmp_path / "bin/neuronx-cc")
    started = queries_started(monkeypatch, compiler)
    project = softmax_project(tmp_path / "p", softmax_manifest(top="bogus-key: 1"))
    session = BuildSession()
    with pytest.raises(NkibuildError, match="bogus-key"):
        load_project(project, BuildOptions(toolchain="neuron", compiler=compiler), session)
    assert session.compiler_versions == {}
    assert_stopped(started)


def assert_stopped(started: list[subprocess.Popen]) -> None:
    """The one query started, which would sleep a minute, was killed and reaped."""
    (query,) = started
    wait_for(lambda: query.returncode is not None)  # reaped by nkibuild, not by this test
    assert query.returncode == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(query.pid, 0)


def test_the_compiler_inherits_the_environment_when_it_has_the_flags_already(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NEURON_CC_FLAGS", "--verbose")
    monkeypatch.setenv("OTHER", "kept")
    assert compiler_environment("--verbose") is None  # inherited as it is
    stripped = compiler_environment("")
    assert stripped is not None
    assert "NEURON_CC_FLAGS" not in stripped
    assert stripped["OTHER"] == "kept"
    monkeypatch.setenv("NEURON_CC_FLAGS", "")  # set but empty: unset for the compiler
    emptied = compiler_environment("")
    assert emptied is not None
    assert "NEURON_CC_FLAGS" not in emptied
    monkeypatch.delenv("NEURON_CC_FLAGS")
    assert compiler_environment("") is None
    assert (compiler_environment("-O1") or {}).get("NEURON_CC_FLAGS") == "-O1"
