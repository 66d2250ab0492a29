"""Errors raised by a kernel author's code at trace time: the author's frames only, one
traceback per kernel and cause (not one per variant), kernel and variant named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import build, write_project

from nkibuild.toolchain.usertrace import user_traceback

MANIFEST = """\
format-version: 1
package: {name: trace-errors, version: 0.1.0}
defaults: {targets: [trn2]}
kernels:
  first:
    frontend: jax
    source: kernels/kernels.py:first
    inputs: {x: {shape: [8, 4], dtype: float32}}
    variants: {v8: {x: [8, 4]}, v16: {x: [16, 4]}, v32: {x: [32, 4]}}
  second:
    frontend: jax
    source: kernels/kernels.py:second
    inputs: {x: {shape: [8, 4], dtype: float32}}
"""

KERNELS = """\
from utils import regroup


def first(x):
    return regroup(x) * 2


def second(x):
    return regroup(x) + 1
"""

UTILS = """\
def regroup(x):
    return x.reshape(3, -1)
"""


@pytest.fixture(scope="module")
def failures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    project = write_project(
        tmp_path_factory.mktemp("trace") / "project",
        MANIFEST,
        {"kernels/kernels.py": KERNELS, "kernels/utils.py": UTILS},
    )
    summary = build(project, "extract:*", keep_going=True)
    return {o.name.removeprefix("extract:"): o.detail for o in summary.failures}


def test_a_failing_kernel_shows_only_the_authors_frames(failures: dict[str, str]) -> None:
    shown = [detail for name, detail in failures.items() if "Traceback" in detail]
    assert len(shown) == 2  # one per kernel
    for detail in shown:
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', detail)
        assert frames[-1] == ("kernels/utils.py", "2", "regroup")
        assert {path for path, _, _ in frames} == {"kernels/kernels.py", "kernels/utils.py"}
        assert "return x.reshape(3, -1)" in detail
        assert "nkibuild" not in detail.replace("trace-errors", "")
        assert "site-packages" not in detail and "JAX_TRACEBACK_FILTERING" not in detail


def test_each_kernel_names_its_variant_and_the_traceback_appears_once(
    failures: dict[str, str],
) -> None:
    assert set(failures) == {"first/v8", "first/v16", "first/v32", "second/default"}
    first = [name for name in failures if name.startswith("first/")]
    with_traceback = [name for name in first if "Traceback" in failures[name]]
    assert len(with_traceback) == 1
    shown_in = with_traceback[0]
    for name in first:
        detail = failures[name]
        assert detail.startswith(f"{name}: tracing kernels/kernels.py:first failed: TypeError")
        if name != shown_in:  # the variant's own message, then where to find the traceback
            assert detail.endswith(
                f"(the same TypeError at kernels/utils.py:2 in regroup as {shown_in}: "
                "its traceback is shown there)"
            )
    assert "Traceback" in failures["second/default"]  # same line, another kernel: shown


def test_a_syntax_error_in_an_imported_module_points_at_the_users_line(tmp_path: Path) -> None:
    # (a syntax error in the kernel's own file is a manifest error: validate parses it)
    project = write_project(
        tmp_path / "project",
        MANIFEST.split("  second:")[0],
        {"kernels/kernels.py": KERNELS, "kernels/utils.py": "def regroup(x):\n    return x +* 2\n"},
    )
    result = run_nkibuild(["build", "--toolchain", "fake", "--keep-going", "extract:*"], project)
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("Traceback") == 1
    assert result.stderr.count('File "kernels/kernels.py", line 1, in <module>') == 1
    assert result.stderr.count('File "kernels/utils.py", line 2') == 1
    assert "return x +* 2" in result.stderr and "importlib" not in result.stderr
    assert (
        result.stderr.count("(the same SyntaxError at kernels/kernels.py:1 in <module> as first/")
        == 2
    )


def _fails_in_library() -> None:
    raise RuntimeError("a library's own bug")


def test_an_error_that_never_passed_through_user_code_keeps_every_frame(
    tmp_path: Path,
) -> None:
    try:
        _fails_in_library()
    except RuntimeError as error:
        shown = user_traceback(error, str(tmp_path))
    assert shown.where == ""
    assert "in _fails_in_library" in shown.text and __file__ in shown.text


def test_frames_of_a_virtualenv_inside_the_project_are_not_the_users(tmp_path: Path) -> None:
    library = tmp_path / ".venv" / "lib" / "site-packages" / "lib.py"
    user = tmp_path / "kernels" / "k.py"
    for path, source in (
        (library, "def fail():\n    raise ValueError('inside a library')\n"),
        (user, "def kernel(fail):\n    fail()\n"),
    ):
        path.parent.mkdir(parents=True)
        path.write_text(source)
    scope: dict = {}
    for path in (library, user):
        exec(compile(path.read_text(), str(path), "exec"), scope)
    fail = scope["fail"]
    try:
        scope["kernel"](fail)
    except ValueError as error:
        shown = user_traceback(error, str(tmp_path))
    assert shown.where == "kernels/k.py:2 in kernel"
    assert "site-packages" not in shown.text and "ValueError: inside a library" in shown.text
