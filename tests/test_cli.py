"""The `nkibuild` command line, run as users run it: one subprocess per command."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_nkibuild
from helpers import failed, ok, prebuilt_project, write_project

from nkibuild import __version__

needs_jax = pytest.mark.skipif(
    importlib.util.find_spec("jax") is None, reason="the example's JAX kernels need jax"
)

EXAMPLE_UNITS = [
    "scaled_add/small/trn1",
    "scaled_add/small/trn2",
    "scaled_add/large/trn1",
    "scaled_add/large/trn2",
    "matmul_rowsum/default/trn1",
    "matmul_rowsum/default/trn2",
    "softmax/default/trn2",
]
EXAMPLE_EXTRACTS = [
    "extract:scaled_add/small",
    "extract:scaled_add/large",
    "extract:matmul_rowsum/default",
    "extract:softmax/default",
]
EXAMPLE_TASKS = [*EXAMPLE_EXTRACTS, *(f"compile:{u}" for u in EXAMPLE_UNITS), "bundle", "wheel"]
EXAMPLE_WHEEL = "acme_kernels-0.1.0-py3-none-any.whl"
SOFTMAX = "compile:softmax/default/trn2"
FAULT_ENV = {"NKIBUILD_FAKE_CC_FAULT": "exit70", "NKIBUILD_FAKE_CC_FAULT_MATCH": "softmax"}

# A one-kernel project from the example's prebuilt HLO: builds in well under a second.
HLO_ONLY = """\
format-version: 1
package:
  name: {name}
  version: 0.1.0
kernels:
  softmax:
    frontend: hlo
    source: kernels/softmax.hlo.pb
    inputs:
      logits: {{shape: [64, 1024], dtype: float32}}
"""


def hlo_only(name: str = "other-kernels") -> str:
    return HLO_ONLY.format(name=name)


def wheel_of(name: str) -> str:
    return f"{name.replace('-', '_')}-0.1.0-py3-none-any.whl"


def done_tasks(output: str) -> list[str]:
    """Tasks the plain progress display reports as done, in order."""
    return re.findall(r"^\[\s*\d+/\d+\] done\s+(\S+) ", output, flags=re.MULTILINE)


def built_files(project: Path, pattern: str) -> list[str]:
    return sorted(p.relative_to(project).as_posix() for p in project.glob(pattern))


@pytest.fixture
def hlo_project(tmp_path: Path) -> Path:
    """A project with only the prebuilt-HLO kernel (no JAX tracing)."""
    hlo = (EXAMPLES / "kernels" / "softmax.hlo.pb").read_bytes()
    return write_project(tmp_path / "hlo", hlo_only(), {"kernels/softmax.hlo.pb": hlo})


@pytest.fixture
def no_compiler_path(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has no neuronx-cc."""
    if (Path(sys.executable).parent / "neuronx-cc").exists():
        pytest.skip("neuronx-cc is installed next to this Python interpreter")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    return {"PATH": str(empty)}


@dataclass(frozen=True)
class Built:
    project: Path
    first: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The example, built once with the toolchain double; tests using it only read."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("the example's JAX kernels need jax")
    project = tmp_path_factory.mktemp("built") / "project"
    shutil.copytree(
        EXAMPLES, project, ignore=shutil.ignore_patterns("build", "dist", "__pycache__")
    )
    # Module scope runs outside the autouse `isolated_cache`: isolate by hand.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NKIBUILD_CACHE_DIR", str(tmp_path_factory.mktemp("built-cache")))
        for name in ("NEURON_CC_FLAGS", "NKIBUILD_TOOLCHAIN", "NKIBUILD_MODE"):
            env.delenv(name, raising=False)
        first = ok(run_nkibuild(["build", "--toolchain", "fake"], project))
    return Built(project, first)


# --- version, help ---------------------------------------------------------------------


def test_version(tmp_path: Path) -> None:
    result = ok(run_nkibuild(["--version"], tmp_path))
    assert result.stdout.strip() == f"nkibuild {__version__}"


