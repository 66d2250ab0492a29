"""What a new user sees (issue 16): honest summaries, CI heartbeats, help that matches
the docs, and messages outside a project."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES, REPO, run_nkibuild
from helpers import write_project

from nkibuild import __version__
from nkibuild.bundle import runtime
from nkibuild.cli.display import PlainDisplay, format_elapsed
from nkibuild.cli.main import EXIT_CODES, build_parser
from nkibuild.graph.report import BuildSummary

SOFTMAX = "compile:softmax/default/trn2"
HLO_ONLY = """\
format-version: 1
package: {name: ux-kernels, version: 0.1.0}
kernels:
  softmax:
    frontend: hlo
    source: kernels/softmax.hlo.pb
    inputs:
      logits: {shape: [64, 1024], dtype: float32}
"""


@pytest.fixture
def hlo_project(tmp_path: Path) -> Path:
    """A one-kernel project from the example's prebuilt HLO: builds in about a second."""
    hlo = (EXAMPLES / "kernels" / "softmax.hlo.pb").read_bytes()
    return write_project(tmp_path / "hlo", HLO_ONLY, {"kernels/softmax.hlo.pb": hlo})


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result


# --- item 4: the summary counts each origin of a NEFF apart ----------------------------


def _build_json(project: Path, env: dict[str, str]) -> tuple[dict, str]:
    command = ["build", "--json", "--toolchain", "fake"]
    result = ok(run_nkibuild(command, project, env=env))
    return json.loads(result.stdout), result.stderr


def _copy(project: Path, to: Path) -> Path:
    shutil.copytree(project, to, ignore=shutil.ignore_patterns("build", "dist"))
    return to


def test_summary_counts_compiled_build_dir_local_and_remote_apart(
    hlo_project: Path, tmp_path: Path
) -> None:
    remote = {"NKIBUILD_REMOTE_CACHE": (tmp_path / "remote").as_uri()}
    first, _ = _build_json(hlo_project, remote)
    assert first["compile_origins"] == {"compiled": 1}

    # Another machine: an empty local cache, the same remote one.
    elsewhere = {**remote, "NKIBUILD_CACHE_DIR": str(tmp_path / "other-local")}
    second, progress = _build_json(_copy(hlo_project, tmp_path / "b"), elsewhere)
    assert second["compile_origins"] == {"cache-remote": 1}
    assert second["compiles"] == {
        "compiled": 0,
        "compiled_on_ray": 0,
        "reused_from_build_dir": 0,
        "local_cache_hits": 0,
        "remote_cache_hits": 1,
    }
    assert f"done   {SOFTMAX} " in progress and "(cache-remote)" in progress
    assert progress.rstrip().endswith(
        "4 ran, 0 up to date, 0 compiled, 0 reused from build dir, "
        "0 local cache hits, 1 remote cache hits"
    )

    # The remote hit was copied into that machine's local cache.
    third_project = _copy(hlo_project, tmp_path / "c")
    third, progress = _build_json(third_project, elsewhere)
    assert third["compiles"]["local_cache_hits"] == 1 and third["compile_origins"] == {
        "cache-local": 1
    }
    assert "0 compiled, 0 reused from build dir, 1 local cache hits, 0 remote" in progress

    # Lost build state (a build killed before doit saved it): the NEFF in the build dir
    # is reused, which is not a cache hit.
    shutil.rmtree(third_project / "build" / "state")
    fourth, progress = _build_json(third_project, elsewhere)
    assert fourth["compile_origins"] == {"build-dir": 1}
    assert "0 compiled, 1 reused from build dir, 0 local cache hits, 0 remote" in progress


# --- item 5: plain output on long work -------------------------------------------------


