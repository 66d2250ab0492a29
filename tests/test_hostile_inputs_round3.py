"""Hostile inputs, round 3 (issue 30, classes 6 and 7).

6. Every file nkibuild reads on someone's behalf goes through one bounded reader
   (`confine.open_regular`): a FIFO, a device, a directory or an oversize file is refused
   without blocking, at every entrance. `verify` takes its results from a file and stops
   and names a reference that hangs. NEFF tensor numbers, NEURON_CC_FLAGS and `init` give
   clear errors, never a traceback.
7. The editable install's `.pth` file is one fixed line whatever the project's path is;
   the manifest-size guard states its limit and blames aliases only when they caused it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, run_nkibuild
from helpers import failed, ok, softmax_manifest, softmax_project, write_project

from nkibuild.cli.scaffold import project_name, scaffold
from nkibuild.confine import OutsideProject, read_confined, read_regular
from nkibuild.errors import BuildError, ManifestError, UsageError
from nkibuild.formats.hlo import HloFormatError, read_hlo_file
from nkibuild.formats.neff import NeffFormatError, read_neff
from nkibuild.manifest import load_manifest
from nkibuild.manifest.yamlsource import MAX_BYTES, load_yaml, parse_yaml
from nkibuild.toolchain_double.neff_writer import NeffTensor, write_neff

GIB = 1 << 30
DEADLINE_S = 30  # a FIFO that blocked would block for ever; this is far beyond any refusal


# --- class 6: one bounded reader, every entrance ---------------------------------------------


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _directory(path: Path) -> None:
    path.mkdir()


def _symlink_to_fifo(path: Path) -> None:
    os.mkfifo(path.with_name(path.name + ".fifo"))
    path.symlink_to(path.name + ".fifo")


def _sparse(path: Path) -> None:
    with open(path, "wb") as handle:
        handle.truncate(10 * GIB)  # beyond every bound; no disk used


HOSTILE = {
    "fifo": (_fifo, "not a regular file (a FIFO)"),
    "dev-zero": (_dev_zero, "not a regular file (a character device)"),
    "directory": (_directory, "not a regular file (a directory)"),
    "symlink-to-fifo": (_symlink_to_fifo, "not a regular file (a FIFO)"),
    "sparse-10GiB": (_sparse, "10737418240 bytes, more than the"),
}


def _statement(path: Path) -> object:
    from nkibuild.verify.provenance import read_statement

    return read_statement(path)


def _wheel_for_verify(path: Path) -> object:
    from nkibuild.verify import bundle_of_wheel

    scratch = path.with_name("scratch")
    scratch.mkdir()
    return bundle_of_wheel(path, scratch)


def _wheel_for_provenance(path: Path) -> object:
    from nkibuild.verify.provenance import check_wheel

    return check_wheel(path, path.with_name("statement.json"))


def _gitignore(path: Path) -> object:
    return scaffold(path.parent)


# Entrance -> (reader, the name the hostile file takes, the error it must raise).
READERS: dict[str, tuple[Callable[[Path], object], str, type[Exception]]] = {
    "read_regular": (lambda p: read_regular(p, 1 << 20), "x", OSError),
    "neff": (read_neff, "model.neff", NeffFormatError),
    "hlo": (read_hlo_file, "model.hlo_module.pb", HloFormatError),
    "manifest": (load_yaml, "nkibuild.yaml", ManifestError),
    "statement": (_statement, "provenance.intoto.json", UsageError),
    "verify-wheel": (_wheel_for_verify, "a-1-py3-none-any.whl", UsageError),
    "provenance-wheel": (_wheel_for_provenance, "a-1-py3-none-any.whl", UsageError),
    "init-gitignore": (_gitignore, ".gitignore", UsageError),
}


def within_deadline(call: Callable[[], object]) -> BaseException | None:
    """What `call` raised (None: nothing), failing the test if it has not returned in time."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:  # handed to the test
            outcome.append(error)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(DEADLINE_S)
    assert not worker.is_alive(), "the reader blocked"
    return outcome[0]