def test_no_command_prints_help_and_exits_2(tmp_path: Path) -> None:
    result = failed(run_nkibuild([], tmp_path), 2)
    assert "usage: nkibuild" in result.stdout
    for command in ("build", "plan", "validate", "list", "clean", "doctor", "init"):
        assert f"    {command} " in result.stdout


# --- validate, plan --------------------------------------------------------------------


def test_validate_ok_names_the_counts(example_project: Path) -> None:
    result = ok(run_nkibuild(["validate"], example_project))
    assert result.stdout.strip() == "nkibuild.yaml: ok (3 kernels, 7 build units)"


def _break_example(project: Path) -> tuple[str, str]:
    """Two errors in the example manifest; returns their `file:line:col` positions."""
    manifest = project / "nkibuild.yaml"
    lines = manifest.read_text().splitlines(keepends=True)
    optlevel = lines.index("  optlevel: 2\n")
    lines[optlevel] = "  optlevel: 7\n"
    targets = lines.index("    targets: [trn2]\n")
    lines[targets] = "    targets: [trn9]\n"
    manifest.write_text("".join(lines))
    return (
        f"nkibuild.yaml:{optlevel + 1}:{len('  optlevel: ') + 1}",
        f"nkibuild.yaml:{targets + 1}:{len('    targets: [') + 1}",
    )


@pytest.mark.parametrize(
    "command", [["validate"], ["plan"], ["build", "--toolchain", "fake"]], ids=lambda c: c[0]
)
def test_broken_manifest_reports_every_problem_with_its_position(
    example_project: Path, command: list[str]
) -> None:
    positions = _break_example(example_project)
    result = failed(run_nkibuild(command, example_project), 2)
    assert "2 problems in the manifest" in result.stderr
    for position in positions:
        assert position in result.stderr
    assert "$.defaults.optlevel" in result.stderr
    assert not (example_project / "build" / "extract").exists()


def test_missing_manifest_is_a_usage_error(tmp_path: Path) -> None:
    result = failed(run_nkibuild(["validate"], tmp_path), 2)
    assert "nkibuild.yaml" in result.stderr


def test_plan_table_shows_every_unit(example_project: Path) -> None:
    result = ok(run_nkibuild(["plan"], example_project))
    assert "acme-kernels 0.1.0: 7 build units" in result.stdout
    for unit in EXAMPLE_UNITS:
        assert unit in result.stdout
    assert "--auto-cast matmult --auto-cast-type bf16" in result.stdout


def test_plan_json_lists_the_units_with_exact_compile_args(example_project: Path) -> None:
    units = json.loads(ok(run_nkibuild(["plan", "--json"], example_project)).stdout)
    assert [unit["name"] for unit in units] == EXAMPLE_UNITS
    by_name = {unit["name"]: unit for unit in units}
    assert by_name["matmul_rowsum/default/trn1"]["compile_args"] == [
        "--target", "trn1", "--lnc", "1", "--optlevel", "2",
        "--auto-cast", "matmult", "--auto-cast-type", "bf16",
    ]  # fmt: skip
    # overrides.trn1 sets optlevel 1 for scaled_add only.
    assert by_name["scaled_add/large/trn1"]["compile_args"] == [
        "--target", "trn1", "--lnc", "1", "--optlevel", "1", "--auto-cast", "none",
    ]  # fmt: skip
    assert by_name["softmax/default/trn2"]["extract"] == "softmax/default"


# --- list ------------------------------------------------------------------------------


def test_list_shows_every_task_in_graph_order(example_project: Path) -> None:
    result = ok(run_nkibuild(["list", "--toolchain", "fake"], example_project))
    rows = [line.split(maxsplit=1) for line in result.stdout.splitlines()]
    assert [row[0] for row in rows] == EXAMPLE_TASKS
    docs = dict(rows)
    assert docs["compile:softmax/default/trn2"] == "compile softmax/default/trn2 with neuronx-cc"
    assert docs["extract:softmax/default"] == "extract HLO from kernels/softmax.hlo.pb (hlo)"