def test_plain_output_prints_a_heartbeat_while_a_compile_runs(hlo_project: Path) -> None:
    env = {"NKIBUILD_HEARTBEAT": "1s", "NKIBUILD_FAKE_CC_CPU_SECONDS": "2.5"}
    out = ok(run_nkibuild(["build", "--toolchain", "fake"], hlo_project, env=env)).stdout
    # The compile's beats; on a loaded machine one may also land in a short later task.
    beats = [line for line in out.splitlines() if f" running {SOFTMAX} " in line]
    assert beats, out
    assert all(re.fullmatch(rf"\[1/4\] running {SOFTMAX} \([0-3]s\)", b) for b in beats), out
    # The heartbeat comes before the compile's own line and stops with the build.
    lines = out.splitlines()
    assert lines.index(beats[-1]) < next(i for i, x in enumerate(lines) if f"done   {SOFTMAX}" in x)
    assert lines[-1].startswith("4 ran, 0 up to date, 1 compiled")


def test_heartbeat_lists_the_longest_running_tasks_first_and_stops_at_finish() -> None:
    stream = io.StringIO()
    display = PlainDisplay(stream, heartbeat_s=0.05)
    display.start(3)
    display.task_started("compile:old/default/trn2")
    display.task_started("compile:new/default/trn2")
    deadline = time.monotonic() + 10
    while "running" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    display.finish(BuildSummary())
    text = stream.getvalue()
    assert re.search(
        r"^\[0/3\] running compile:old/default/trn2 \(0s\), compile:new/default/trn2 \(0s\)$",
        text,
        flags=re.MULTILINE,
    ), text
    assert text.endswith("remote cache hits\n")
    # Stopped, not merely silent so far: no heartbeat can follow the summary line.
    assert "nkibuild-heartbeat" not in [thread.name for thread in threading.enumerate()]


