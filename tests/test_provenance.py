"""Release provenance: the in-toto/SLSA statement `nkibuild release` writes, the summary each
bundle records in `_build.json`, `nkibuild verify-provenance`, and sigstore signing."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import run_nkibuild
from helpers import monorepo, softmax_manifest, softmax_project

from nkibuild.release.provenance import source_revision

RELEASE = ["release", ".", "--out", "dist-all", "--toolchain", "fake", "-j", "2"]
ALPHA = "alpha_kernels-1.0.0-py3-none-any.whl"
BETA = "beta_kernels-1.0.0-py3-none-any.whl"


def git(root: Path, *args: str) -> str:
    command = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    return subprocess.run(
        [*command, *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def committed_monorepo(root: Path) -> Path:
    """The release test monorepo with everything committed and its outputs ignored."""
    monorepo(root)
    (root / ".gitignore").write_text("ignored/\nbuild/\ndist-all/\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "kernels")
    return root


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed monorepo released once, clean: its root."""
    root = committed_monorepo(tmp_path_factory.mktemp("released") / "repo")
    result = run_nkibuild(RELEASE, root)
    assert result.returncode == 0, result.stdout + result.stderr
    return root


def statement_of(root: Path) -> dict[str, Any]:
    return json.loads((root / "dist-all" / "provenance.intoto.json").read_text())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_statement_names_each_wheel_and_what_it_was_built_from(released: Path) -> None:
    out = released / "dist-all"
    statement = statement_of(released)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [
        {"name": name, "digest": {"sha256": sha256(out / name)}} for name in (ALPHA, BETA)
    ]
    definition = statement["predicate"]["buildDefinition"]
    commit = git(released, "rev-parse", "HEAD")
    source = {"revision": commit, "dirty": False, "detail": commit, "dirtyMaterials": {}}
    assert definition["externalParameters"]["source"] == source
    dependencies = definition["resolvedDependencies"]
    assert dependencies[0] == {
        "name": "source",
        "digest": {"gitCommit": commit},
        "annotations": {"dirty": False},
    }
    files = {
        d["name"]: d["digest"]["sha256"] for d in dependencies if "sha256" in d.get("digest", {})
    }
    expected = [
        f"kernels/{p}/{f}"
        for p in ("alpha", "beta")
        for f in ("nkibuild.yaml", "kernels/reference.py", "kernels/softmax.hlo.pb")
    ]
    assert files == {name: sha256(released / name) for name in expected}
    tools = {
        (d["annotations"]["project"], d["uri"])
        for d in dependencies
        if d.get("uri", "")[:4] == "pkg:"
    }
    from nkibuild import __version__

    assert tools == {
        (project, uri)
        for project in ("alpha-kernels", "beta-kernels")
        for uri in (
            "pkg:pypi/neuronx-cc@2.23.0.0%2Bnkibuild.fake",
            f"pkg:pypi/nkibuild@{__version__}",
        )
    }
    run = statement["predicate"]["runDetails"]
    assert run["builder"] == {
        "id": "https://github.com/nkibuild/nkibuild",
        "version": {"nkibuild": __version__},
    }
    metadata = run["metadata"]
    assert metadata["invocationId"].startswith("urn:uuid:")
    assert metadata["startedOn"] <= metadata["finishedOn"]
    report = json.loads((out / "release-report.json").read_text())
    assert report["provenance"] == ["provenance.intoto.json"]
    assert "## Provenance\n\n- provenance.intoto.json\n" in (out / "release-report.md").read_text()


def test_verify_provenance_passes_the_released_wheels(released: Path) -> None:
    out = released / "dist-all"
    result = run_nkibuild(["verify-provenance", str(out / ALPHA), str(out / BETA)], released)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{ALPHA}: ok ({out / 'provenance.intoto.json'})"
    assert lines[1] == f"    sha256 {sha256(out / ALPHA)[:12]}… is a subject of the statement"
    assert lines[2] == "    3 materials and 2 tools agree"
    assert lines[3].startswith(f"{BETA}: ok")


def tampered_statement(root: Path, tmp_path: Path, edit: Any) -> Path:
    statement = statement_of(root)
    edit(statement)
    path = tmp_path / "edited.intoto.json"
    path.write_text(json.dumps(statement))
    return path


