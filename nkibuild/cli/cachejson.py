"""`nkibuild cache ACTION --json`: the cache command with one JSON document on stdout."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any


def cache(args: argparse.Namespace) -> int:
    from nkibuild.cli import commands

    if not args.json:
        return commands.cache(args)
    # The action's own lines (what it removed or found corrupt) go to stderr, so that a
    # script reads stdout as JSON whatever the action printed.
    with contextlib.redirect_stdout(sys.stderr):
        code = commands.cache(args)
    print(json.dumps({"action": args.action, "ok": code == 0, **state(args)}, indent=2))
    return code


def state(args: argparse.Namespace) -> dict[str, Any]:
    """The local cache after the action: where it is, its entries and their size."""
    from nkibuild.cache import LocalCache
    from nkibuild.settings import default_cache_dir

    store = LocalCache(args.cache_dir or default_cache_dir())
    entries = store.entries()
    return {
        "root": str(store.root),
        "entries": len(entries),
        "bytes": sum(entry.size for entry in entries),
    }
