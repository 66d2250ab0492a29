"""The release's provenance statement: an in-toto Statement v1, SLSA provenance v1.

Subjects are the wheels the release published, by name and sha256. The build
definition's resolvedDependencies are the source revision (git commit, with a dirty
flag) and, per project, the materials and tools its bundle recorded in `_build.json`
(read from the published wheel itself, so the statement says what the wheel says).
With `--sign`, sigstore signs the statement as a DSSE envelope (Fulcio certificate
for the ambient OIDC identity, Rekor entry) into `<statement>.sigstore.json`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nkibuild import __version__
from nkibuild.cache.key import file_sha256
from nkibuild.errors import NkibuildError, UsageError
from nkibuild.fsutil import atomic_copy, atomic_write_text
from nkibuild.verify.provenance import (
    PREDICATE_TYPE,
    STATEMENT_FILE,
    STATEMENT_TYPE,
    digests_of,
    project_dependencies,
    read_statement,
    wheel_build_info,
)

if TYPE_CHECKING:
    from sigstore.oidc import IdentityToken

    from nkibuild.release import ReleaseOptions, ReleaseResult

BUILD_TYPE = "https://github.com/nkibuild/nkibuild/blob/main/docs/release.md#provenance"
BUILDER_ID = "https://github.com/nkibuild/nkibuild"
SIGNATURE_SUFFIX = ".sigstore.json"
GIT_TIMEOUT = 60  # seconds; `git status` of a large work tree is slow, not stuck
IDENTITY_TOKEN_ENV = "SIGSTORE_IDENTITY_TOKEN"  # the variable sigstore's own CLI reads


class SigningError(NkibuildError):
    """The statement was written but could not be signed (exit 1)."""


@dataclass(frozen=True)
class SourceRevision:
    """The commit a release started from; `commit` None: why there is none."""

    commit: str | None
    dirty: bool | None  # uncommitted changes, untracked files, or materials not committed
    detail: str
    # Materials (path from the root -> why) that are not as the commit holds them.
    materials: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.commit,
            "dirty": self.dirty,
            "detail": self.detail,
            "dirtyMaterials": dict(self.materials),
        }


@dataclass(frozen=True)
class ReleaseStart:
    """What the statement needs from before the build: when, and from which revision."""

    started: datetime
    revision: SourceRevision


def start(root: Path) -> ReleaseStart:
    return ReleaseStart(datetime.now(timezone.utc), source_revision(root))


def source_revision(root: Path) -> SourceRevision:
    """The git commit checked out at `root` and whether the work tree differs from it;
    "no revision" (with the reason) outside a git work tree or without git."""
    inside = _git(root, "rev-parse", "--is-inside-work-tree")
    if isinstance(inside, str):
        return SourceRevision(None, None, f"no revision ({inside})")
    if inside.returncode != 0 or inside.stdout.strip() != "true":
        return SourceRevision(None, None, "no revision (not in a git work tree)")
    head = _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    if isinstance(head, str) or head.returncode != 0:
        return SourceRevision(None, None, "no revision (the git repository has no commit yet)")
    commit = head.stdout.strip()
    status = _git(root, "status", "--porcelain")
    if isinstance(status, str) or status.returncode != 0:
        return SourceRevision(commit, None, f"{commit} (could not tell whether it is dirty)")
    changes = len(status.stdout.splitlines())
    if not changes:
        return SourceRevision(commit, False, commit)
    return SourceRevision(commit, True, f"{commit} + {changes} uncommitted or untracked paths")


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str] | str:
    """git's answer, or why git could not be asked."""
    try:
        return subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        return "git is not installed"
    except subprocess.TimeoutExpired:
        return f"git did not answer within {GIT_TIMEOUT} s"
    except OSError as error:
        return f"git could not run: {error.strerror or error}"


def statement(
    result: ReleaseResult, options: ReleaseOptions, began: ReleaseStart
) -> dict[str, Any]:
    from nkibuild.release import staged_wheels

    subjects, dependencies = [], []
    root = options.root.resolve()
    for project in result.projects:
        directory = Path(os.path.relpath(project.manifest.root, root)).as_posix()
        names = {staged.name for staged in staged_wheels(project)}
        for wheel in sorted(path for path in result.published if path.name in names):
            subjects.append({"name": wheel.name, "digest": {"sha256": result.digests[wheel.name]}})
            info = wheel_build_info(wheel)
            if info is not None and info.provenance is not None:
                dependencies += project_dependencies(info, directory)
    revision = _with_materials(began.revision, root, dependencies)
    if revision.commit is not None:  # the source revision, before the materials
        source = {"gitCommit": revision.commit}
        dependencies.insert(
            0, {"name": "source", "digest": source, "annotations": {"dirty": revision.dirty}}
        )
    return {
        "_type": STATEMENT_TYPE,
        "subject": subjects,
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "command": "nkibuild release",
                    "projects": [p.manifest.package.name for p in result.projects],
                    "targets": list(options.targets) or "each project's own",
                    "toolchain": sorted({p.toolchain.name for p in result.projects}),
                    "source": revision.to_json(),
                },
                "internalParameters": {"python": platform.python_version()},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"nkibuild": __version__}},
                "metadata": {
                    "invocationId": _invocation_id(),
                    "startedOn": _timestamp(began.started),
                    "finishedOn": _timestamp(datetime.now(timezone.utc)),
                },
            },
        },
    }