def test_a_bad_heartbeat_setting_is_a_usage_error(hlo_project: Path) -> None:
    result = run_nkibuild(
        ["build", "--toolchain", "fake"], hlo_project, {"NKIBUILD_HEARTBEAT": "soon"}
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "NKIBUILD_HEARTBEAT: 'soon' is not a duration such as 90s" in result.stderr


def test_elapsed_times_read_as_a_person_would_say_them() -> None:
    assert [format_elapsed(s) for s in (0.4, 59, 61, 3599, 3600, 7325)] == [
        "0s", "59s", "1m 01s", "59m 59s", "1h 00m", "2h 02m"
    ]  # fmt: skip


# --- item 6: outside a project, and init -----------------------------------------------


@pytest.mark.parametrize("command", ["build", "validate", "plan", "list", "explain"])
def test_outside_a_project_says_so_and_how_to_get_into_one(tmp_path: Path, command: str) -> None:
    result = run_nkibuild([command], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"error: no nkibuild.yaml in {tmp_path}: this is not an nkibuild project",
        "  start a project here:       nkibuild init",
        f"  use the project in DIR:     nkibuild -C DIR {command}",
        f"  use another manifest file:  nkibuild {command} -f FILE",
    ]
    assert result.stdout == ""


def test_a_missing_manifest_named_with_f_is_named(tmp_path: Path) -> None:
    result = run_nkibuild(["build", "-f", "exp.yaml"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: exp.yaml: no such manifest (in {tmp_path})"


def _ignored(repo: Path, *paths: str) -> list[str]:
    checked = subprocess.run(
        ["git", "check-ignore", *paths], cwd=repo, capture_output=True, text=True, check=False
    )
    return checked.stdout.splitlines()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_init_into_a_directory_says_how_to_get_there_and_ignores_the_outputs(
    tmp_path: Path,
) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    result = ok(run_nkibuild(["init", "kernels/my proj"], tmp_path))
    assert result.stdout.splitlines() == [
        "created kernels/my proj/nkibuild.yaml",
        "created kernels/my proj/kernels/kernels.py",
        "created kernels/my proj/kernels/reference.py",
        "created kernels/my proj/pyproject.toml",
        "created kernels/my proj/.gitignore",
        "next: cd 'kernels/my proj' && nkibuild build --toolchain fake",
        "install it editable (needs this environment's nkibuild): cd 'kernels/my proj' && "
        "python -m pip install -e . --no-build-isolation -C toolchain=fake",
    ]
    paths = ["kernels/my proj/build/x", "kernels/my proj/dist/y.whl", "kernels/my proj/kernels/x"]
    assert _ignored(tmp_path, *paths) == paths[:2]


def test_init_with_dash_C_names_the_directory_from_where_the_user_is(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    result = ok(run_nkibuild(["-C", "repo", "init", "sub"], tmp_path))
    assert result.stdout.splitlines()[-2] == "next: cd repo/sub && nkibuild build --toolchain fake"
    (tmp_path / "here").mkdir()
    here = ok(run_nkibuild(["init"], tmp_path / "here"))
    assert here.stdout.splitlines()[-2] == "next: nkibuild build --toolchain fake"


def test_init_appends_to_an_existing_gitignore(tmp_path: Path) -> None:
    (tmp_path / ".gitignore").write_text("*.pyc\nbuild/")
    result = ok(run_nkibuild(["init"], tmp_path))
    assert "updated .gitignore" in result.stdout.splitlines()
    lines = (tmp_path / ".gitignore").read_text().splitlines()
    assert lines == [
        "*.pyc",
        "build/",
        "# nkibuild's outputs (nkibuild clean removes them), and Python's bytecode",
        "/dist/",
        "__pycache__/",
    ]


# --- item 7: help and docs agree -------------------------------------------------------


def cli_commands() -> list[str]:
    """The subcommands the argparse parser defines, in its order."""
    parser = build_parser()
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(subparsers.choices)


def test_readme_command_table_lists_exactly_the_cli_commands() -> None:
    rows = re.findall(r"^\| `nkibuild ([a-z-]+)\b", (REPO / "README.md").read_text(), re.M)
    assert sorted(rows) == sorted(cli_commands())


def test_cli_doc_command_table_lists_exactly_the_cli_commands_each_with_a_section() -> None:
    text = (REPO / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| \[`([a-z-]+)`\]\(#nkibuild-([a-z-]+)\) \|", text, re.M)
    assert [name for name, _ in rows] == cli_commands()  # in --help's order
    assert all(name == anchor for name, anchor in rows)
    sections = re.findall(r"^## `nkibuild ([a-z-]+)`", text, re.M)
    assert sorted(sections) == sorted(cli_commands())


def test_help_readme_and_cli_doc_give_the_same_exit_codes(tmp_path: Path) -> None:
    shown = ok(run_nkibuild(["--help"], tmp_path)).stdout
    assert " ".join(EXIT_CODES.split()) in " ".join(shown.split())
    assert EXIT_CODES in (REPO / "README.md").read_text()
    table = (REPO / "docs" / "cli.md").read_text().split("## Exit codes")[1].split("\n## ")[0]
    codes = re.findall(r"^\| (\d+) \|", table, re.M)
    assert codes == re.findall(r"\b(\d+) [a-z]", EXIT_CODES.removeprefix("Exit codes: "))


# --- item 8: small things --------------------------------------------------------------


def kernel_of_a_bundle(monkeypatch: pytest.MonkeyPatch) -> runtime.Kernel:
    """A bundle kernel with one variant, a placeholder NEFF for trn2 and a reference."""
    tensor = {"name": "x", "dtype": "float32", "shape": [4]}
    info = {
        "inputs": [{"name": "x", "dtype": "float32"}],
        "variants": {"default": {"inputs": [tensor]}},
        "constants": [],
        "neffs": {"trn2": {"default": {"placeholder": True, "lnc": 2}}},
        "frontend": "jax",
        "reference": {"module": "ref", "function": "double"},
        "source": None,
    }
    monkeypatch.setattr(runtime, "_document", lambda package: {"kernels": {"double": info}})
    monkeypatch.setattr(runtime, "_shipped_function", lambda package, where: lambda x: 2 * x)
    monkeypatch.setattr(runtime, "PRODUCT_NAME_FILE", "/nonexistent/product_name")
    for variable in (runtime.TARGET_ENV, runtime.MODE_ENV):
        monkeypatch.delenv(variable, raising=False)
    return runtime.Kernel("acme", "double")


def test_a_mode_that_fails_is_not_announced(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    kernel = kernel_of_a_bundle(monkeypatch)
    x = np.ones(4, dtype=np.float32)
    with caplog.at_level(logging.INFO, logger="nkibuild.bundle"):
        with pytest.raises(runtime.KernelError, match="cannot tell the Trainium target"):
            kernel(x, mode="neuron")
        assert caplog.messages == []  # not "runs in neuron mode on the Neuron device"
        assert kernel.last_mode is None
        assert (kernel(x, mode="reference") == 2 * x).all()
    assert caplog.messages == [
        "acme.double runs in reference mode on the CPU: requested (argument)"
    ]


def test_doctor_shows_the_caches_and_the_extras(tmp_path: Path) -> None:
    env = {
        "NKIBUILD_CACHE_DIR": str(tmp_path / "neffs"),
        "NKIBUILD_REMOTE_CACHE": "s3://key:secret@bucket/prefix?token=t",
    }
    text = ok(run_nkibuild(["doctor"], tmp_path, env=env)).stdout
    lines = text.splitlines()
    assert (
        f"local NEFF cache: {tmp_path / 'neffs'} (from NKIBUILD_CACHE_DIR, not created yet)"
        in lines
    )
    assert "remote NEFF cache: s3://bucket/prefix (from NKIBUILD_REMOTE_CACHE)" in lines
    assert "secret" not in text
    for extra, module in (("remote", "fsspec"), ("ray", "ray")):
        (line,) = [x for x in lines if x.startswith(f"extra [{extra}]: ")]
        installed = importlib.util.find_spec(module) is not None
        assert line.startswith(f"extra [{extra}]: {'installed' if installed else 'not installed'}")

    document = json.loads(ok(run_nkibuild(["doctor", "--json"], tmp_path, env=env)).stdout)
    assert document["caches"]["local"] == {
        "path": str(tmp_path / "neffs"),
        "from": "NKIBUILD_CACHE_DIR",
        "exists": False,
    }
    assert document["caches"]["remote"]["url"] == "s3://bucket/prefix"
    assert document["extras"]["ray"]["installed"] == (importlib.util.find_spec("ray") is not None)
    assert document["nkibuild"] == __version__ and "neuronx_cc" in document


def test_doctor_says_how_to_install_a_missing_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from nkibuild.cli import doctor
    from nkibuild.toolchain import doctor as toolchain_doctor

    real = toolchain_doctor._version
    monkeypatch.setattr(
        toolchain_doctor, "_version", lambda m, d: None if m == "ray" else real(m, d)
    )
    lines = doctor.render(doctor.report())
    assert (
        "extra [ray]: not installed (ray missing) — needed for compiles on a Ray cluster "
        "(--executor ray): pip install 'nkibuild[ray]'"
    ) in lines


def release_root(tmp_path: Path) -> Path:
    hlo = (EXAMPLES / "kernels" / "softmax.hlo.pb").read_bytes()
    write_project(tmp_path / "repo" / "k", HLO_ONLY, {"kernels/softmax.hlo.pb": hlo})
    return tmp_path / "repo"


def test_release_json_prints_only_the_report_on_stdout(tmp_path: Path) -> None:
    root = release_root(tmp_path)
    command = ["release", ".", "--out", "out", "--toolchain", "fake", "--json"]
    result = ok(run_nkibuild(command, root))
    document = json.loads(result.stdout)
    assert document == {
        **json.loads((root / "out" / "release-report.json").read_text()),
        "out": str(root / "out"),
    }
    assert document["ok"] and document["published"] == ["ux_kernels-0.1.0-py3-none-any.whl"]
    assert document["totals"]["compiled"] == 1 and document["totals"]["local_cache_hits"] == 0
    assert "ux-kernels/compile:softmax/default/trn2" in result.stderr  # progress on stderr

    check = run_nkibuild([*command, "--check"], root)
    assert check.returncode == 0 and json.loads(check.stdout) == {"ok": True, "problems": []}


def run_with_stdout_closed(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run the CLI with the reading end of its stdout closed at once (as `| head -0`)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "nkibuild", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "CI": "true"},
        text=True,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read()
    return process.wait(timeout=120), stderr


def test_a_closed_stdout_stops_a_report_quietly_and_a_build_still_finishes(
    hlo_project: Path,
) -> None:
    code, stderr = run_with_stdout_closed(["doctor"], hlo_project)
    assert (code, stderr) == (141, "")
    code, stderr = run_with_stdout_closed(["build", "--toolchain", "fake"], hlo_project)
    assert (code, stderr) == (0, "")
    assert (hlo_project / "dist" / "ux_kernels-0.1.0-py3-none-any.whl").is_file()


def test_cache_json_prints_only_the_document_on_stdout(
    hlo_project: Path, isolated_cache: Path
) -> None:
    ok(run_nkibuild(["build", "--toolchain", "fake"], hlo_project))
    stats = json.loads(ok(run_nkibuild(["cache", "stats", "--json"], hlo_project)).stdout)
    (neff,) = isolated_cache.glob("neff/*/*/model.neff")
    assert stats["action"] == "stats" and stats["ok"] is True
    assert stats["root"] == str(isolated_cache) and stats["entries"] == 1
    assert stats["bytes"] >= neff.stat().st_size
    cleared = ok(run_nkibuild(["cache", "clear", "--json"], hlo_project))
    emptied = {**stats["tiers"]["local"], "entries": 0, "bytes": 0}
    assert json.loads(cleared.stdout) == {
        **stats,
        "action": "clear",
        "entries": 0,
        "bytes": 0,
        "tiers": {**stats["tiers"], "local": emptied},  # clearing keeps the hit counts
    }
    assert "removed 1 entries" in cleared.stderr


def test_verify_of_a_wheel_keeps_its_baseline_out_of_the_wheels_folder(tmp_path: Path) -> None:
    manifest = HLO_ONLY.replace(
        "    source: kernels/softmax.hlo.pb\n",
        "    source: kernels/softmax.hlo.pb\n    reference: kernels/reference.py:softmax\n",
    )
    kernels = EXAMPLES / "kernels"
    project = write_project(
        tmp_path / "p",
        manifest,
        {
            "kernels/softmax.hlo.pb": (kernels / "softmax.hlo.pb").read_bytes(),
            "kernels/reference.py": (kernels / "reference.py").read_text(),
        },
    )
    ok(run_nkibuild(["build", "--toolchain", "fake"], project))
    release = tmp_path / "release"
    release.mkdir()
    wheel = shutil.copy(project / "dist" / "ux_kernels-0.1.0-py3-none-any.whl", release)
    record = "ux_kernels-0.1.0-py3-none-any.whl.verify.json"

    default = ok(run_nkibuild(["verify", str(wheel)], project)).stdout
    assert default.rstrip().endswith(f"baseline: build/state/verify-baselines/{record}")
    assert (project / "build/state/verify-baselines" / record).is_file()
    out = ok(run_nkibuild(["verify", str(wheel), "--out", str(tmp_path / "v")], project)).stdout
    assert out.rstrip().endswith(f"baseline: {tmp_path / 'v' / record}")
    assert (tmp_path / "v" / record).is_file()
    assert sorted(p.name for p in release.iterdir()) == ["ux_kernels-0.1.0-py3-none-any.whl"]


def test_ctrl_c_while_the_command_line_is_parsed_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nkibuild.cli import main as cli_main

    def interrupted() -> argparse.ArgumentParser:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_main, "build_parser", interrupted)
    assert cli_main.main(["build"]) == 130
    assert capsys.readouterr().err == "interrupted\n"
