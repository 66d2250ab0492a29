"""A release is whole or not at all (issue 30, class 3, and last round's `--check` item):
no wheel without its NEFFs, no two projects installing the same thing, no released
version replaced (PEP 440 equality), an interrupted release reruns to completion, every
wheel in --out stays verifiable, and `dirty` names the materials that are not committed."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import failed, monorepo, ok, softmax_manifest, softmax_project
from test_provenance import RELEASE, committed_monorepo, git, statement_of

from nkibuild.errors import UsageError
from nkibuild.release import ReleaseOptions, load_projects, preflight
from nkibuild.settings import BuildOptions

ALPHA = "alpha_kernels-1.0.0-py3-none-any.whl"
BETA = "beta_kernels-1.0.0-py3-none-any.whl"


def options(root: Path, **chosen: object) -> ReleaseOptions:
    return ReleaseOptions(root, root / "dist-all", build=BuildOptions(toolchain="fake"), **chosen)  # type: ignore[arg-type]


def project(root: Path, package: str, targets: str = "[trn1, trn2, trn3]") -> None:
    softmax_project(root, softmax_manifest(package, defaults=f"{{targets: {targets}}}"))


# --- no wheel without its NEFFs --------------------------------------------------------------


@pytest.mark.parametrize(
    ("targets", "only", "refusal"),
    [
        (("trn9",), (), "--targets trn9: no selected project builds for it"),
        (("trn3",), (), "gamma-kernels's wheels would have no NEFF for softmax/default"),
        (("trn2",), (), "split-kernels's wheels would have no NEFF for its trn1 part"),
        (("trn1", "trn2"), ("split-kernels",), "no NEFF for its trn3 part"),
    ],
)
def test_a_selection_that_leaves_a_wheel_without_neffs_is_refused(
    tmp_path: Path, targets: tuple[str, ...], only: tuple[str, ...], refusal: str
) -> None:
    root = tmp_path / "repo"
    project(root / "alpha", "{name: alpha-kernels, version: 1.0.0}")
    project(root / "gamma", "{name: gamma-kernels, version: 1.0.0}", "[trn1, trn2]")
    project(root / "split", "{name: split-kernels, version: 1.0.0, split-targets: true}")
    with pytest.raises(UsageError) as raised:
        load_projects(options(root, targets=targets, only=only))
    assert refusal in str(raised.value)


def test_a_selection_every_wheel_of_which_is_whole_is_released(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    project(root / "alpha", "{name: alpha-kernels, version: 1.0.0}")
    project(root / "split", "{name: split-kernels, version: 1.0.0, split-targets: true}", "[trn2]")
    chosen = load_projects(options(root, targets=("trn2",)))
    assert {u.name for p in chosen for u in p.units} == {"softmax/default/trn2"}
    refused = failed(run_nkibuild([*RELEASE, "--targets", "trn3"], root), 2)
    assert "split-kernels's wheels would have no NEFF for softmax/default" in refused.stderr
    assert not (root / "dist-all").exists()
    assert not (root / "alpha" / "build" / "compile").exists()  # nothing built


# --- two projects, one distribution or import package ----------------------------------------


@pytest.mark.parametrize(
    ("first", "second", "claim"),
    [
        ("{name: alpha, version: 1.0.0}", "{name: Alpha, version: 2.0.0}", "distribution 'alpha'"),
        (
            "{name: alpha, version: 1.0.0, split-targets: true}",
            "{name: alpha-trn2, version: 1.0.0}",
            "distribution 'alpha-trn2'",
        ),
        (
            "{name: alpha, version: 1.0.0, split-targets: true}",
            "{name: other, version: 1.0.0, import-name: alpha_trn1}",
            "import package 'alpha_trn1'",
        ),
        (
            "{name: alpha, version: 1.0.0}",
            "{name: beta, version: 1.0.0, import-name: Alpha}",
            "import package 'alpha'",
        ),
    ],
)
def test_two_projects_installing_the_same_thing_are_refused(
    tmp_path: Path, first: str, second: str, claim: str
) -> None:
    root = tmp_path / "repo"
    project(root / "one", first)
    project(root / "two", second)
    with pytest.raises(UsageError, match="two projects build the") as raised:
        preflight(load_projects(options(root)), options(root))
    assert claim in str(raised.value)
    assert "one/nkibuild.yaml" in str(raised.value) and "two/nkibuild.yaml" in str(raised.value)


# --- never replace a released version (PEP 440) ----------------------------------------------


@pytest.mark.parametrize(
    ("held", "refused"),
    [
        ("alpha_kernels-1.0-py3-none-any.whl", True),
        ("alpha_kernels-1.0.0.0-py3-none-any.whl", True),
        ("Alpha_Kernels-01.0-py3-none-any.whl", True),
        ("alpha_kernels-1.0.0-py2.py3-none-any.whl", True),
        ("alpha_kernels-1.0.0.post1-py3-none-any.whl", False),
        ("alpha_kernels-1.0.0+local-py3-none-any.whl", False),
        ("alpha_kernels-1.0.1-py3-none-any.whl", False),
        ("not a wheel name.whl", False),
    ],
)
def test_a_pep_440_equal_version_in_out_is_never_replaced(
    tmp_path: Path, held: str, refused: bool
) -> None:
    root = tmp_path / "repo"
    project(root / "alpha", "{name: alpha-kernels, version: 1.0.0}")
    out = root / "dist-all"
    out.mkdir()
    (out / held).write_bytes(b"released before")
    digest = hashlib.sha256(b"released before").hexdigest()
    (out / "SHA256SUMS").write_text(f"{digest}  {held}\n")  # a release into OUT published it
    chosen = load_projects(options(root))
    if not refused:
        preflight(chosen, options(root))
        return
    with pytest.raises(UsageError) as raised:
        preflight(chosen, options(root))
    assert f"{held} (the version of {ALPHA})" in str(raised.value)


# --- an interrupted release reruns to completion ---------------------------------------------

KILLED_AT = """
import os, signal, sys
import nkibuild.release as release
import nkibuild.release.provenance as provenance
from nkibuild.cli.main import main