@pytest.mark.parametrize("kind", list(HOSTILE))
@pytest.mark.parametrize("entrance", list(READERS))
def test_every_reader_refuses_what_is_not_a_bounded_regular_file(
    tmp_path: Path, entrance: str, kind: str
) -> None:
    reader, name, error_type = READERS[entrance]
    make, reason = HOSTILE[kind]
    if entrance == "init-gitignore" and kind in ("dev-zero", "symlink-to-fifo"):
        reason = "a symbolic link (not followed)"  # init reads .gitignore only in the project
    path = tmp_path / name
    make(path)
    started = time.monotonic()
    error = within_deadline(lambda: reader(path))
    assert isinstance(error, error_type), f"{entrance}: {error!r}"
    assert reason in str(error), str(error)
    assert time.monotonic() - started < 5  # refused from fstat, not by reading 10 GiB
    if entrance == "init-gitignore":  # checked before anything was written
        assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".fifo")) == [
            ".gitignore"
        ]


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_project_files_are_read_bounded_and_confined(tmp_path: Path, kind: str) -> None:
    make, _ = HOSTILE[kind]
    make(tmp_path / "kernel.py")
    error = within_deadline(lambda: read_confined(tmp_path / "kernel.py", (tmp_path,)))
    assert isinstance(error, OutsideProject), repr(error)
    expected = "outside the project" if kind == "dev-zero" else "not a regular file"
    assert expected in str(error) or "more than the" in str(error), str(error)


def test_the_plan_cache_key_never_blocks_on_a_fifo_manifest(tmp_path: Path) -> None:
    from nkibuild.plan import load_plan

    os.mkfifo(tmp_path / "nkibuild.yaml")
    error = within_deadline(lambda: load_plan(tmp_path / "nkibuild.yaml", tmp_path / "state"))
    assert isinstance(error, ManifestError)
    assert "cannot read the manifest: not a regular file (a FIFO)" in str(error.diagnostics[0])


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_the_cli_refuses_hostile_files_without_a_traceback(tmp_path: Path, kind: str) -> None:
    make, reason = HOSTILE[kind]
    hostile = tmp_path / "hostile"
    make(hostile)
    a_zip = tmp_path / "a-1-py3-none-any.whl"
    with zipfile.ZipFile(a_zip, "w") as archive:
        archive.writestr("a/__init__.py", "")
    commands = {
        ("inspect", str(hostile)): 1,
        ("verify", str(hostile)): 2,
        ("verify-provenance", str(hostile)): 2,
        ("verify-provenance", str(a_zip), "--statement", str(hostile)): 2,
        ("validate", "-f", str(hostile)): 2,
    }
    for command, code in commands.items():
        result = failed(run_nkibuild(list(command), tmp_path, timeout=60), code)
        assert reason in result.stderr, (command, result.stderr)


def test_a_zip_bomb_wheel_is_refused_before_unpacking(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Members declaring more than MAX_UNPACKED_BYTES in all refuse the wheel (the bound
    is lowered here: a real 16 GiB bomb takes minutes to compress)."""
    from nkibuild import verify

    wheel = tmp_path / "bomb-1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/_build.json", b"\0" * 100_000)
    monkeypatch.setattr(verify, "MAX_UNPACKED_BYTES", 50_000)
    (tmp_path / "scratch").mkdir()
    with pytest.raises(UsageError, match="unpack to 100000 bytes, more than 50000"):
        verify.bundle_of_wheel(wheel, tmp_path / "scratch")
    assert list((tmp_path / "scratch").iterdir()) == []  # nothing unpacked


# --- verify: results through a file, a reference that hangs ----------------------------------

NKIPY_MANIFEST = """\
format-version: 1
package: {name: norm-kernels, version: 0.1.0}
defaults: {targets: [trn2]}
kernels:
  norm:
    frontend: nkipy
    source: kernels/nkipy_kernels.py:norm
    reference: kernels/reference.py:norm
    inputs:
      x: {shape: [4, 32], dtype: float32}
    constants: {eps: 1.0e-6}
"""

KERNEL = """\
import numpy as np


def norm(x, eps):
    return %s * x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
"""

REFERENCE = """\
import numpy as np
%s

def norm(x, eps):
%s
    return x / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True) + eps)
