"""What a new user meets (issue 31): no stray files in the project, a complete `init`,
messages that say what to do."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import failed, ok, venv_with_this_environment, write_project

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    done = subprocess.run(
        ["git", *identity, *args], cwd=repo, capture_output=True, text=True, check=True
    )
    return done.stdout


# --- nothing written into the project outside build/ and dist/ -------------------------

FRONTENDS = {
    "kernels/nki_kernels.py": """\
import nki
import nki.language as nl


@nki.jit
def add(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.add(nl.load(a), nl.load(b)))
    return out
""",
    "kernels/nkipy_kernels.py": """\
from helpers import twice


def double(x):
    return twice(x)
""",
    "kernels/helpers.py": "def twice(x):\n    return x * 2\n",
    "kernels/jax_kernels.py": """\
import jax.numpy as jnp


def halve(x):
    return x * jnp.asarray(0.5, x.dtype)
""",
    # Only the outputs are ignored: a __pycache__ would show as untracked.
    ".gitignore": "/build/\n/dist/\n",
}

MANIFEST = """\
format-version: 1
package: {name: clean-tree, version: 1.0.0}
defaults: {targets: [trn2]}
kernels:
  add:
    frontend: nki
    source: kernels/nki_kernels.py:add
    inputs:
      a: {shape: [128, 64], dtype: float32}
      b: {shape: [128, 64], dtype: float32}
  double:
    frontend: nkipy
    source: kernels/nkipy_kernels.py:double
    deps: [kernels/helpers.py]
    inputs:
      x: {shape: [64, 32], dtype: float32}
  halve:
    frontend: jax
    source: kernels/jax_kernels.py:halve
    inputs:
      x: {shape: [64, 32], dtype: float32}
"""


def project_files(project: Path) -> set[str]:
    """Every path in the project outside its outputs and git's own directory."""
    skipped = {"build", "dist", ".git"}
    found = set()
    for directory, subdirs, files in os.walk(project):
        subdirs[:] = [d for d in subdirs if not (Path(directory) == project and d in skipped)]
        relative = Path(directory).relative_to(project)
        found |= {(relative / name).as_posix() for name in [*files, *subdirs]}
    return found


@needs_git
def test_builds_and_releases_write_nothing_into_the_project_outside_build_and_dist(
    tmp_path: Path,
) -> None:
    pytest.importorskip("jax")
    project = write_project(tmp_path / "repo", MANIFEST, FRONTENDS)
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "kernels")
    before = project_files(project)

    ok(run_nkibuild(["build", "--toolchain", "fake"], project))
    assert project_files(project) == before
    assert git(project, "status", "--porcelain") == ""

    out = tmp_path / "out"
    for _ in range(2):  # the second release finds everything built: still a clean tree
        release = ["release", ".", "--out", str(out), "--toolchain", "fake"]
        assert f"1 wheel in {out};" in ok(run_nkibuild(release, project)).stdout
    assert project_files(project) == before
    statement = json.loads((out / "provenance.intoto.json").read_text())
    definition = statement["predicate"]["buildDefinition"]
    (source,) = [d for d in definition["resolvedDependencies"] if d.get("name") == "source"]
    assert source["annotations"] == {"dirty": False}


# --- init: a project pip can install ------------------------------------------------------


