"""Content-addressed NEFF caches: build dir -> local -> remote -> compile.

`CacheKey` names a NEFF by everything that determines it; each tier (`LocalCache`,
`RemoteCache`) implements `NeffStore`; `CacheChain` looks them up in order and
publishes results to every writable tier.
"""

from __future__ import annotations

import importlib
from typing import Any

# Each public name and the module that defines it, imported on first use (PEP 562): a
# build that compiles nothing does not load the tiers.
_HOMES = {
    "CacheChain": "chain",
    "open_cache_chain": "chain",
    "CacheKey": "key",
    "file_sha256": "key",
    "UNFINISHED_AFTER_S": "local",
    "CacheEntry": "local",
    "LocalCache": "local",
    "NeffStore": "store",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
