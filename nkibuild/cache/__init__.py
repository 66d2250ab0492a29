"""Content-addressed NEFF caches: build dir -> local -> remote -> compile.

`CacheKey` names a NEFF by everything that determines it; each tier (`LocalCache`,
`RemoteCache`) implements `NeffStore`; `CacheChain` looks them up in order and
publishes results to every writable tier.
"""

from __future__ import annotations

from nkibuild.exports import lazy_exports

# Each public name and the module that defines it (nkibuild.exports).
_HOMES = {
    "CacheChain": "chain",
    "open_cache_chain": "chain",
    "CacheKey": "key",
    "file_sha256": "key",
    "UNFINISHED_AFTER_S": "local",
    "LocalCache": "local",
}
__all__ = sorted(_HOMES)

__getattr__ = lazy_exports(__name__, _HOMES)