def test_init_refuses_before_writing_anything(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    result = failed(run_nkibuild(["init"], tmp_path), 2)
    assert "would overwrite pyproject.toml; nothing was written" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pyproject.toml"]
    assert (tmp_path / "pyproject.toml").read_text() == "[project]\nname = 'mine'\n"


def test_init_says_how_to_install_editable_and_clean_says_what_to_run(tmp_path: Path) -> None:
    """The install command init prints works as printed; after `nkibuild clean` the
    installed package's import error says to build again."""
    pytest.importorskip("jax")
    project = tmp_path / "my-kernels"
    project.mkdir()
    printed = ok(run_nkibuild(["init"], project)).stdout.splitlines()
    assert printed[3] == "created pyproject.toml"
    (install,) = [line for line in printed if "pip install" in line]
    command = install.partition(": ")[2]
    assert command == "python -m pip install -e . --no-build-isolation -C toolchain=fake"
    python = venv_with_this_environment(tmp_path / "venv")
    env = {**os.environ, "CI": "true", "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env["PATH"] = f"{python.parent}{os.pathsep}{env['PATH']}"  # `python` is the venv's
    installed = subprocess.run(
        command, shell=True, cwd=project, env=env, capture_output=True, text=True, timeout=600
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    use = [str(python), "-c", "import my_kernels; print(my_kernels.scaled_add.variants)"]
    assert "small" in ok(subprocess.run(use, capture_output=True, text=True, cwd=tmp_path)).stdout

    ok(run_nkibuild(["clean"], project))
    gone = subprocess.run(use, capture_output=True, text=True, cwd=tmp_path)
    assert gone.returncode == 1
    bundle = project.resolve() / "build" / "bundle" / "my-kernels"
    assert (
        f"ModuleNotFoundError: No module named 'my_kernels': it is installed editable from "
        f"{bundle}, which is gone (`nkibuild clean` removes it); run `nkibuild build` in its "
        "project to build it again"
    ) in gone.stderr


# --- messages ---------------------------------------------------------------------------

BAD_KERNEL = """\
format-version: 1
package: {name: messages, version: 1.0.0}
kernels:
  k:
    frontend: jaxx
    source: k.py:kk
    inputs:
      x: {shape: [4], dtype: float32}
    variants:
      v: {z: [4]}
"""


def test_an_invalid_frontend_does_not_hide_the_kernels_other_problems(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", BAD_KERNEL, {"k.py": "def k(x):\n    return x\n"})
    err = failed(run_nkibuild(["validate"], project), 2).stderr
    assert "3 problems in the manifest" in err
    assert "invalid value 'jaxx'\n  at: $.kernels.k.frontend" in err
    assert "hint: did you mean 'jax'?" in err
    # Found although the kernel's frontend is not one: the kernel is still checked.
    assert "'k.py' defines no 'kk'" in err
    assert "variant 'v' names 'z', not an input" in err


def test_validate_suggests_the_manifests_spelling_of_other_tools_dtypes(tmp_path: Path) -> None:
    manifest = BAD_KERNEL.replace("jaxx", "jax").replace(
        "x: {shape: [4], dtype: float32}",
        "x: {shape: [4], dtype: fp32}\n      y: {shape: [4], dtype: BF16}",
    )
    project = write_project(tmp_path / "p", manifest, {"k.py": "def kk(x, y):\n    return x\n"})
    err = failed(run_nkibuild(["validate"], project), 2).stderr
    for written, meant in (("fp32", "float32"), ("BF16", "bfloat16")):
        assert f"invalid value {written!r}" in err
        assert f"hint: did you mean {meant!r}?" in err


def test_a_misspelled_config_setting_is_answered_with_the_known_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nkibuild import build as backend

    monkeypatch.chdir(tmp_path)
    with pytest.raises(backend.BackendError) as refused:
        backend.build_wheel(str(tmp_path), {"toolchian": "fake", "jbos": "2", "zzz": "1"})
    message = str(refused.value)
    assert "unknown config setting(s) 'jbos', 'toolchian', 'zzz'" in message
    assert message.endswith("did you mean 'jobs' for 'jbos', 'toolchain' for 'toolchian'?")


def test_verify_of_a_wheel_says_which_kernels_it_carries_the_source_of() -> None:
    from nkibuild.verify.sources import NOT_IN_WHEEL, SHIPPED_NOT_RUN, wheel_source_checks

    info = {
        "kernels": {
            "traced": {"frontend": "jax", "variants": ["default"]},
            "numpy": {"frontend": "nkipy", "variants": ["small", "large"]},
        }
    }
    reasons = {(c.kernel, c.variant): c.skipped for c in wheel_source_checks(info)}
    assert reasons == {
        ("numpy", "large"): SHIPPED_NOT_RUN,
        ("numpy", "small"): SHIPPED_NOT_RUN,
        ("traced", "default"): NOT_IN_WHEEL,
    }
    assert "carries this kernel's source" in SHIPPED_NOT_RUN
    assert "holds no source of this kernel" in NOT_IN_WHEEL
