"""A small, reproducible wheel writer for generated bundles.

Standard backends always deflate, which costs time and gains nothing on
NEFFs (their payload is already gzip); they also need SOURCE_DATE_EPOCH or VCS
tweaks to be reproducible. This writer stores a file when deflating does not
pay, sorts entries, and fixes every timestamp, so equal inputs give a
byte-identical wheel. Names, versions and tags come from `packaging`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.tags import Tag
from packaging.utils import canonicalize_name
from packaging.version import Version

from nkibuild import __version__
from nkibuild.bundle import BundleProject
from nkibuild.errors import BuildError, UsageError
from nkibuild.fsutil import atomic_output
from nkibuild.manifest.model import Package
from nkibuild.text import printable

TAG = Tag("py3", "none", "any")
DEFAULT_EPOCH = 315532800  # 1980-01-01, the earliest time a zip entry can carry
ENTRY_POINT_GROUP = "nkibuild.bundles"
# Deflate a file only if a sample from its middle shrinks at least this much. The middle:
# a NEFF's 1 KB header compresses well, its gzip payload (most of the file) does not.
MIN_DEFLATE_GAIN = 0.05
SAMPLE_BYTES = 1 << 14

if TYPE_CHECKING:
    from nkibuild.context import BuildContext


def wheel_file_name(package: Package) -> str:
    distribution = canonicalize_name(package.name).replace("-", "_")
    return f"{distribution}-{Version(package.version)}-{TAG}.whl"


def run(context: BuildContext) -> list[Path]:
    """The wheel stage of a build: the generated bundle project -> its wheels in dist/."""
    from nkibuild.bundle import load_bundle

    bundle_dir = context.layout.bundle_dir(context.manifest)
    return build_wheels(load_bundle(bundle_dir), context.layout.dist_dir)


def build_wheels(project: BundleProject, dist_dir: Path) -> list[Path]:
    """The bundle's wheel, and one per target when its NEFFs are split out."""
    return [build_wheel(each, dist_dir) for each in (project, *project.parts)]


def build_wheel(project: BundleProject, dist_dir: Path) -> Path:
    package = project.package
    file_name = wheel_file_name(package)
    dist_info = file_name.rsplit("-", 3)[0] + ".dist-info"
    members = [
        (path, sha256)
        for path, sha256 in project.files
        if path.startswith(f"{package.import_name}/")
    ]
    generated = {
        f"{dist_info}/METADATA": metadata(project).encode(),
        f"{dist_info}/WHEEL": _wheel_file().encode(),
    }
    if project.target is None:  # tools discover bundles, not their NEFF parts
        generated[f"{dist_info}/entry_points.txt"] = _entry_points(package.import_name).encode()
    destination = dist_dir / file_name
    with atomic_output(destination) as tmp:
        _write_zip(tmp, project.directory, members, generated, f"{dist_info}/RECORD")
    return destination


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
    package, info = project.package, project.build_info
    requirements = info.requirements if info else ()  # a part carries NEFFs only
    lines = [
        *core_metadata(package),
        *(f"Requires-Dist: {requirement}" for requirement in requirements),
    ]
    for part in project.parts:
        target = part.target
        pin = f"{part.package.name}=={Version(part.package.version)}"
        lines += [
            f'Requires-Dist: {pin}; extra == "{target}"',
            f'Requires-Dist: {pin}; extra == "all"',
        ]
    lines += [f"Provides-Extra: {extra}" for extra in _extras(project)]
    if package.neuron_sdk:
        lines.append(f"Requires-External: neuron-sdk ({specifier(package.neuron_sdk)})")
    targets = _targets(project)
    lines += [
        f"Keywords: neuron,nki,trainium,{','.join(targets)}",
        f"Platform: {', '.join(targets)}",
    ]
    return "\n".join(lines) + "\n"


def _targets(project: BundleProject) -> list[str]:
    """The targets whose NEFFs the distribution carries."""
    if project.target:
        return [project.target]
    return project.build_info.targets() if project.build_info else []


def _extras(project: BundleProject) -> list[str]:
    targets = [part.target for part in project.parts if part.target]
    return [*targets, "all"] if targets else []


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


def _wheel_file() -> str:
    return (
        "Wheel-Version: 1.0\n"
        f"Generator: nkibuild {__version__}\n"
        "Root-Is-Purelib: true\n"
        f"Tag: {TAG}\n"
    )


def _entry_points(import_name: str) -> str:
    return f"[{ENTRY_POINT_GROUP}]\n{import_name} = {import_name}\n"


# The last second a ZIP member's date can hold (2107-12-31 23:59:58 UTC).
LAST_ZIP_EPOCH = 4354819198


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


def _date_time() -> tuple[int, int, int, int, int, int]:
    import time

    return time.gmtime(source_epoch())[:6]


def _write_zip(
    target: Path,
    root: Path,
    members: Iterable[tuple[str, str]],
    generated: dict[str, bytes],
    record_name: str,
) -> None:
    """Members (path, sha256 recorded by the bundle stage) one at a time, then metadata,
    then RECORD. A member whose bytes no longer match its recorded sha256 was changed
    after the bundle was generated: refuse to package it."""
    stamp = _date_time()
    record = []
    with zipfile.ZipFile(target, "w") as archive:
        for name, recorded in sorted(members):
            data = (root / name).read_bytes()
            digest = hashlib.sha256(data).digest()
            if recorded and digest.hex() != recorded:
                raise BuildError(
                    f"{root / name} changed after the bundle was generated (sha256 differs "
                    "from bundle.json); rebuild the bundle instead of editing its files"
                )
            record.append(_write_member(archive, name, data, stamp, digest))
        for name, data in sorted(generated.items()):
            record.append(_write_member(archive, name, data, stamp, hashlib.sha256(data).digest()))
        record.append(f"{record_name},,")
        listing = ("\n".join(record) + "\n").encode()
        _write_member(archive, record_name, listing, stamp, None)


def _write_member(
    archive: zipfile.ZipFile, name: str, data: bytes, stamp: tuple[int, ...], digest: bytes | None
) -> str:
    """Write one entry with fixed metadata; return its RECORD line (RECORD has no hash)."""
    info = zipfile.ZipInfo(name, date_time=stamp)  # type: ignore[arg-type]
    info.external_attr = 0o644 << 16
    info.compress_type = _compression(data)
    archive.writestr(info, data)
    if digest is None:
        return ""
    encoded = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    return f"{name},sha256={encoded},{len(data)}"


def _compression(data: bytes) -> int:
    if len(data) < 2 * SAMPLE_BYTES:
        return zipfile.ZIP_DEFLATED  # small files: deflating them costs nothing worth saving
    middle = len(data) // 2
    sample = data[middle : middle + SAMPLE_BYTES]
    gained = 1 - len(zlib.compress(sample, 1)) / len(sample)
    return zipfile.ZIP_DEFLATED if gained >= MIN_DEFLATE_GAIN else zipfile.ZIP_STORED
