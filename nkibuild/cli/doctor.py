"""`nkibuild doctor`: the toolchain report, where this host's NEFF caches are, and the
runtime binding bundles get in this environment."""

from __future__ import annotations

import json
import os
from typing import Any

from nkibuild.settings import (
    ENV_CACHE_DIR,
    ENV_CACHE_READ_ONLY,
    ENV_REMOTE_CACHE,
    TRUE_WORDS,
    BuildOptions,
    default_cache_dir,
    value_before_manifest,
)


def report(toolchain: str | None = None) -> dict[str, Any]:
    """The JSON document of `doctor --json`, for the toolchain `--toolchain` (None: not
    given) selects as a build would: the option, else NKIBUILD_TOOLCHAIN, else auto."""
    from nkibuild.bundle.runtime import runtime_binding
    from nkibuild.toolchain.doctor import diagnose

    selected = value_before_manifest(BuildOptions(toolchain=toolchain), "toolchain")
    runtime = runtime_binding().report()  # this interpreter's, as a bundle run here gets it
    return {**diagnose(selected), "caches": caches(), "runtime": runtime}


def caches() -> dict[str, Any]:
    """The caches a build here would use by default: what the environment says.

    A build's --cache-dir, --remote-cache and the manifest's `cache:` can change them;
    doctor reports the host, not a project.
    """
    environ = os.environ
    local = default_cache_dir()
    remote = environ.get(ENV_REMOTE_CACHE) or None
    read_only = environ.get(ENV_CACHE_READ_ONLY, "").strip().lower() in TRUE_WORDS
    return {
        "local": {
            "path": str(local),
            "from": ENV_CACHE_DIR if environ.get(ENV_CACHE_DIR) else "the user cache directory",
            "exists": local.is_dir(),
        },
        "remote": {
            "url": _shown_url(remote) if remote else None,
            "from": ENV_REMOTE_CACHE if remote else None,
        },
        "read_only": read_only,
    }


def render(document: dict[str, Any]) -> list[str]:
    from nkibuild.toolchain.doctor import render as render_toolchain

    local, remote = document["caches"]["local"], document["caches"]["remote"]
    created = "" if local["exists"] else ", not created yet"
    lines = [f"local NEFF cache: {local['path']} (from {local['from']}{created})"]
    if remote["url"] is None:
        lines.append(
            "remote NEFF cache: none in the environment (a build also takes --remote-cache "
            "or the manifest's `cache: remote:`)"
        )
    else:
        lines.append(f"remote NEFF cache: {remote['url']} (from {remote['from']})")
    if document["caches"]["read_only"]:
        lines.append("caches are read-only (NKIBUILD_CACHE_READ_ONLY)")
    runtime = document["runtime"]
    double = " (nkibuild's toolchain double)" if runtime["double"] else ""
    lines.append(
        f"runtime binding for bundles here: {runtime['binding'] or 'none'}{double}: "
        f"{runtime['why']}"
        + ("" if runtime["binding"] else "; bundles run their references (auto mode)")
    )
    return [*render_toolchain(document), *lines]


def run(as_json: bool, toolchain: str | None = None) -> int:
    """Print the report; always exit 0 (it reports, it does not check)."""
    document = report(toolchain)
    if as_json:
        print(json.dumps(document, indent=2))
    else:
        print("\n".join(render(document)))
    return 0


def _shown_url(url: str) -> str:
    """`url` without credentials, as the cache's messages show it."""
    try:
        from nkibuild.cache.remote import public_url
    except ImportError:  # no [remote] extra: show the scheme only, the rest may hold secrets
        return url.partition("://")[0] + "://..."
    return public_url(url)