def _with_materials(
    revision: SourceRevision, root: Path, materials: list[dict[str, Any]]
) -> SourceRevision:
    """The revision, dirty if a material the wheels recorded is not what the commit holds
    at its path: untracked or ignored (not in the commit), or other bytes."""
    if revision.commit is None:
        return revision
    recorded = {m["name"]: m["digest"]["sha256"] for m in materials if "digest" in m}
    committed = _committed_blobs(root, revision.commit)
    if committed is None:
        return replace(revision, dirty=None, detail=f"{revision.commit} (git could not list it)")
    as_built = [name for name in recorded if _sha256_of(root / name) == recorded[name]]
    hashed = _git(root, "hash-object", "--", *as_built)  # as the commit would store them
    blobs = dict(zip(as_built, getattr(hashed, "stdout", "").split(), strict=False))
    dirty = tuple(
        (name, "differs from the commit" if name in committed else "not in the commit")
        for name in sorted(recorded)
        if name not in committed or committed[name] != blobs.get(name)
    )
    if not dirty:
        return revision
    listed = ", ".join(name for name, _ in dirty)
    detail = (
        f"{revision.detail}; materials not as committed (untracked, ignored or changed): {listed}"
    )
    return replace(revision, dirty=True, detail=detail, materials=dirty)


def _committed_blobs(root: Path, commit: str) -> dict[str, str] | None:
    """Path from `root` -> git blob id of every file the commit holds under `root`."""
    listed = _git(root, "ls-tree", "-r", "-z", commit)
    if isinstance(listed, str) or listed.returncode != 0:
        return None
    entries = (line.partition("\t") for line in listed.stdout.split("\0") if line)
    return {path: meta.split()[2] for meta, _, path in entries}


def _sha256_of(path: Path) -> str | None:
    try:
        return file_sha256(path)
    except OSError:
        return None


def _invocation_id() -> str:
    """The CI run when there is one (GitHub Actions), else a fresh UUID."""
    server, repository = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    run_id, attempt = os.environ.get("GITHUB_RUN_ID"), os.environ.get("GITHUB_RUN_ATTEMPT", "1")
    if server and repository and run_id:
        return f"{server}/{repository}/actions/runs/{run_id}/attempts/{attempt}"
    return uuid.uuid4().urn


def _timestamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def write_statement(result: ReleaseResult, options: ReleaseOptions, began: ReleaseStart) -> Path:
    """The release's statement, as OUT's latest; the one it replaces is kept under a
    name of its own (`provenance-<sha256>.intoto.json`, with its signature) while it
    vouches for a wheel in OUT the new one does not, so every wheel stays verifiable."""
    path = options.out / STATEMENT_FILE
    document = statement(result, options, began)
    _keep_earlier(path, set(result.digests.values()) - digests_of(document))
    _signature(path).unlink(missing_ok=True)  # it signed the statement being replaced
    atomic_write_text(path, json.dumps(document, indent=2) + "\n")
    return path


def _keep_earlier(path: Path, uncovered: set[str]) -> None:
    try:
        earlier = digests_of(read_statement(path))
    except (UsageError, ValueError):
        return  # none, or not a statement nkibuild wrote
    if not earlier & uncovered:
        return
    name = f"provenance-{file_sha256(path)[:16]}.intoto.json"
    for source, kept in (
        (path, path.with_name(name)),
        (_signature(path), _signature(path.with_name(name))),
    ):
        if source.exists():
            atomic_copy(source, kept)


def _signature(statement_path: Path) -> Path:
    return statement_path.with_name(statement_path.name + SIGNATURE_SUFFIX)


def signing_identity() -> IdentityToken:
    """The OIDC identity `--sign` will use, found and checked before anything is built
    (UsageError: sigstore is not installed, there is no identity, or it is unusable)."""
    try:
        from sigstore.oidc import IdentityError, IdentityToken, detect_credential
    except ImportError:
        raise UsageError("--sign needs sigstore: pip install 'nkibuild[sign]'") from None
    try:
        token = os.environ.get(IDENTITY_TOKEN_ENV) or detect_credential()
        if not token:
            raise UsageError(
                "--sign needs an OIDC identity and found none: run in CI with one (GitHub "
                "Actions: `permissions: id-token: write`), or set "
                f"{IDENTITY_TOKEN_ENV} (e.g. `python -m sigstore get-identity-token`)"
            )
        return IdentityToken(token)
    except IdentityError as error:
        raise UsageError(f"--sign: the OIDC identity is not usable: {error}") from None


def sign_statement(path: Path, identity: IdentityToken) -> Path:
    """Sign the statement with sigstore (public-good instance); the bundle goes next to it."""
    from sigstore.dsse import Statement
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import ClientTrustConfig
    from sigstore.sign import SigningContext

    signature = _signature(path)
    try:
        payload = Statement(path.read_bytes())
        context = SigningContext.from_trust_config(ClientTrustConfig.production())
        with context.signer(identity) as signer:
            bundle = signer.sign_dsse(payload)
    except (SigstoreError, OSError) as error:  # requests' errors are OSErrors
        raise SigningError(f"{path} was written but not signed: {error}") from None
    atomic_write_text(signature, bundle.to_json())
    return signature
