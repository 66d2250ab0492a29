"""The wheel stage: a generated bundle -> a reproducible wheel, written whole each time.

Equal inputs give byte-identical wheels on any machine and through any route (`nkibuild
build`, `release`, the PEP 517 backend): members are sorted, every field a platform
could vary (timestamp, mode, creating system) is fixed, NEFFs are stored (their payload
is gzip already: deflating costs time and saves nothing) and everything else is
deflated at one fixed level. Names, versions and tags come from `packaging`.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import itertools
import os
import time
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from nkibuild import __version__
from nkibuild.bundle import BundleProject, load_bundle
from nkibuild.errors import BuildError, UsageError
from nkibuild.fsutil import atomic_output
from nkibuild.manifest.model import Package
from nkibuild.text import printable

if TYPE_CHECKING:
    from nkibuild.context import BuildContext

TAG = Tag("py3", "none", "any")
ENTRY_POINT_GROUP = "nkibuild.bundles"
DEFAULT_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can carry
LAST_ZIP_EPOCH = 4354819198  # 2107-12-31 23:59:58 UTC, the last a zip entry can carry
STORED_SUFFIXES = (".neff",)
# zlib's default level, named: the level is part of the wheel's bytes.
DEFLATE_LEVEL = 6
# ZipInfo defaults the creating system to the host's (0 on Windows): fixed to Unix so
# the header bytes do not depend on where the wheel was built.
UNIX = 3
FILE_MODE = 0o644 << 16


def wheel_file_name(package: Package) -> str:
    distribution = canonicalize_name(package.name).replace("-", "_")
    return f"{distribution}-{Version(package.version)}-{TAG}.whl"


def run(context: BuildContext) -> list[Path]:
    """The wheel stage of a build: the bundle's wheel in dist/, then one per target
    part when the bundle's NEFFs are split out."""
    project = load_bundle(context.layout.bundle_dir(context.manifest), build_info=False)
    return [build_wheel(each, context.layout.dist_dir) for each in (project, *project.parts)]


def build_wheel(project: BundleProject, dist_dir: Path) -> Path:
    """Write the distribution's wheel into `dist_dir`."""
    dist_info, generated = dist_info_files(project)
    # A generator: one bundle file in memory at a time, however many NEFFs there are.
    members = itertools.chain(_bundle_members(project), _hashed(generated))
    return _write_wheel(dist_dir / wheel_file_name(project.package), members, dist_info)


def build_editable_wheel(project: BundleProject, wheel_dir: Path) -> Path:
    """A PEP 660 editable wheel of the bundle: its metadata and a `.pth` file that puts
    the bundle's directory (and each target part's) on `sys.path`, so the installed
    package is the one in the build dir and every build updates it. The target parts
    are on that path, not requirements: there is no separate install of them."""
    dist_info, generated = dist_info_files(project, editable=True)
    directories = [project.directory, *(part.directory for part in project.parts)]
    # The .pth file only imports a module holding the paths as literals (editable.py).
    from nkibuild.bundle.editable import finder_module

    finder, source, import_line = finder_module(project.package.import_name, directories)
    generated[finder] = source.encode()
    generated[f"__editable__.{dist_info.removesuffix('.dist-info')}.pth"] = import_line.encode()
    return _write_wheel(wheel_dir / wheel_file_name(project.package), _hashed(generated), dist_info)


# A member: its name, bytes and sha256 (hashed once: the check and RECORD share it).
Member = tuple[str, bytes, bytes]


def _hashed(files: dict[str, bytes]) -> list[Member]:
    return [(name, data, hashlib.sha256(data).digest()) for name, data in sorted(files.items())]


def _bundle_members(project: BundleProject) -> Iterator[Member]:
    """The files of the distribution's import package, in name order, each checked
    against the sha256 the bundle stage recorded: a file changed since (edited by hand,
    damaged on disk) is refused, never shipped."""
    prefix = f"{project.package.import_name}/"
    for name, recorded in sorted(project.files):
        if name.startswith(prefix):
            try:
                data = (project.directory / name).read_bytes()
            except FileNotFoundError:
                raise BuildError(
                    f"{project.directory / name} was removed after the bundle was generated; "
                    "build again to write it back"
                ) from None
            digest = hashlib.sha256(data).digest()
            if digest.hex() != recorded:
                raise BuildError(
                    f"{project.directory / name} changed after the bundle was generated "
                    "(sha256 differs from bundle.json); rebuild the bundle instead of "
                    "editing its files"
                )
            yield name, data, digest