"""


def norm_project(root: Path, scale: int, *, top: str = "", body: str = "") -> Path:
    files = {
        "kernels/nkipy_kernels.py": KERNEL % scale,
        "kernels/reference.py": REFERENCE % (top, body or "    pass"),
    }
    return write_project(root, NKIPY_MANIFEST, files)


def source_checks_of(project: Path) -> list[Any]:
    from nkibuild.verify.sources import project_sources, source_checks

    return source_checks(project_sources(load_manifest(project / "nkibuild.yaml"), sys.executable))


# What a reference may print, from its import and from an exit handler: none of it is
# the runner's answer any more (a last stdout line of `{"results": []}` used to be).
NOISE = {
    "a forged answer at exit": "import atexit\n"
    'atexit.register(print, \'{"results": [], "done": true}\')',
    "5 MB on stdout": "import sys\nsys.stdout.write('{' * 5_000_000)",
    "bytes that are not UTF-8": "import os\nos.write(1, b'\\xff\\xfe\\n'); os.write(2, b'\\xff')",
    "stdout closed": "import os\nos.close(1)",
}


@pytest.mark.parametrize("noise", list(NOISE))
def test_what_a_reference_prints_cannot_change_the_results(tmp_path: Path, noise: str) -> None:
    [check] = source_checks_of(norm_project(tmp_path / "bad", 2, top=NOISE[noise]))
    assert check.status == "failed" and "disagrees with its reference" in check.problems[0]
    [check] = source_checks_of(norm_project(tmp_path / "good", 1, top=NOISE[noise]))
    assert check.status == "ok" and check.figures["max_abs_error"] == 0.0


HANGS = {
    "sleeps": "    import time\n    time.sleep(3600)",
    "spins": "    while True:\n        pass",
    "ignores SIGTERM": "    import signal, time\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    time.sleep(3600)",
    "starts a child": "    import subprocess, time\n"
    "    child = subprocess.Popen(['sleep', '3600'])\n"
    "    open('child.pid', 'w').write(str(child.pid))\n    time.sleep(3600)",
}


@pytest.mark.parametrize("hang", list(HANGS))
def test_a_reference_that_hangs_is_stopped_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hang: str
) -> None:
    project = norm_project(tmp_path / "p", 1, body=HANGS[hang])
    monkeypatch.setenv("NKIBUILD_VERIFY_TIMEOUT", "2")
    started = time.monotonic()
    with pytest.raises(BuildError) as caught:
        source_checks_of(project)
    assert time.monotonic() - started < DEADLINE_S
    assert (
        "the reference of norm/default (kernels/reference.py) did not finish within 2 s "
        "(NKIBUILD_VERIFY_TIMEOUT); it was stopped" in caught.value.render()
    )
    pid_file = project / "child.pid"
    assert pid_file.exists() == (hang == "starts a child")
    if hang == "starts a child":  # what the reference started went down with it (its group)
        assert not _alive(int(pid_file.read_text()))


def _alive(pid: int) -> bool:
    """Whether `pid` runs, waiting up to the deadline for a killed one to be gone."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return False
        if state == "Z":  # killed, waiting for its (new) parent to reap it
            return False
        time.sleep(0.05)  # polling for an exit, not ordering events
    return True


def test_verify_reports_a_hung_reference_and_a_bad_timeout_through_the_cli(
    tmp_path: Path,
) -> None:
    project = norm_project(tmp_path / "p", 1, body=HANGS["sleeps"])
    hung = run_nkibuild(
        ["verify", "--toolchain", "fake"], project, {"NKIBUILD_VERIFY_TIMEOUT": "2"}
    )
    result = failed(hung, 1)
    # The bundle's own check runs first: its copy of the reference is what hangs.
    assert "verifying norm_kernels: the reference of norm/default did not finish within 2 s" in (
        result.stderr
    )
    for value in ("nan", "-1", "9" * 400, "soon"):
        bad = run_nkibuild(
            ["verify", "--toolchain", "fake"], project, {"NKIBUILD_VERIFY_TIMEOUT": value}
        )
        assert "NKIBUILD_VERIFY_TIMEOUT: " in failed(bad, 2).stderr


def test_the_bundle_runner_ignores_a_forged_answer_on_stdout(tmp_path: Path) -> None:
    """The bundle's reference module prints a passing answer at exit; the bundle check
    (reference against the NEFFs' signatures) still fails a reference of the wrong shape."""
    root = tmp_path / "nki"
    import shutil

    shutil.copytree(EXAMPLES / "nki-nkipy", root, ignore=shutil.ignore_patterns("build", "dist"))
    reference = root / "kernels" / "reference.py"
    text = reference.read_text().replace(
        "return np.matmul(lhsT.T, rhs)", "return np.matmul(lhsT.T, rhs).T"
    )
    forged = '{"results": [], "spike_double": false, "done": true}'
    reference.write_text(f"import atexit\natexit.register(print, {forged!r})\n{text}")
    result = failed(run_nkibuild(["verify", "--toolchain", "fake", "--mode", "reference"], root), 1)
    # matmul_tiled is an nki kernel: trn2 and trn3 (NKI 0.3+ builds no trn1)
    assert "the reference returns float32[1024,512] but the trn2 NEFF returns" in result.stdout


