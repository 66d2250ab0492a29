"""Nothing outside the project is read or copied (issue 15, part 1).

Every attack is tried in several forms, through the real CLI where a user would meet
it: an HLO custom-call naming a file outside the project, symlinks under the project
that lead out (sources, references, `deps`, the sdist), files swapped after a cached
plan was written, symlink loops and glob characters in the project path.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import softmax_manifest, softmax_project, write_project

from nkibuild import build as backend
from nkibuild.confine import OutsideProject, glob_files, read_confined
from nkibuild.graph.tasks import expand_deps
from nkibuild.toolchain_double.hlo_writer import build_hlo_module

SECRET = b"SECRET-c0ffee-not-for-the-wheel"
HLO_MANIFEST = """\
format-version: 1
package: {name: confined, version: 1.0.0}
defaults: {targets: [trn2]}
kernels:
  k:
    frontend: hlo
    source: k.pb
    inputs: {p0: {shape: [4], dtype: float32}}
"""


def nki_module(path: str) -> bytes:
    """A prebuilt module whose NKI custom-call names `path` as its compiled kernel."""
    config = base64.b64encode(json.dumps({"bir_path": path, "grid": 1}).encode())
    call = ("AwsNeuronCustomNativeKernel", config)
    return build_hlo_module("k", [("p0", "float32", (4,))], [("float32", (4,))], call)


def secret_file(tmp_path: Path) -> Path:
    """A file outside the project, as `~/.aws/credentials` would be."""
    path = tmp_path / "home" / ".aws" / "credentials"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(SECRET)
    return path


def files_containing(root: Path, needle: bytes) -> list[Path]:
    found = []
    for directory, _, files in os.walk(root):
        for name in files:
            path = Path(directory, name)
            if path.is_file() and not path.is_symlink() and needle in path.read_bytes():
                found.append(path)
    return found


def _outside_absolute(project: Path, tmp_path: Path) -> str:
    return str(secret_file(tmp_path))


def _dotdot(project: Path, tmp_path: Path) -> str:
    secret_file(tmp_path)
    return f"{project}/../home/.aws/credentials"  # starts with the project's path


def _symlink_out(project: Path, tmp_path: Path) -> str:
    (project / "kernel.klir").symlink_to(secret_file(tmp_path))
    return str(project / "kernel.klir")


def _symlinked_dir_out(project: Path, tmp_path: Path) -> str:
    (project / "bir").symlink_to(secret_file(tmp_path).parent)
    return str(project / "bir" / "credentials")


def _fifo(project: Path, tmp_path: Path) -> str:
    os.mkfifo(project / "kernel.klir")  # reading it would block the build forever
    return str(project / "kernel.klir")


def _directory(project: Path, tmp_path: Path) -> str:
    (project / "kernel.klir").mkdir()
    return str(project / "kernel.klir")


ATTACKS = {
    "proc-environ": (lambda project, tmp_path: "/proc/self/environ", "is outside the project"),
    "device": (lambda project, tmp_path: "/dev/zero", "is outside the project"),
    "home-file": (_outside_absolute, "is outside the project"),
    "dotdot": (_dotdot, "is outside the project"),
    "symlink-out": (_symlink_out, "leads outside the project through a symlink"),
    "symlinked-dir-out": (_symlinked_dir_out, "leads outside the project through a symlink"),
    "fifo": (_fifo, "is not a regular file"),
    "directory": (_directory, "is not a regular file"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_custom_call_naming_a_file_outside_the_project_is_refused(
    tmp_path: Path, attack: str
) -> None:
    project = write_project(tmp_path / "project", HLO_MANIFEST)
    make, reason = ATTACKS[attack]
    named = make(project, tmp_path)
    (project / "k.pb").write_bytes(nki_module(named))
    result = run_nkibuild(
        ["build", "--toolchain", "fake", "extract:k/default"], project, timeout=60
    )
    assert result.returncode == 1, result.stdout + result.stderr
    output = result.stdout + result.stderr
    assert f"refers to {named}, which {reason}" in output
    assert "Traceback" not in output
    assert files_containing(project, SECRET) == []  # nothing was copied into build/
    assert not list((project / "build").rglob("sidecars/*"))


def test_a_custom_call_naming_a_file_inside_the_project_is_carried(tmp_path: Path) -> None:
    project = write_project(tmp_path / "project", HLO_MANIFEST, {"bir/k.klir": b"BIR"})
    (project / "k.pb").write_bytes(nki_module(str(project / "bir" / "k.klir")))
    result = run_nkibuild(
        ["build", "--toolchain", "fake", "extract:k/default"], project, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (sidecar,) = (project / "build" / "extract" / "k" / "default" / "sidecars").iterdir()
    assert sidecar.read_bytes() == b"BIR" and sidecar.name.endswith("-k.klir")


def _source_symlinked_out(project: Path, secret: Path) -> None:
    (project / "kernels" / "softmax.hlo.pb").unlink()
    (project / "kernels" / "softmax.hlo.pb").symlink_to(secret)


def _reference_symlinked_out(project: Path, secret: Path) -> None:
    (project / "kernels" / "reference.py").unlink()
    (project / "kernels" / "reference.py").symlink_to(secret)


def _source_dir_symlinked_out(project: Path, secret: Path) -> None:
    kernels = project / "kernels"
    kernels.rename(project / "moved")
    (secret.parent / "softmax.hlo.pb").write_bytes(SECRET)
    (secret.parent / "reference.py").write_bytes(SECRET)
    kernels.symlink_to(secret.parent)


def _source_became_a_fifo(project: Path, secret: Path) -> None:
    (project / "kernels" / "softmax.hlo.pb").unlink()
    os.mkfifo(project / "kernels" / "softmax.hlo.pb")


SWAPS = {
    "source-symlink": (_source_symlinked_out, "leads outside the manifest's directory"),
    "reference-symlink": (_reference_symlinked_out, "leads outside the manifest's directory"),
    "directory-symlink": (_source_dir_symlinked_out, "leads outside the manifest's directory"),
    "source-fifo": (_source_became_a_fifo, "'kernels/softmax.hlo.pb' is not a file"),
}


@pytest.mark.parametrize("swap", sorted(SWAPS))
def test_a_cached_plan_does_not_skip_the_file_checks(tmp_path: Path, swap: str) -> None:
    """A plan loaded before is keyed on the manifest; files it names can change without it."""
    project = softmax_project(tmp_path / "p", softmax_manifest(reference=True))
    first = run_nkibuild(["list", "--toolchain", "fake"], project, timeout=60)
    assert first.returncode == 0, first.stderr
    change, message = SWAPS[swap]
    change(project, secret_file(tmp_path))
    for command in (["list"], ["build"]):
        result = run_nkibuild([*command, "--toolchain", "fake"], project, timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        assert message in result.stderr and "nkibuild.yaml:" in result.stderr
        assert "Traceback" not in result.stderr
    assert files_containing(project / "build", SECRET) == []


@pytest.mark.parametrize("swap", sorted(SWAPS))
def test_a_graph_snapshot_does_not_skip_the_file_checks(tmp_path: Path, swap: str) -> None:
    """A build's graph snapshot trusts a named file whose stat is unchanged; one swapped
    since (a symlink out, a parent directory symlinked out, a FIFO) is checked again."""
    project = softmax_project(tmp_path / "p", softmax_manifest(reference=True))
    first = run_nkibuild(["build", "--toolchain", "fake"], project, timeout=120)
    assert first.returncode == 0, first.stderr
    assert (project / "build" / "state" / "graph.json").is_file()
    change, message = SWAPS[swap]
    change(project, secret_file(tmp_path))
    result = run_nkibuild(["build", "--toolchain", "fake"], project, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert files_containing(project / "build", SECRET) == []


def deps_project(root: Path, deps: str) -> Path:
    manifest = softmax_manifest(reference=True) + f"    deps: [{deps}]\n"
    return softmax_project(root, manifest, {"kernels/helpers/tiles.py": "TILE = 128\n"})


@pytest.mark.parametrize(
    "link",
    ["kernels/helpers/evil.py", "kernels/evil_dir/creds.py", "kernels/deep/a/b/evil.py"],
)
def test_a_deps_match_that_leads_outside_is_refused(tmp_path: Path, link: str) -> None:
    project = deps_project(tmp_path / "p", "'kernels/**/*.py'")
    secret = secret_file(tmp_path)
    target = project / link
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    if "evil_dir" in link:  # a symlinked directory whose files match the glob
        (secret.parent / "creds.py").write_bytes(SECRET)
        target.parent.symlink_to(secret.parent)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(secret)
    result = run_nkibuild(["build", "--toolchain", "fake"], project, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    refused = target.parent if "evil_dir" in link else target  # the directory is not entered
    assert f"{refused}: leads outside the project through a symlink" in result.stderr
    assert "Traceback" not in result.stderr
    assert files_containing(project, SECRET) == []


def test_deps_globs_survive_symlink_loops(tmp_path: Path) -> None:
    project = deps_project(tmp_path / "p", "'**/*.py'")
    loops = project / "kernels" / "loops"
    loops.mkdir()
    (loops / "up").symlink_to("..")
    (loops / "root").symlink_to(project)
    (loops / "self").symlink_to(loops)
    (loops / "a").symlink_to("b")
    (loops / "b").symlink_to("a")  # a file-level loop: neither is a file
    started = time.monotonic()
    found = expand_deps(project, ["**/*.py", "kernels/loops/*/*.py", "kernels/loops/**"])
    assert time.monotonic() - started < 5
    assert found == [
        str(project / "kernels/helpers/tiles.py"),
        str(project / "kernels/reference.py"),
    ]
    # and through the CLI: the graph is built, no hang, no traceback
    result = run_nkibuild(["list", "--toolchain", "fake"], project, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("directory", ["proj[1]", "[!a]", "r[ab]"])
def test_deps_globs_work_under_a_root_with_glob_characters(tmp_path: Path, directory: str) -> None:
    project = deps_project(tmp_path / directory, "'kernels/**/*.py', 'kernels/[rh]*.py'")
    assert expand_deps(project, ["kernels/**/*.py", "kernels/[rh]*.py"]) == [
        str(project / "kernels/helpers/tiles.py"),
        str(project / "kernels/reference.py"),
    ]


def test_glob_files_agrees_with_glob_on_an_ordinary_tree(tmp_path: Path) -> None:
    import glob

    root = write_project(
        tmp_path / "t",
        "",
        {"a.py": "", ".hidden.py": "", "d/b.py": "", "d/.e/c.py": "", "d/e/f.txt": "", "g.txt": ""},
    )
    patterns = ["*.py", "**/*.py", "**", "d/**", ".*.py", "d/*/*", "**/.e/*.py", "?.py", "[ag]*"]
    for pattern in patterns:
        expected = sorted(
            Path(m) for m in glob.glob(str(root / pattern), recursive=True) if os.path.isfile(m)
        )
        assert glob_files(root, pattern) == expected, pattern


def test_read_confined_refuses_a_symlink_swapped_in_after_the_check(tmp_path: Path) -> None:
    project = write_project(tmp_path / "p", "", {"k.py": "ok"})
    assert read_confined(project / "k.py", [project]) == b"ok"
    (project / "k.py").unlink()
    (project / "k.py").symlink_to(secret_file(tmp_path))
    with pytest.raises(OutsideProject, match="leads outside the project through a symlink"):
        read_confined(project / "k.py", [project])


SDIST_LINKS = {
    "deps-file": ("kernels/extra/evil.py", "'kernels/**'"),
    "pyproject": ("pyproject.toml", "'kernels/*.py'"),
}


@pytest.mark.parametrize("case", sorted(SDIST_LINKS))
def test_an_sdist_refuses_symlinks_out_of_the_project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    link, deps = SDIST_LINKS[case]
    project = softmax_project(
        tmp_path / "p",
        softmax_manifest("{name: pep-kernels, version: 0.3.0}") + f"    deps: [{deps}]\n",
    )
    (project / link).parent.mkdir(parents=True, exist_ok=True)
    (project / link).symlink_to(secret_file(tmp_path))
    monkeypatch.chdir(project)
    with pytest.raises(backend.BackendError, match="leads outside the project through a symlink"):
        backend.build_sdist(str(tmp_path / "out"), {"toolchain": "fake"})
    assert not (tmp_path / "out").exists() or files_containing(tmp_path / "out", SECRET) == []


def confinement_cases(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A project with every kind of path `file_problem` tells apart."""
    project = tmp_path / "project"
    (project / "kernels" / "inner").mkdir(parents=True)
    (project / "kernels" / "k.pb").write_bytes(b"k")
    (project / "kernels" / "inner" / "deep.pb").write_bytes(b"d")
    (project / "kernels" / "link.pb").symlink_to(project / "kernels" / "inner" / "deep.pb")
    (project / "kernels" / "out.pb").symlink_to(secret_file(tmp_path))
    (project / "kernels" / "out_dir").symlink_to(secret_file(tmp_path).parent)
    (project / "kernels" / "in_dir").symlink_to(project / "kernels" / "inner")
    (project / "kernels" / "loop").symlink_to(project / "kernels" / "loop")
    os.mkfifo(project / "kernels" / "fifo")
    names = [
        "kernels/k.pb",
        "kernels/link.pb",
        "kernels/out.pb",
        "kernels/out_dir/credentials",
        "kernels/in_dir/deep.pb",
        "kernels/inner/../k.pb",
        "kernels/inner/..",
        "kernels/missing.pb",
        "kernels/missing_dir/k.pb",
        "kernels/inner",
        "kernels/fifo",
        "kernels/loop",
        "../home/.aws/credentials",
    ]
    return project, [project / name for name in names]


def test_confined_stats_agrees_with_file_problem_on_every_kind_of_path(tmp_path: Path) -> None:
    from nkibuild.confine import confined_stats, file_problem

    project, paths = confinement_cases(tmp_path)
    allowed = []
    for path in paths:
        stats = confined_stats([path], (project,))
        if file_problem(path, (project,)) is None:
            allowed.append(path)
            assert stats == [os.stat(path)], path
        else:
            assert stats is None, path
    assert [p.relative_to(project).as_posix() for p in allowed] == [
        "kernels/k.pb",
        "kernels/link.pb",
        "kernels/in_dir/deep.pb",
        "kernels/inner/../k.pb",
    ]
    assert confined_stats(allowed, (project,)) == [os.stat(path) for path in allowed]
    for refused in set(paths) - set(allowed):  # one bad path among good ones refuses all
        assert confined_stats([*allowed, refused], (project,)) is None, refused