def test_a_statement_that_disagrees_with_the_wheel_is_named(released: Path, tmp_path: Path) -> None:
    def edit(statement: dict[str, Any]) -> None:
        for dependency in statement["predicate"]["buildDefinition"]["resolvedDependencies"]:
            if dependency["name"] == "kernels/alpha/nkibuild.yaml":
                dependency["digest"]["sha256"] = "0" * 64
            if dependency.get("annotations", {}).get("path") == "kernels/reference.py":
                dependency["annotations"]["project"] = "nobody"

    path = tampered_statement(released, tmp_path, edit)
    wheel = released / "dist-all" / ALPHA
    result = run_nkibuild(["verify-provenance", str(wheel), "--statement", str(path)], released)
    assert result.returncode == 1
    manifest = sha256(released / "kernels" / "alpha" / "nkibuild.yaml")
    zeros = "0" * 64
    assert result.stdout.splitlines()[1:] == [
        f"    sha256 {sha256(wheel)[:12]}… is a subject of the statement",
        f"    manifest nkibuild.yaml: the wheel records sha256 {manifest}, the statement {zeros}",
        "    source kernels/reference.py: in the wheel's _build.json, not in the statement",
    ]
    assert result.stdout.startswith(f"{ALPHA}: FAILED ({path})")


def test_a_wheel_the_release_did_not_build_is_refused(released: Path, tmp_path: Path) -> None:
    wheel = tmp_path / ALPHA
    shutil.copy(released / "dist-all" / ALPHA, wheel)
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("alpha_kernels/extra.py", "x = 1\n")
    statement = released / "dist-all" / "provenance.intoto.json"
    command = ["verify-provenance", str(wheel), "--statement", str(statement), "--json"]
    result = run_nkibuild(command, released)
    assert result.returncode == 1
    (check,) = json.loads(result.stdout)
    listed = sha256(released / "dist-all" / ALPHA)
    assert check["problems"] == [
        f"{ALPHA}: sha256 {sha256(wheel)} is not a subject; the statement lists {ALPHA} with "
        f"sha256 {listed}: this is not the wheel the release built"
    ]
    assert check["ok"] is False and check["wheel"] == str(wheel)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{", "is not JSON"),
        ('{"_type": "https://in-toto.io/Statement/v0.1"}', "is not an in-toto Statement v1"),
        (
            '{"_type": "https://in-toto.io/Statement/v1", "predicateType": '
            '"https://slsa.dev/provenance/v1", "subject": {}}',
            "subject is not a list of objects",
        ),
    ],
)
def test_a_statement_that_is_not_one_fails_the_check_with_its_problem(
    released: Path, tmp_path: Path, text: str, problem: str
) -> None:
    path = tmp_path / "statement.json"
    path.write_text(text)
    wheel = released / "dist-all" / ALPHA
    result = run_nkibuild(["verify-provenance", str(wheel), "--statement", str(path)], released)
    assert result.returncode == 1 and problem in result.stdout, result.stdout
    assert "Traceback" not in result.stderr


def test_a_missing_statement_or_wheel_is_a_usage_error(released: Path, tmp_path: Path) -> None:
    shutil.copy(released / "dist-all" / ALPHA, tmp_path / ALPHA)
    result = run_nkibuild(["verify-provenance", str(tmp_path / ALPHA)], released)
    assert result.returncode == 2
    assert f"{tmp_path / 'provenance.intoto.json'}: cannot read the provenance statement" in (
        result.stderr
    )
    result = run_nkibuild(["verify-provenance", str(tmp_path / "none.whl")], released)
    assert result.returncode == 2 and f"{tmp_path / 'none.whl'}: no such wheel" in result.stderr


def test_a_split_bundles_target_wheels_are_checked_by_digest(tmp_path: Path) -> None:
    manifest = softmax_manifest("{name: split-kernels, version: 0.2.0, split-targets: true}")
    root = softmax_project(tmp_path / "split", manifest)
    assert run_nkibuild(RELEASE, root).returncode == 0
    out = root / "dist-all"
    names = [s["name"] for s in statement_of(root)["subject"]]
    assert names == [
        "split_kernels-0.2.0-py3-none-any.whl",
        "split_kernels_trn1-0.2.0-py3-none-any.whl",
        "split_kernels_trn2-0.2.0-py3-none-any.whl",
    ]
    result = run_nkibuild(["verify-provenance", *(str(out / name) for name in names)], root)
    assert result.returncode == 0, result.stdout
    part = result.stdout.split("split_kernels_trn1-0.2.0-py3-none-any.whl: ok")[1]
    assert "no _build.json (a per-target NEFF part): its digest is all there is" in part
    assert result.stdout.splitlines()[2] == "    2 materials and 2 tools agree"  # manifest, HLO