# --- NEFF tensor numbers, NEURON_CC_FLAGS ------------------------------------------------------


def test_neff_tensor_numbers_of_any_length_sort_without_int(tmp_path: Path) -> None:
    huge = "9" * 5000
    names = [f"output{huge}", "output10", "output2", "output0" + "0" * 4400 + "1", "out٣", "x"]
    path = tmp_path / "m.neff"
    outputs = [NeffTensor(name, "float32", (2,)) for name in names]
    write_neff(
        path, compiler_version="2.0", inputs=[], outputs=outputs, num_tpb=1, placeholder=True
    )
    got = [t.name for t in read_neff(path).outputs]
    assert got == [
        "output0" + "0" * 4400 + "1",
        "output2",
        "output10",
        f"output{huge}",
        "out٣",
        "x",
    ]
    shown = ok(run_nkibuild(["inspect", "--json", str(path)], tmp_path))
    assert [t["name"] for t in json.loads(shown.stdout)["outputs"]] == got
    assert (
        f"    output{huge}: float32[2]" in ok(run_nkibuild(["inspect", str(path)], tmp_path)).stdout
    )


@pytest.mark.parametrize("flags", ['--foo "bar', "'", "--x \\", "--opt 'a\nb"])
def test_unsplittable_neuron_cc_flags_are_a_clear_error(tmp_path: Path, flags: str) -> None:
    project = softmax_project(tmp_path / "p", softmax_manifest())
    result = failed(
        run_nkibuild(["build", "--toolchain", "fake"], project, {"NEURON_CC_FLAGS": flags}), 2
    )
    assert "NEURON_CC_FLAGS=" in result.stderr and "cannot be split into words" in result.stderr
    assert not (project / "dist").exists()


# --- init -----------------------------------------------------------------------------------


def _kernels_file(root: Path) -> None:
    (root / "kernels").write_text("mine")


def _kernels_symlink(root: Path) -> None:
    (root.parent / "elsewhere").mkdir()
    (root / "kernels").symlink_to(root.parent / "elsewhere")


def _dangling_manifest(root: Path) -> None:
    (root / "nkibuild.yaml").symlink_to(root.parent / "created-through-the-link")


def _gitignore_symlink(root: Path) -> None:
    (root.parent / "dotfiles.gitignore").write_text("*.o\n")
    (root / ".gitignore").symlink_to(root.parent / "dotfiles.gitignore")


def _gitignore_not_utf8(root: Path) -> None:
    (root / ".gitignore").write_bytes(b"\xff\xfe*.o\n")


TAKEN = {
    "kernels is a file": (_kernels_file, "is in the way (not a directory)"),
    "kernels is a symlink out": (_kernels_symlink, "is in the way (not a directory)"),
    "a dangling nkibuild.yaml": (_dangling_manifest, "would overwrite"),
    ".gitignore a symlink": (_gitignore_symlink, "a symbolic link (not followed)"),
    ".gitignore not UTF-8": (_gitignore_not_utf8, "not UTF-8 text"),
}


@pytest.mark.parametrize("case", list(TAKEN))
def test_init_checks_every_path_before_writing_anything(tmp_path: Path, case: str) -> None:
    root = tmp_path / "proj"
    root.mkdir()
    make, reason = TAKEN[case]
    make(root)

    def snapshot() -> dict[str, bytes | str]:
        return {
            str(p): os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else "")
            for p in sorted(tmp_path.rglob("*"))
        }

    before = snapshot()
    result = failed(run_nkibuild(["init"], root), 2)
    assert reason in result.stderr and "nothing was written" in result.stderr
    assert snapshot() == before


def test_init_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("mine")
    result = failed(run_nkibuild(["init", "f/sub"], tmp_path), 2)
    assert "f is in the way (not a directory)" in result.stderr