def test_toolchain_comes_from_the_environment(example_project: Path) -> None:
    result = run_nkibuild(["list"], example_project, env={"NKIBUILD_TOOLCHAIN": "fake"})
    assert ok(result).stdout.split()[0] == EXAMPLE_TASKS[0]


# --- build -----------------------------------------------------------------------------


def test_build_runs_every_task_and_writes_the_wheel(built: Built) -> None:
    out = built.first.stdout
    assert out.rstrip().endswith(
        "13 ran, 0 up to date, 7 compiled, 0 reused from build dir, "
        "0 local cache hits, 0 remote cache hits"
    )
    assert sorted(done_tasks(out)) == sorted(EXAMPLE_TASKS)
    assert built_files(built.project, "dist/*") == [f"dist/{EXAMPLE_WHEEL}"]
    neffs = built_files(built.project, "build/compile/*/*/*/model.neff")
    assert neffs == sorted(f"build/compile/{unit}/model.neff" for unit in EXAMPLE_UNITS)


def test_second_build_runs_nothing(built: Built) -> None:
    result = ok(run_nkibuild(["build", "--toolchain", "fake"], built.project))
    assert result.stdout.strip() == (
        "0 ran, 13 up to date, 0 compiled, 0 reused from build dir, "
        "0 local cache hits, 0 remote cache hits"
    )


def test_build_json_prints_only_the_summary_on_stdout(built: Built) -> None:
    result = ok(run_nkibuild(["build", "--json", "--toolchain", "fake"], built.project))
    summary = json.loads(result.stdout)
    assert summary["ok"] is True
    assert summary["executed"] == []
    assert sorted(summary["up_to_date"]) == sorted(EXAMPLE_TASKS)
    assert summary["failed"] == {}
    assert "0 ran, 13 up to date" in result.stderr  # progress moves to stderr


def test_build_json_summary_of_a_real_run(hlo_project: Path) -> None:
    result = ok(run_nkibuild(["build", "--json", "--toolchain", "fake"], hlo_project))
    summary = json.loads(result.stdout)
    assert summary["executed"] == ["extract:softmax/default", SOFTMAX, "bundle", "wheel"]
    assert summary["compile_origins"] == {"compiled": 1}
    assert "[4/4] done   wheel" in result.stderr


@pytest.mark.parametrize("mode", ["auto", "neuron"])
@pytest.mark.parametrize("command", ["build", "list"])
def test_missing_neuronxcc_stops_before_building(
    example_project: Path, no_compiler_path: dict[str, str], mode: str, command: str
) -> None:
    result = run_nkibuild([command, "--toolchain", mode], example_project, env=no_compiler_path)
    failed(result, 2)
    assert f"toolchain {mode!r}: neuronx-cc was not found" in result.stderr
    assert "--toolchain fake" in result.stderr
    assert not (example_project / "build" / "extract").exists()
    assert not (example_project / "build" / "compile").exists()
    assert not (example_project / "dist").exists()


def test_auto_uses_a_neuronxcc_found_on_path(tmp_path: Path, hlo_project: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "neuronx-cc"
    shim.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -m nkibuild.toolchain_double.fake_neuronxcc "$@"\n'
    )
    shim.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    ok(run_nkibuild(["build", "--toolchain", "auto", SOFTMAX], hlo_project, env=env))
    result = json.loads(
        (hlo_project / "build/compile/softmax/default/trn2/result.json").read_text()
    )
    assert result["compiler_version"] == "2.23.0.0+nkibuild.fake"


