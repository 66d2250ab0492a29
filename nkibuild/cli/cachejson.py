"""What `nkibuild cache` says about the cache after its action: the document
`--json` prints, and the lines `cache stats` prints for each tier (entries, size,
hits over the last builds)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from nkibuild.cache.stats import read_log
from nkibuild.quantities import format_size
from nkibuild.settings import default_cache_dir


def state(args: argparse.Namespace, usage: tuple[int, int]) -> dict[str, Any]:
    """The local cache after the action: where it is, its entries and their size; and per
    tier its entries (the remote's with --remote-cache) and counts over the last builds."""
    local_dir = args.cache_dir or default_cache_dir()
    entries, size = usage
    log = read_log(local_dir)
    totals = log.totals()
    for notice in log.notices:
        print(f"warning: {notice}", file=sys.stderr)
    tiers = {
        "local": {"location": str(local_dir), "entries": entries, "bytes": size},
        "remote": _remote_usage(args),
    }
    return {
        "root": str(local_dir),
        "entries": entries,
        "bytes": size,
        "builds": len(log.builds),
        "tiers": {name: {**tier, **totals[name].to_json()} for name, tier in tiers.items()},
    }


def stats_lines(args: argparse.Namespace, usage: tuple[int, int]) -> list[str]:
    """`cache stats` without --json: one line per tier after the entries line."""
    document = state(args, usage)
    builds = document["builds"]
    lines = [f"hits over the last {builds} build{'s' * (builds != 1)} that used the cache:"]
    for name, tier in document["tiers"].items():
        lines.append(f"  {name + ':':<8}{_tier_line(tier)}")
    return lines


def _tier_line(tier: dict[str, Any]) -> str:
    rate = tier["hit_rate"]
    shown = f"{rate:.0%} of {tier['lookups']} lookups" if rate is not None else "no lookups"
    line = f"{tier['hits']} hits, {tier['misses']} misses, {tier['errors']} errors ({shown})"
    if tier["write_errors"]:
        line += f", {tier['write_errors']} failed uploads"
    if tier["failures"]:
        line += f", {tier['failures']} known compile failures reported"
    if tier["entries"] is not None:
        line += f"; {tier['entries']} entries, {format_size(tier['bytes'])} at {tier['location']}"
    return line


def _remote_usage(args: argparse.Namespace) -> dict[str, Any]:
    """The remote's location, entries and bytes (a listing of its prefix), with
    --remote-cache only; None where unknown (with a warning saying why)."""
    url = getattr(args, "remote_cache", None)
    if not url:
        return {"location": None, "entries": None, "bytes": None}
    from nkibuild.cache.remote import RemoteCache, public_url

    location = public_url(url)
    try:
        entries, size = RemoteCache(url, read_only=True).usage()
    # Remote filesystems raise their own exception types (botocore, aiohttp, ...).
    except Exception as error:
        print(f"warning: could not list the remote cache at {location}: {error}", file=sys.stderr)
        entries = size = None
    return {"location": location, "entries": entries, "bytes": size}