@pytest.mark.parametrize(
    "directory",
    [
        "名前",
        "123",
        "import",
        "class",
        "a b.c",
        "-x-",
        "x" * 250,
        "Ünïcödé kernels",
        "__init__",
        "😀",
        "a__b--c",
        "9lives",
    ],
)
def test_init_derives_a_valid_package_name_from_any_directory(
    tmp_path: Path, directory: str
) -> None:
    root = tmp_path / directory
    scaffold(root)
    manifest = load_manifest(root / "nkibuild.yaml")  # every check validate makes
    assert manifest.package.name == project_name(root)
    assert len(manifest.package.name) <= 64 and manifest.package.name[0].isalpha()


# --- class 7: the editable install, the manifest-size guard -------------------------------------

HOSTILE_PATHS = [
    "p\nimport os; open('PWNED', 'w')",
    "p\rimport os; open('PWNED', 'w')",
    "q'\"\\ x",
    "import sys",
]


def test_an_editable_install_holds_paths_as_literals(tmp_path: Path) -> None:
    """However a bundle's path is spelled, the `.pth` file is its one import line and
    site puts exactly those directories on sys.path, running nothing else."""
    from nkibuild.bundle.editable import finder_module

    site_dir = tmp_path / "site"
    site_dir.mkdir()
    wanted = []
    for index, name in enumerate(HOSTILE_PATHS):
        bundle = tmp_path / name / "build"
        bundle.mkdir(parents=True)
        wanted.append(str(bundle))
        module, source, line = finder_module(f"k{index}", [bundle])
        assert line == f"import __editable___nkibuild_k{index}_finder\n"
        (site_dir / module).write_text(source)
        (site_dir / f"__editable__.k{index}.pth").write_text(line)
    show = (
        f"import site, sys, json; site.addsitedir({str(site_dir)!r}); print(json.dumps(sys.path))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", show], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    path = json.loads(done.stdout)
    assert [p for p in path if p in wanted] == wanted
    assert not list(tmp_path.rglob("PWNED"))


def test_an_editable_wheel_of_a_project_with_a_newline_in_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nkibuild import build as backend

    pyproject = '[build-system]\nrequires = ["nkibuild"]\nbuild-backend = "nkibuild.build"\n'
    root = softmax_project(
        tmp_path / HOSTILE_PATHS[0], softmax_manifest(), {"pyproject.toml": pyproject}
    )
    monkeypatch.chdir(root)
    name = backend.build_editable(str(tmp_path / "wheels"), {"toolchain": "fake"})
    with zipfile.ZipFile(tmp_path / "wheels" / name) as archive:
        [pth] = [n for n in archive.namelist() if n.endswith(".pth")]
        assert archive.read(pth) == b"import __editable___nkibuild_softmax_kernels_finder\n"
        finder = archive.read("__editable___nkibuild_softmax_kernels_finder.py").decode()
    assert repr(str(root / "build" / "bundle" / "softmax-kernels")) in finder
    assert "\nimport os; open(" not in finder  # the newline is an escape in a literal


def test_the_size_guard_states_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "nkibuild.yaml"
    path.write_text("# padding\n" * (MAX_BYTES // 10 + 1))
    with pytest.raises(ManifestError) as caught:
        load_yaml(path)
    assert f"{MAX_BYTES // 10 * 10 + 10} bytes, more than the {MAX_BYTES} allowed" in str(
        caught.value.diagnostics[0]
    )


@pytest.mark.parametrize(
    ("document", "aliases"),
    [
        ("a: [" + ",".join(["0"] * 100_001) + "]\n", False),
        ("a: {" + ",".join(f"k{i}: 0" for i in range(50_001)) + "}\n", False),
        ("a: &a [" + ",".join(["0"] * 60_000) + "]\nb: *a\n", True),
        (
            "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
            + "\n".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 10)),
            True,
        ),
        # Anchors present but unused for the excess: the document itself is too big.
        ("x: &x 1\ny: *x\na: [" + ",".join(["0"] * 100_001) + "]\n", False),
    ],
    ids=["long-list", "wide-mapping", "one-alias", "billion-laughs", "unused-anchor"],
)
def test_the_value_guard_blames_aliases_only_when_they_caused_it(
    document: str, aliases: bool
) -> None:
    with pytest.raises(ManifestError) as caught:
        parse_yaml(document.encode(), "nkibuild.yaml")
    [diagnostic] = caught.value.diagnostics
    assert "100000 values (the limit)" in diagnostic.message
    blamed = diagnostic.hint is not None and "anchors and aliases" in diagnostic.hint
    assert blamed == aliases, (diagnostic.message, diagnostic.hint)
