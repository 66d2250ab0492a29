"""`nkibuild release` over a generated monorepo: discovery, all-errors-first validation,
one graph with shared kernels compiled once, dist/ contents, reports and --check."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import run_nkibuild
from helpers import monorepo

RELEASE = ["release", ".", "--out", "dist-all", "--toolchain", "fake", "-j", "2"]


def compiles(counter: Path) -> int:
    return len(counter.read_text().splitlines()) if counter.exists() else 0


def test_discovery_skips_hidden_build_venv_and_ignored_dirs(tmp_path: Path) -> None:
    from nkibuild.release.discover import discover

    root = monorepo(tmp_path / "repo")
    found = [p.relative_to(root).as_posix() for p in discover(root)]
    assert found == ["kernels/alpha/nkibuild.yaml", "kernels/beta/nkibuild.yaml"]


HOSTILE_DIR_NAMES = (
    "ignorés",
    "日本語",
    "with space",
    "tab\there",
    'quo"te',
    "back\\slash",
    "new\nline",
)


def test_discovery_honours_gitignore_for_any_directory_name(tmp_path: Path) -> None:
    """git quotes such names in its plain answer; each ignored one must still be skipped,
    and the same names not ignored still found."""
    import subprocess

    from nkibuild.release.discover import discover

    root = tmp_path / "repo"
    for name in HOSTILE_DIR_NAMES:
        for place in ("ignored", "kept"):
            (root / place / name).mkdir(parents=True)
            (root / place / name / "nkibuild.yaml").write_text("format-version: 1\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_bytes(b"/ignored/*\n")
    found = {p.parent.relative_to(root) for p in discover(root)}
    assert found == {Path("kept", name) for name in HOSTILE_DIR_NAMES}


def test_release_builds_everything_once_and_writes_dist(tmp_path: Path) -> None:
    root = monorepo(tmp_path / "repo")
    counter = tmp_path / "compiles"
    result = run_nkibuild(RELEASE, root, env={"NKIBUILD_FAKE_CC_COUNTER": str(counter)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert compiles(counter) == 3  # one softmax per target, shared by both projects
    out = root / "dist-all"
    wheels = sorted(p.name for p in out.glob("*.whl"))
    assert wheels == ["alpha_kernels-1.0.0-py3-none-any.whl", "beta_kernels-1.0.0-py3-none-any.whl"]
    sums = dict(
        reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines()
    )
    assert sums == {w: hashlib.sha256((out / w).read_bytes()).hexdigest() for w in wheels}
    report = json.loads((out / "release-report.json").read_text())
    assert report["ok"] and report["totals"]["units"] == 6
    assert report["totals"]["compiled"] + report["totals"]["cache_hits"] == 6
    assert report["totals"]["compiled"] == 3
    units = {(p["name"], u["target"]): u for p in report["projects"] for u in p["units"]}
    assert set(units) == {
        (n, t) for n in ("alpha-kernels", "beta-kernels") for t in ("trn1", "trn2", "trn3")
    }
    assert all(
        u["compiler_version"] == "2.23.0.0+nkibuild.fake" and u["neff_bytes"] > 0
        for u in units.values()
    )
    markdown = (out / "release-report.md").read_text()
    assert "| alpha-kernels 1.0.0 | softmax/default/trn2 | done |" in markdown


def test_check_passes_after_a_release_and_fails_on_any_change(tmp_path: Path) -> None:
    root = monorepo(tmp_path / "repo")
    check = [*RELEASE, "--check"]
    before = run_nkibuild(check, root)
    assert before.returncode == 1 and "would run" in before.stdout
    assert run_nkibuild(RELEASE, root).returncode == 0
    assert run_nkibuild(check, root).returncode == 0
    reference = root / "kernels" / "alpha" / "kernels" / "reference.py"
    reference.write_text(reference.read_text() + "\n# changed\n")
    after = run_nkibuild(check, root)
    assert after.returncode == 1 and "alpha-kernels/bundle would run" in after.stdout
    # Releasing the change under the same version is refused, not overwritten.
    released = root / "dist-all" / "alpha_kernels-1.0.0-py3-none-any.whl"
    original = released.read_bytes()
    again = run_nkibuild(RELEASE, root)
    assert again.returncode == 1 and "bump the version" in again.stderr
    assert released.read_bytes() == original


def test_every_invalid_manifest_is_reported_before_anything_builds(tmp_path: Path) -> None:
    root = monorepo(tmp_path / "repo")
    for name in ("alpha", "beta"):
        manifest = root / "kernels" / name / "nkibuild.yaml"
        manifest.write_text(manifest.read_text().replace("trn3", "trn9"))
    result = run_nkibuild(RELEASE, root)
    assert result.returncode == 2
    assert "2 problems in the manifest" in result.stderr
    assert "kernels/alpha/nkibuild.yaml:3:" in result.stderr
    assert "kernels/beta/nkibuild.yaml:3:" in result.stderr
    assert not (root / "kernels" / "alpha" / "build").exists()


def test_a_version_already_in_dist_from_elsewhere_is_refused_before_building(
    tmp_path: Path,
) -> None:
    root = monorepo(tmp_path / "repo")
    (root / "dist-all").mkdir()
    (root / "dist-all" / "beta_kernels-1.0.0-py3-none-any.whl").write_bytes(b"from elsewhere")
    result = run_nkibuild(RELEASE, root)
    assert result.returncode == 2
    assert "holds beta_kernels-1.0.0-py3-none-any.whl: the same versions" in result.stderr
    assert "not published as these files by a release into it" in result.stderr
    assert not (root / "kernels" / "alpha" / "build" / "compile").exists()  # nothing built


def test_duplicate_distributions_are_refused(tmp_path: Path) -> None:
    root = monorepo(tmp_path / "repo")
    beta = root / "kernels" / "beta" / "nkibuild.yaml"
    beta.write_text(beta.read_text().replace("beta-kernels", "Alpha_Kernels"))
    result = run_nkibuild(RELEASE, root)
    assert (
        result.returncode == 2
        and "two projects build the distribution 'alpha-kernels'" in result.stderr
    )


@pytest.mark.parametrize(
    ("flags", "wheels", "targets"),
    [
        (
            ["--only", "beta-kernels"],
            ["beta_kernels-1.0.0-py3-none-any.whl"],
            {"trn1", "trn2", "trn3"},
        ),
        (
            ["--targets", "trn2"],
            ["alpha_kernels-1.0.0-py3-none-any.whl", "beta_kernels-1.0.0-py3-none-any.whl"],
            {"trn2"},
        ),
    ],
)
def test_only_and_targets_select(
    tmp_path: Path, flags: list[str], wheels: list[str], targets: set[str]
) -> None:
    root = monorepo(tmp_path / "repo")
    result = run_nkibuild([*RELEASE, *flags], root)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (root / "dist-all").glob("*.whl")) == wheels
    report = json.loads((root / "dist-all" / "release-report.json").read_text())
    assert {u["target"] for p in report["projects"] for u in p["units"]} == targets


def test_shards_are_deterministic_balanced_and_cover_every_unit_once() -> None:
    from nkibuild.release.shard import ShardUnit, assign, balance

    units = [
        ShardUnit(f"p/compile:k{i}/default/trn{i % 3 + 1}", float(1 + (i * 7) % 13))
        for i in range(60)
    ]
    shards = assign(units, 4)
    assert assign(list(reversed(units)), 4) == shards  # the order they come in does not matter
    tasks = [u.task for shard in shards for u in shard]
    assert sorted(tasks) == sorted(u.task for u in units) and len(set(tasks)) == len(tasks)
    assert balance(shards) <= 1.05


def test_two_phase_release_shards_then_packages_with_zero_compiles(tmp_path: Path) -> None:
    """CI matrix: shards on separate machines fill a shared remote cache; a final job on
    yet another machine, from a fresh checkout, compiles nothing and packages."""
    remote = (tmp_path / "remote-cache").as_uri()
    counts = []
    for job in ("shard-1", "shard-2", "final"):
        root = monorepo(tmp_path / job / "repo")
        counter = tmp_path / f"{job}.compiles"
        env = {
            "NKIBUILD_CACHE_DIR": str(tmp_path / job / "local-cache"),
            "NKIBUILD_REMOTE_CACHE": remote,
            "NKIBUILD_FAKE_CC_COUNTER": str(counter),
        }
        shard = ["--shard", f"{job[-1]}/2"] if job != "final" else []
        result = run_nkibuild([*RELEASE, *shard], root, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        if shard:
            assert f"shard {job[-1]}/2: 3 compile units" in result.stdout
            assert not (root / "dist-all").exists()  # shards package nothing
        counts.append(compiles(counter))
    # 3 distinct NEFFs (both projects share the kernel): the second shard finds its
    # units in the remote cache; the final job compiles nothing.
    assert sum(counts[:2]) == 3 and counts[2] == 0
    report = json.loads((root / "dist-all" / "release-report.json").read_text())
    assert report["totals"]["compiled"] == 0 and report["totals"]["cache_hits"] == 6
    assert len(list((root / "dist-all").glob("*.whl"))) == 2


def test_the_ci_workflow_template_uses_real_options() -> None:
    """docs/ci/release.yml: valid YAML whose nkibuild commands the CLI accepts."""
    import shlex

    import yaml

    from nkibuild.cli.main import build_parser

    workflow = yaml.safe_load((Path(__file__).parents[1] / "docs/ci/release.yml").read_text())
    commands = [
        step["run"]
        for job in workflow["jobs"].values()
        for step in job["steps"]
        if step.get("run", "").startswith("nkibuild ")
    ]
    assert len(commands) == 2
    for command in commands:
        words = shlex.split(command.replace("${{ matrix.shard }}", "1"))
        build_parser().parse_args(words[1:])  # exits (fails the test) on an unknown option