def _write_wheel(destination: Path, members: Iterable[Member], dist_info: str) -> Path:
    """The wheel of `members` in the order given, then RECORD listing them all; it
    replaces any file at `destination` only once complete and synced to disk."""
    date_time = time.gmtime(source_epoch())[:6]
    record = io.StringIO()
    rows = csv.writer(record, lineterminator="\n")
    record_name = f"{dist_info}/RECORD"
    with atomic_output(destination) as tmp, zipfile.ZipFile(tmp, "w") as archive:
        for name, data, digest in members:
            _add(archive, name, data, date_time)
            # urlsafe base64 without padding (PEP 376/427)
            encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
            rows.writerow([name, f"sha256={encoded}", len(data)])
        rows.writerow([record_name, "", ""])
        _add(archive, record_name, record.getvalue().encode(), date_time)
    return destination


def _add(archive: zipfile.ZipFile, name: str, data: bytes, date_time: tuple[int, ...]) -> None:
    info = zipfile.ZipInfo(name, date_time=date_time)  # type: ignore[arg-type]
    info.create_system = UNIX
    info.external_attr = FILE_MODE
    if name.endswith(STORED_SUFFIXES):
        archive.writestr(info, data, zipfile.ZIP_STORED)
    else:
        archive.writestr(info, data, zipfile.ZIP_DEFLATED, DEFLATE_LEVEL)


def source_epoch() -> int:
    """The timestamp of every archived file: SOURCE_DATE_EPOCH, never before 1980.

    The reproducible-builds spec makes it a decimal count of seconds; anything else
    (`1e9`, `yesterday`, 400 digits, a date past what a ZIP can hold) is an error
    naming the variable, not a traceback or a silently different archive."""
    text = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not text:  # unset or empty: unset, as in other tools
        return DEFAULT_EPOCH
    if not (text.isascii() and text.isdigit()):
        raise UsageError(
            f"SOURCE_DATE_EPOCH={text[:40]!r} is not a whole number of seconds "
            "since 1970 (e.g. SOURCE_DATE_EPOCH=$(git log -1 --format=%ct))"
        )
    if len(text) > 12 or int(text) > LAST_ZIP_EPOCH:
        raise UsageError(
            f"SOURCE_DATE_EPOCH={text[:40]} is after 2107, the last year a ZIP archive can record"
        )
    return max(int(text), DEFAULT_EPOCH)


def dist_info_files(
    project: BundleProject, *, editable: bool = False
) -> tuple[str, dict[str, bytes]]:
    """The `.dist-info` directory's name and its files besides RECORD. An editable
    wheel's metadata requires no target parts: its `.pth` file puts them on the path."""
    if editable:
        project = dataclasses.replace(project, parts=())
    package = project.package
    dist_info = wheel_file_name(package).rsplit("-", 3)[0] + ".dist-info"
    generated = {
        f"{dist_info}/METADATA": metadata(project).encode(),
        f"{dist_info}/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: nkibuild {__version__}\n"
            f"Root-Is-Purelib: true\nTag: {TAG}\n"
        ).encode(),
    }
    if project.target is None:  # tools discover bundles, not their NEFF parts
        name = package.import_name
        generated[f"{dist_info}/entry_points.txt"] = (
            f"[{ENTRY_POINT_GROUP}]\n{name} = {name}\n".encode()
        )
    return dist_info, generated


def core_metadata(package: Package) -> list[str]:
    """The fields every distribution of the package carries (wheel METADATA, sdist PKG-INFO)."""
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {package.name}",
        f"Version: {Version(package.version)}",
        f"Summary: {_one_line(package.description)}",
        f"Requires-Python: {specifier(package.requires_python)}",
    ]
    if package.license:
        lines.append(f"License: {_one_line(package.license)}")
    return lines


def metadata(project: BundleProject) -> str:
    package = project.package
    lines = [
        *core_metadata(package),
        *(f"Requires-Dist: {requirement}" for requirement in project.requirements),
    ]
    for part in project.parts:
        pin = f"{part.package.name}=={Version(part.package.version)}"
        lines += [f'Requires-Dist: {pin}; extra == "{extra}"' for extra in (part.target, "all")]
    if project.parts:
        extras = (*(part.target for part in project.parts), "all")
        lines += [f"Provides-Extra: {extra}" for extra in extras]
    if package.neuron_sdk:
        lines.append(f"Requires-External: neuron-sdk ({specifier(package.neuron_sdk)})")
    targets = project.targets
    lines += [
        f"Keywords: neuron,nki,trainium,{','.join(targets)}",
        f"Platform: {', '.join(targets)}",
    ]
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    """A header value: whitespace runs (line breaks too) become one space, and control
    characters are escaped, so a value can neither end the headers nor add one."""
    return printable(" ".join(text.split()))


def specifier(text: str) -> str:
    """A version specifier set as packaging writes it: no spaces, no line breaks (the
    manifest's `>=3.10\\n` would otherwise end METADATA's headers). Text packaging
    cannot parse (the manifest check refuses it) is still kept on one line."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    try:
        return str(SpecifierSet(text))
    except InvalidSpecifier:
        return _one_line(text)