def test_build_selection_builds_only_the_task_and_its_deps(example_project: Path) -> None:
    result = ok(
        run_nkibuild(["build", "--toolchain", "fake", "compile:softmax/*"], example_project)
    )
    assert done_tasks(result.stdout) == ["extract:softmax/default", SOFTMAX]
    assert "[2/2] done   compile:softmax/default/trn2" in result.stdout  # only selected counted
    assert built_files(example_project, "build/compile/*/*/*/model.neff") == [
        "build/compile/softmax/default/trn2/model.neff"
    ]
    assert built_files(example_project, "build/extract/*") == ["build/extract/softmax"]
    assert not (example_project / "build" / "bundle").exists()
    assert not (example_project / "dist").exists()


@pytest.mark.parametrize(
    ("task", "hint"),
    [
        ("compile:softmax/default/trn3", "; did you mean compile:softmax/default/trn2"),
        ("nonsense", "; see `nkibuild list`"),
    ],
)
def test_unknown_task_is_a_usage_error(example_project: Path, task: str, hint: str) -> None:
    result = failed(run_nkibuild(["build", "--toolchain", "fake", task], example_project), 2)
    assert f"no task matches {task!r}{hint}" in result.stderr
    assert not (example_project / "build" / "extract").exists()


def test_a_glob_without_a_star_is_a_usage_error_not_a_success_without_building(
    example_project: Path,
) -> None:
    pattern = "compile:softmax/default/trn?"
    result = failed(run_nkibuild(["build", "--toolchain", "fake", pattern], example_project), 2)
    assert f"no task matches {pattern!r}; did you mean compile:softmax/default/trn2" in (
        result.stderr
    )
    assert not (example_project / "build" / "extract").exists()


def test_neuron_cc_flags_are_part_of_the_cache_key(hlo_project: Path) -> None:
    def build(env: dict[str, str] | None = None) -> dict:
        command = ["build", "--json", "--toolchain", "fake"]
        return json.loads(ok(run_nkibuild(command, hlo_project, env=env)).stdout)

    assert build()["compile_origins"] == {"compiled": 1}
    flagged = build({"NEURON_CC_FLAGS": "--verbose"})
    assert SOFTMAX in flagged["executed"]
    assert flagged["compile_origins"] == {"compiled": 1}  # not a cache hit
    back = build()
    assert SOFTMAX in back["executed"]
    assert back["compile_origins"] == {"cache-local": 1}


# --- directories and manifests ---------------------------------------------------------


def test_dash_C_runs_in_another_directory(tmp_path: Path, hlo_project: Path) -> None:
    relative = os.path.relpath(hlo_project, tmp_path)
    ok(run_nkibuild(["-C", relative, "build", "--toolchain", "fake"], tmp_path))
    assert (hlo_project / "dist" / wheel_of("other-kernels")).is_file()
    assert not (tmp_path / "build").exists()


def test_dash_C_missing_directory_is_a_usage_error(tmp_path: Path) -> None:
    result = failed(run_nkibuild(["-C", "missing", "validate"], tmp_path), 2)
    assert "-C missing: No such file or directory" in result.stderr


def test_dash_f_builds_another_manifest(example_project: Path) -> None:
    (example_project / "other.yaml").write_text(hlo_only("other-kernels"))
    validate = ok(run_nkibuild(["validate", "-f", "other.yaml"], example_project))
    assert validate.stdout.strip() == "other.yaml: ok (1 kernel, 1 build unit)"
    ok(run_nkibuild(["build", "--file", "other.yaml", "--toolchain", "fake"], example_project))
    assert built_files(example_project, "dist/*") == [f"dist/{wheel_of('other-kernels')}"]
    assert built_files(example_project, "build/compile/*") == ["build/compile/softmax"]


def test_build_and_dist_dirs_are_honoured(hlo_project: Path) -> None:
    options = ["--build-dir", "out/b", "--dist-dir", "out/d"]
    ok(run_nkibuild(["build", "--toolchain", "fake", *options], hlo_project))
    assert (hlo_project / "out/b/compile/softmax/default/trn2/model.neff").is_file()
    assert built_files(hlo_project, "out/d/*") == [f"out/d/{wheel_of('other-kernels')}"]
    assert not (hlo_project / "build").exists()
    assert not (hlo_project / "dist").exists()
    result = ok(run_nkibuild(["clean", "--all", *options], hlo_project))
    assert result.stdout.splitlines() == ["removed out/b", "removed out/d"]
    assert list((hlo_project / "out").iterdir()) == []


