"""`nkibuild doctor`: which toolchain pieces this host has and what `auto` would pick.

`diagnose()` returns a JSON-ready document (`doctor --json` prints it as it is);
`render()` turns it into the lines `doctor` prints.
"""

from __future__ import annotations

import contextlib
import importlib.util
import platform
import sys
from importlib import metadata
from typing import Any

from nkibuild import __version__
from nkibuild.errors import ToolchainError
from nkibuild.toolchain import NO_COMPILER_HELP, find_compiler, read_compiler_version
from nkibuild.toolchain.nki import NO_ROUTE, detect

PRODUCT_NAME_FILE = "/sys/devices/virtual/dmi/id/product_name"
# (import name, distribution, what nkibuild uses it for)
PIECES = (
    ("jax", "jax", "jax frontend (traces on CPU)"),
    ("nki", "nki", "nki frontend, simulate mode"),
    ("nkipy", "nkipy", "nkipy frontend; nki kernels with nki >= 0.4 (its NKI op)"),
    ("torch_xla", "torch-xla", "nki kernels with Neuron SDK 2.29 or earlier (graph extraction)"),
    ("spike", None, "running NEFFs on a device (from aws-neuron/nkipy, not PyPI)"),
)
# nkibuild's optional extras (pyproject.toml): (extra, (import name, distribution)..., use)
EXTRAS = (
    ("remote", (("fsspec", "fsspec"), ("s3fs", "s3fs")), "a remote NEFF cache (--remote-cache)"),
    ("ray", (("ray", "ray"),), "compiles on a Ray cluster (--executor ray)"),
    ("sign", (("sigstore", "sigstore"),), "signed provenance (release --sign)"),
)


def instance_type() -> str | None:
    try:
        with open(PRODUCT_NAME_FILE, encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def diagnose(toolchain: str = "auto") -> dict[str, Any]:
    """The host's report for the selected `toolchain` (auto, neuron, fake): with fake,
    a piece the toolchain double stands in for is not missing."""
    compiler = find_compiler()
    stand_ins = double_stand_ins() if toolchain == "fake" else frozenset()
    nki = detect(toolchain)
    return {
        "nkibuild": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "instance_type": instance_type(),
        "toolchain": toolchain,
        "neuronx_cc": _compiler(compiler),
        "packages": {
            module: {
                "version": _version(module, dist),
                "for": purpose,
                "stand_in": module in stand_ins,
            }
            for module, dist, purpose in PIECES
        },
        "extras": {
            extra: {
                "installed": all(_version(m, d) is not None for m, d in packages),
                "packages": {dist: _version(module, dist) for module, dist in packages},
                "for": purpose,
            }
            for extra, packages, purpose in EXTRAS
        },
        "nki_route": {
            "nki": nki.version,
            "route": nki.route,
            "says": nki.describe() if nki.route else f"nki kernels: {NO_ROUTE}",
        },
        "toolchain_auto": {
            "compiler": str(compiler) if compiler else None,
            "stops_with": None if compiler else NO_COMPILER_HELP,
        },
    }


def render(report: dict[str, Any]) -> list[str]:
    python = report["python"]
    instance = report["instance_type"] or "unknown (not an EC2 Neuron instance)"
    lines = [
        f"nkibuild {report['nkibuild']} on Python {python['version']} ({python['executable']})",
        f"host instance type: {instance}",
        _compiler_line(report["neuronx_cc"]),
    ]
    lines += [_package_line(module, piece) for module, piece in report["packages"].items()]
    lines += [_extra_line(name, extra) for name, extra in report["extras"].items()]
    lines += report["nki_route"]["says"].splitlines()
    auto = report["toolchain_auto"]
    if auto["compiler"] is None:
        lines.append("--toolchain auto: would stop with this message:")
        lines += [f"  {line}" for line in auto["stops_with"].splitlines()]
    else:
        lines.append(f"--toolchain auto: uses the real compiler at {auto['compiler']}")
    return lines


def double_stand_ins() -> frozenset[str]:
    """The modules `--toolchain fake` puts on a frontend worker's path where they are not
    installed: its packages in toolchain_double's fakes dir and fake nkipy."""
    from nkibuild import toolchain_double

    dirs = (toolchain_double.FAKES_DIR, toolchain_double.FAKE_NKIPY_DIR)
    return frozenset(entry.name for d in dirs for entry in d.iterdir() if entry.is_dir())


def _package_line(module: str, piece: dict[str, Any]) -> str:
    if piece["version"] is not None:
        return f"{module}: {piece['version']} — {piece['for']}"
    if piece["stand_in"]:
        return f"{module}: not installed; --toolchain fake's double stands in — {piece['for']}"
    return f"{module}: not importable — needed for {piece['for']}"


def _compiler(compiler: Any) -> dict[str, str | None]:
    if compiler is None:
        return {"path": None, "version": None, "problem": "not found"}
    try:
        return {"path": str(compiler), "version": read_compiler_version((str(compiler),)),
                "problem": None}  # fmt: skip
    except ToolchainError as error:
        return {"path": str(compiler), "version": None, "problem": f"unusable: {error}"}


def _compiler_line(found: dict[str, str | None]) -> str:
    if found["path"] is None:
        return "neuronx-cc: not found"
    return f"neuronx-cc: {found['path']} ({found['version'] or found['problem']})"


def _extra_line(name: str, extra: dict[str, Any]) -> str:
    packages = extra["packages"]
    if extra["installed"]:
        versions = ", ".join(f"{dist} {version}" for dist, version in packages.items())
        return f"extra [{name}]: installed ({versions}) — {extra['for']}"
    missing = ", ".join(dist for dist, version in packages.items() if version is None)
    return (
        f"extra [{name}]: not installed ({missing} missing) — needed for {extra['for']}: "
        f"pip install 'nkibuild[{name}]'"
    )


def _version(module: str, distribution: str | None) -> str | None:
    """The installed version, "unknown version" without package metadata, None if absent."""
    if importlib.util.find_spec(module) is None:
        return None
    version = "unknown version"
    if distribution:
        with contextlib.suppress(metadata.PackageNotFoundError):
            version = metadata.version(distribution)
    return version