def test_a_commit_changes_the_statement_but_not_the_wheels(tmp_path: Path) -> None:
    root = committed_monorepo(tmp_path / "repo")
    assert run_nkibuild(RELEASE, root).returncode == 0
    first = statement_of(root)
    wheel = (root / "dist-all" / ALPHA).read_bytes()
    (root / "README.md").write_text("docs\n")  # untracked: the work tree is dirty
    assert run_nkibuild(RELEASE, root).returncode == 0
    source = statement_of(root)["predicate"]["buildDefinition"]["externalParameters"]["source"]
    head = git(root, "rev-parse", "HEAD")
    assert source == {
        "revision": head,
        "dirty": True,
        "detail": f"{head} + 1 uncommitted or untracked paths",
        "dirtyMaterials": {},  # the README is no material
    }
    git(root, "add", "README.md")
    git(root, "commit", "-q", "-m", "docs")
    assert run_nkibuild(RELEASE, root).returncode == 0
    second = statement_of(root)
    assert (root / "dist-all" / ALPHA).read_bytes() == wheel  # no input changed
    assert second["subject"] == first["subject"]
    revisions = [
        s["predicate"]["buildDefinition"]["resolvedDependencies"][0] for s in (first, second)
    ]
    assert [r["digest"]["gitCommit"] for r in revisions] == [head, git(root, "rev-parse", "HEAD")]


def test_an_edited_source_is_rebuilt_into_the_bundle_and_the_statement(tmp_path: Path) -> None:
    root = committed_monorepo(tmp_path / "repo")
    assert run_nkibuild(RELEASE, root).returncode == 0
    reference = root / "kernels" / "beta" / "kernels" / "reference.py"
    reference.write_text(reference.read_text() + "# a comment\n")
    for name in ("alpha", "beta"):  # a new version, so the release may publish it
        manifest = root / "kernels" / name / "nkibuild.yaml"
        manifest.write_text(manifest.read_text().replace("1.0.0", "1.0.1"))
    result = run_nkibuild(RELEASE, root)
    assert result.returncode == 0, result.stderr
    dependencies = statement_of(root)["predicate"]["buildDefinition"]["resolvedDependencies"]
    listed = {d["name"]: d.get("digest", {}).get("sha256") for d in dependencies}
    assert listed["kernels/beta/kernels/reference.py"] == sha256(reference)
    wheels = sorted((root / "dist-all").glob("*-1.0.1-*.whl"))
    result = run_nkibuild(["verify-provenance", *map(str, wheels)], root)
    assert result.returncode == 0, result.stdout


def test_release_check_wants_every_wheel_in_the_statement(tmp_path: Path) -> None:
    root = committed_monorepo(tmp_path / "repo")
    assert run_nkibuild(RELEASE, root).returncode == 0
    statement = root / "dist-all" / "provenance.intoto.json"
    document = json.loads(statement.read_text())
    document["subject"] = document["subject"][:1]
    statement.write_text(json.dumps(document))
    result = run_nkibuild([*RELEASE, "--check"], root)
    assert result.returncode == 1
    assert f"{statement}: {BETA}: sha256 " in result.stdout
    statement.unlink()
    result = run_nkibuild([*RELEASE, "--check"], root)
    assert result.returncode == 1 and f"{statement} is missing" in result.stdout