# --- clean -----------------------------------------------------------------------------


def _fake_outputs(project: Path) -> None:
    """A build dir marked as nkibuild's (its lock file) and dist/ with the project's wheel."""
    for name in (
        "build/state/build.lock",
        "build/compile/k/file",
        f"dist/{wheel_of('other-kernels')}",
    ):
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text("x")


def test_clean_removes_the_build_dir_only(hlo_project: Path) -> None:
    _fake_outputs(hlo_project)
    result = ok(run_nkibuild(["clean"], hlo_project))
    assert result.stdout.strip() == "removed build"
    assert not (hlo_project / "build").exists()
    assert (hlo_project / "dist" / wheel_of("other-kernels")).is_file()


def test_clean_all_also_removes_dist(hlo_project: Path) -> None:
    _fake_outputs(hlo_project)
    result = ok(run_nkibuild(["clean", "--all"], hlo_project))
    assert result.stdout.splitlines() == ["removed build", "removed dist"]
    assert not (hlo_project / "build").exists()
    assert not (hlo_project / "dist").exists()


def test_clean_with_nothing_to_remove_says_nothing(hlo_project: Path) -> None:
    assert ok(run_nkibuild(["clean"], hlo_project)).stdout == ""
    assert not (hlo_project / "build").exists()


def test_clean_all_reports_only_what_existed(hlo_project: Path) -> None:
    (hlo_project / "dist").mkdir()
    (hlo_project / "dist" / wheel_of("other-kernels")).write_text("x")
    result = ok(run_nkibuild(["clean", "--all"], hlo_project))
    assert result.stdout.splitlines() == ["removed dist"]
    assert not (hlo_project / "build").exists()


# --- doctor ----------------------------------------------------------------------------


def test_doctor_without_neuronxcc(tmp_path: Path, no_compiler_path: dict[str, str]) -> None:
    lines = ok(run_nkibuild(["doctor"], tmp_path, env=no_compiler_path)).stdout.splitlines()
    assert lines[0].startswith(f"nkibuild {__version__} on Python ")
    assert "neuronx-cc: not found" in lines
    decision = lines.index("--toolchain auto: would stop with this message:")
    assert "--toolchain fake" in "\n".join(lines[decision:])
    assert any(line.startswith("jax: ") for line in lines)


# --- init ------------------------------------------------------------------------------


@needs_jax
def test_init_scaffolds_a_project_that_builds(tmp_path: Path) -> None:
    project = tmp_path / "my-kernels"
    project.mkdir()
    result = ok(run_nkibuild(["init"], project))
    assert result.stdout.splitlines() == [
        "created nkibuild.yaml",
        "created kernels/kernels.py",
        "created kernels/reference.py",
        "created pyproject.toml",
        "created .gitignore",
        "next: nkibuild build --toolchain fake",
        "install it editable (needs this environment's nkibuild): "
        "python -m pip install -e . --no-build-isolation -C toolchain=fake",
    ]
    ok(run_nkibuild(["build", "--toolchain", "fake"], project))
    assert built_files(project, "dist/*") == [f"dist/{wheel_of('my-kernels')}"]


def test_init_into_a_path_argument(tmp_path: Path) -> None:
    ok(run_nkibuild(["init", "new/proj"], tmp_path))
    assert (tmp_path / "new/proj/nkibuild.yaml").is_file()
    assert ok(run_nkibuild(["validate"], tmp_path / "new/proj")).stdout.startswith(
        "nkibuild.yaml: ok (1 kernel, 4 build units)"
    )


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    ok(run_nkibuild(["init"], tmp_path))
    manifest = tmp_path / "nkibuild.yaml"
    manifest.write_text(manifest.read_text() + "# mine\n")
    result = failed(run_nkibuild(["init"], tmp_path), 2)
    assert "would overwrite nkibuild.yaml" in result.stderr
    assert manifest.read_text().endswith("# mine\n")