where, copies = sys.argv[1], []

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if where == "statement":
    provenance.write_statement = die
else:
    import nkibuild.fsutil as fsutil
    real = fsutil.atomic_copy
    def copy(source, destination, **kwargs):
        if len(copies) == int(where):
            die()
        copies.append(destination)
        real(source, destination, **kwargs)
    fsutil.atomic_copy = copy
sys.exit(main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed monorepo whose release graph is up to date (released into dist-first)."""
    root = committed_monorepo(tmp_path_factory.mktemp("built") / "repo")
    ok(run_nkibuild([*RELEASE[:3], "dist-first", *RELEASE[4:]], root))
    return root


@pytest.mark.parametrize("killed_at", ["0", "1", "statement"])
def test_a_release_killed_while_publishing_reruns_to_completion(
    built: Path, killed_at: str
) -> None:
    out = built / "dist-all"
    shutil.rmtree(out, ignore_errors=True)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_AT, killed_at, *RELEASE],
        cwd=built,
        capture_output=True,
        text=True,
        check=False,
    )
    assert killed.returncode == -9, killed.stderr
    listed = [line.split("  ")[1] for line in (out / "SHA256SUMS").read_text().splitlines()]
    assert listed == [ALPHA, BETA]  # written before any wheel was copied
    assert failed(run_nkibuild([*RELEASE, "--check"], built), 1)
    ok(run_nkibuild(RELEASE, built))
    assert ok(run_nkibuild([*RELEASE, "--check"], built)).stdout.endswith("up to date\n")
    for wheel in (ALPHA, BETA):
        assert (out / wheel).read_bytes() == (built / "dist-first" / wheel).read_bytes()


# --- every wheel in --out stays verifiable; --check fails on wheels no release built ---------


def bump(root: Path, version: str) -> None:
    for name in ("alpha", "beta"):
        manifest = root / "kernels" / name / "nkibuild.yaml"
        manifest.write_text(
            re.sub(r"version: [0-9.]+}", f"version: {version}}}", manifest.read_text())
        )
        reference = root / "kernels" / name / "kernels" / "reference.py"
        reference.write_text(reference.read_text() + f"# {version}\n")  # other materials


def test_earlier_releases_in_out_stay_verifiable(tmp_path: Path) -> None:
    root = committed_monorepo(tmp_path / "repo")
    out = root / "dist-all"
    ok(run_nkibuild(RELEASE, root))
    bump(root, "1.0.1")
    ok(run_nkibuild(RELEASE, root))
    bump(root, "1.0.2")
    ok(run_nkibuild(RELEASE, root))
    ok(run_nkibuild(RELEASE, root))  # a rerun keeps no statement twice
    wheels = sorted(out.glob("*.whl"))
    assert len(wheels) == 6
    kept = sorted(out.glob("provenance-*.intoto.json"))
    assert len(kept) == 2
    checked = ok(run_nkibuild(["verify-provenance", "--json", *map(str, wheels)], root))
    statements = {
        Path(c["wheel"]).name: Path(c["statement"]).name for c in json.loads(checked.stdout)
    }
    assert (
        statements[ALPHA] == statements[BETA] != statements["alpha_kernels-1.0.1-py3-none-any.whl"]
    )
    assert statements["beta_kernels-1.0.2-py3-none-any.whl"] == "provenance.intoto.json"
    assert ok(run_nkibuild([*RELEASE, "--check"], root)).stdout.endswith("up to date\n")


def resummed(out: Path) -> None:
    """SHA256SUMS rewritten for whatever wheels OUT holds (as someone covering tracks)."""
    wheels = sorted(out.glob("*.whl"))
    lines = [f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in wheels]
    (out / "SHA256SUMS").write_text("".join(lines))


@pytest.mark.parametrize("foreign", ["renamed copy", "another release", "junk", "rebuilt"])
def test_release_check_fails_on_a_wheel_no_release_into_out_built(
    built: Path, tmp_path: Path, foreign: str
) -> None:
    out = tmp_path / "out"
    shutil.copytree(built / "dist-first", out)
    check = [*RELEASE[:3], str(out), *RELEASE[4:], "--check"]
    assert ok(run_nkibuild(check, built)).stdout.endswith("up to date\n")
    if foreign == "renamed copy":
        wheel = out / "gamma_kernels-1.0.0-py3-none-any.whl"
        shutil.copyfile(out / ALPHA, wheel)
    elif foreign == "another release":  # a real nkibuild wheel, from elsewhere
        other = monorepo(tmp_path / "other")
        ok(run_nkibuild([*RELEASE, "--only", "alpha-kernels", "--targets", "trn1"], other))
        wheel = out / "alpha_kernels-0.9.0-py3-none-any.whl"
        shutil.copyfile(other / "dist-all" / ALPHA, wheel)
    else:
        wheel = out / ("x-1.0-py3-none-any.whl" if foreign == "junk" else BETA)
        if wheel.exists():
            wheel.unlink()
        wheel.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip
    resummed(out)
    result = failed(run_nkibuild(check, built), 1)
    assert f"{wheel.name}: sha256 " in result.stdout
    assert "is not a subject" in result.stdout or "published it under that name" in result.stdout


# --- dirty names the materials that are not as committed -------------------------------------


def test_dirty_names_each_material_not_as_committed(tmp_path: Path) -> None:
    root = committed_monorepo(tmp_path / "repo")
    alpha, beta = root / "kernels" / "alpha", root / "kernels" / "beta"
    git(root, "rm", "-q", "--cached", "kernels/alpha/kernels/reference.py")  # untracked
    with (root / ".gitignore").open("a") as ignore:
        ignore.write("kernels/beta/kernels/reference.py\n")
    git(root, "rm", "-q", "--cached", "kernels/beta/kernels/reference.py")  # ignored
    git(root, "add", ".gitignore")
    git(root, "commit", "-q", "-m", "untrack the references")
    (beta / "nkibuild.yaml").write_text((beta / "nkibuild.yaml").read_text() + "# edited\n")
    (alpha / "nkibuild.yaml").write_text((alpha / "nkibuild.yaml").read_text() + "# staged\n")
    git(root, "add", "kernels/alpha/nkibuild.yaml")
    ok(run_nkibuild(RELEASE, root))
    source = statement_of(root)["predicate"]["buildDefinition"]["externalParameters"]["source"]
    assert source["dirty"] is True
    assert source["dirtyMaterials"] == {
        "kernels/alpha/kernels/reference.py": "not in the commit",
        "kernels/alpha/nkibuild.yaml": "differs from the commit",
        "kernels/beta/kernels/reference.py": "not in the commit",
        "kernels/beta/nkibuild.yaml": "differs from the commit",
    }
    assert "materials not as committed" in source["detail"]
    assert "kernels/beta/nkibuild.yaml" in source["detail"]
    dependencies = statement_of(root)["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert dependencies[0]["annotations"] == {"dirty": True}


# --- what is hashed is read as a bounded regular file ----------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "SHA256SUMS a FIFO"])
def test_a_planted_wheel_that_is_no_regular_file_is_refused_not_hashed_forever(
    built: Path, tmp_path: Path, kind: str
) -> None:
    """Every sha256 nkibuild takes (outputs, cache entries, wheels in --out) goes through
    the bounded reader: a FIFO or a device named *.whl is an error, never a hang."""
    import os

    out = tmp_path / "out"
    shutil.copytree(built / "dist-first", out)
    planted = out / ("SHA256SUMS" if kind.startswith("SHA") else ALPHA)  # ALPHA is listed
    planted.unlink()
    if kind in ("fifo", "SHA256SUMS a FIFO"):
        os.mkfifo(planted)
    elif kind == "dev-zero":
        planted.symlink_to("/dev/zero")
    else:
        planted.mkdir()
    check = [*RELEASE[:3], str(out), *RELEASE[4:], "--check"]
    result = subprocess.run(
        [sys.executable, "-m", "nkibuild", *check],
        cwd=built,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode in (1, 2), result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert planted.name in result.stdout + result.stderr