def test_source_revision_outside_git_and_without_git(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    revision = source_revision(tmp_path)
    assert (revision.commit, revision.dirty) == (None, None)
    assert revision.detail == "no revision (not in a git work tree)"
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    assert source_revision(tmp_path).detail == "no revision (git is not installed)"


def test_a_release_without_git_says_so_in_the_statement(tmp_path: Path) -> None:
    root = monorepo(tmp_path / "repo")
    shutil.rmtree(root / ".git")
    assert run_nkibuild(RELEASE, root).returncode == 0
    definition = statement_of(root)["predicate"]["buildDefinition"]
    assert definition["externalParameters"]["source"] == {
        "revision": None,
        "dirty": None,
        "detail": "no revision (not in a git work tree)",
        "dirtyMaterials": {},
    }
    assert all(d.get("name") != "source" for d in definition["resolvedDependencies"])


# --- sigstore ------------------------------------------------------------------------------


NO_IDENTITY = {
    "SIGSTORE_IDENTITY_TOKEN": "",
    "ACTIONS_ID_TOKEN_REQUEST_URL": "",
    "GITHUB_ACTIONS": "",
}


@pytest.mark.parametrize(
    ("sigstore", "token", "message"),
    [
        (False, "", "--sign needs sigstore: pip install 'nkibuild[sign]'"),
        (True, "", "--sign needs an OIDC identity and found none"),
        (True, "not-a-jwt", "--sign: the OIDC identity is not usable: Identity token is malformed"),
    ],
)
def test_sign_is_refused_before_building_without_sigstore_or_a_usable_identity(
    tmp_path: Path, sigstore: bool, token: str, message: str
) -> None:
    if sigstore != _has_sigstore():
        pytest.skip(f"needs sigstore {'installed' if sigstore else 'absent'} (nkibuild[sign])")
    root = monorepo(tmp_path / "repo")
    env = {**NO_IDENTITY, "SIGSTORE_IDENTITY_TOKEN": token}
    result = run_nkibuild([*RELEASE, "--sign"], root, env=env)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (root / "dist-all").exists()


def test_sigstore_accepts_the_statement_as_an_in_toto_statement(released: Path) -> None:
    """sigstore's own model of a statement (what `sign_dsse` signs) takes ours, offline,
    and refuses what is not one. Signing itself needs an OIDC identity and the
    public-good Fulcio and Rekor: not tested here."""
    if not _has_sigstore():
        pytest.skip("sigstore is not installed (pip install 'nkibuild[sign]')")
    from sigstore.dsse import Statement
    from sigstore.errors import Error

    Statement((released / "dist-all" / "provenance.intoto.json").read_bytes())
    statement = statement_of(released)
    statement["subject"] = []  # in-toto requires a subject
    with pytest.raises(Error, match="malformed in-toto statement"):
        Statement(json.dumps(statement).encode())


def _has_sigstore() -> bool:
    import importlib.util

    return importlib.util.find_spec("sigstore") is not None


BUILD_JSON = "alpha_kernels/_build.json"


def damaged_member(data: bytearray, info: zipfile.ZipInfo, damage: str) -> None:
    """Damage one member of a wheel's bytes: its deflated data, or the compression
    method or encryption flag its central directory header gives."""
    if damage == "corrupt deflated data":
        start = info.header_offset + 30 + len(info.filename)
        data[start : start + info.compress_size] = bytes([0xFF]) * info.compress_size
        return
    entry = data.index(b"PK\x01\x02")
    while data[entry + 46 : entry + 46 + len(info.filename)] != info.filename.encode():
        entry = data.index(b"PK\x01\x02", entry + 1)
    if damage == "unknown compression":
        data[entry + 10 : entry + 12] = (99).to_bytes(2, "little")
    else:
        data[entry + 8] |= 0x01  # general purpose flag bit 0: encrypted


@pytest.mark.parametrize(
    "damage", ["corrupt deflated data", "unknown compression", "encrypted member"]
)
def test_a_wheel_whose_build_json_cannot_be_read_is_a_clear_error(
    released: Path, tmp_path: Path, damage: str
) -> None:
    wheel = tmp_path / ALPHA
    with zipfile.ZipFile(released / "dist-all" / ALPHA) as archive:
        info = archive.getinfo(BUILD_JSON)
    assert info.compress_type == zipfile.ZIP_DEFLATED
    data = bytearray((released / "dist-all" / ALPHA).read_bytes())
    damaged_member(data, info, damage)
    wheel.write_bytes(bytes(data))

    def vouch_for_it(statement: dict[str, Any]) -> None:
        statement["subject"].append({"name": ALPHA, "digest": {"sha256": sha256(wheel)}})

    path = tampered_statement(released, tmp_path, vouch_for_it)
    result = run_nkibuild(["verify-provenance", str(wheel), "--statement", str(path)], released)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{wheel}: not a readable wheel (" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("subject", "problem"),
    [
        ({"name": ALPHA, "digest": {"sha256": []}}, "subject[0].digest.sha256 is not a string"),
        (
            {"name": ALPHA, "digest": {"sha256": {"h": "0"}}},
            "subject[0].digest.sha256 is not a string",
        ),
        ({"name": ALPHA, "digest": ["sha256", "00"]}, "subject[0].digest is not an object"),
        ({"name": ALPHA}, "subject[0].digest is not an object"),
    ],
)
def test_a_subject_whose_digest_is_not_a_digest_set_is_a_malformed_statement(
    released: Path, tmp_path: Path, subject: dict[str, Any], problem: str
) -> None:
    def edit(statement: dict[str, Any]) -> None:
        statement["subject"].insert(0, subject)

    path = tampered_statement(released, tmp_path, edit)
    wheel = released / "dist-all" / ALPHA
    result = run_nkibuild(["verify-provenance", str(wheel), "--statement", str(path)], released)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"{ALPHA}: FAILED ({path})", f"    {path}: {problem}"]
    assert "Traceback" not in result.stderr