# --- compile failures ------------------------------------------------------------------


def test_failed_compile_exits_1_naming_unit_command_status_and_log(example_project: Path) -> None:
    result = run_nkibuild(["build", "--toolchain", "fake", SOFTMAX], example_project, env=FAULT_ENV)
    failed(result, 1)
    err = result.stderr
    assert f"{SOFTMAX} failed:\nsoftmax/default/trn2: neuronx-cc failed" in err
    assert "  command: " in err
    assert "-m nkibuild.toolchain_double.fake_neuronxcc compile --framework XLA " in err
    assert "--target trn2 --lnc 2 --optlevel 2 --auto-cast none" in err
    assert "  exit status: 70\n" in err
    assert "  log tail:\n" in err
    assert "ERROR: injected fault exit70" in err
    assert err.count("softmax/default/trn2: neuronx-cc failed") == 1
    assert "1 failed" in result.stdout
    assert not (example_project / "build/compile/softmax/default/trn2/model.neff").exists()


def test_killed_compiler_is_named(example_project: Path) -> None:
    env = {**FAULT_ENV, "NKIBUILD_FAKE_CC_FAULT": "kill9"}
    result = run_nkibuild(["build", "--toolchain", "fake", SOFTMAX], example_project, env=env)
    failed(result, 1)
    assert "exit status: killed by SIGKILL" in result.stderr


def test_without_keep_going_a_failure_stops_the_build(example_project: Path) -> None:
    # Selected tasks run in command-line order: the failing compile comes first.
    command = ["build", "--toolchain", "fake", SOFTMAX, "wheel"]
    failed(run_nkibuild(command, example_project, env=FAULT_ENV), 1)
    assert built_files(example_project, "build/compile/*/*/*/model.neff") == []
    assert not (example_project / "build" / "extract" / "scaled_add").exists()


def test_keep_going_finishes_the_other_compiles_and_still_exits_1(tmp_path: Path) -> None:
    # Prebuilt HLO kernels k0, k1 (two targets each) next to the failing softmax: the
    # same graph shape as the example's, without tracing.
    project = prebuilt_project(tmp_path / "p", kernels=2, targets="[trn1, trn2]")
    hlo = (EXAMPLES / "kernels" / "softmax.hlo.pb").read_bytes()
    (project / "kernels" / "softmax.hlo.pb").write_bytes(hlo)
    with (project / "nkibuild.yaml").open("a") as manifest:
        manifest.write(hlo_only().split("kernels:\n")[1] + "    targets: [trn2]\n")
    command = ["build", "--keep-going", "--json", "--toolchain", "fake", SOFTMAX, "wheel"]
    result = failed(run_nkibuild(command, project, env=FAULT_ENV), 1)
    others = [f"k{k}/default/{target}" for k in (0, 1) for target in ("trn1", "trn2")]
    neffs = built_files(project, "build/compile/*/*/*/model.neff")
    assert neffs == sorted(f"build/compile/{unit}/model.neff" for unit in others)
    assert not (project / "dist").exists()
    summary = json.loads(result.stdout)
    assert summary["ok"] is False
    assert list(summary["failed"]) == [SOFTMAX]
    assert "exit status: 70" in summary["failed"][SOFTMAX]
    assert summary["blocked"] == ["bundle", "wheel"]  # not run: not failures of their own
    assert summary["compile_origins"] == {"compiled": 4}
    assert (
        "7 ran, 0 up to date, 4 compiled, 0 reused from build dir, "
        "0 local cache hits, 0 remote cache hits, "
        "1 failed, 2 not run (a dependency failed)\n"
    ) in result.stderr
    assert f"{SOFTMAX} failed:" in result.stderr
    assert "bundle failed" not in result.stderr
