"""Content-addressed NEFF caches: build dir -> local -> remote -> compile.

`CacheKey` names a NEFF by everything that determines it; each tier (`LocalCache`,
`RemoteCache`) implements `NeffStore`; `CacheChain` looks them up in order and
publishes results to every writable tier.
"""

from nkibuild.cache.chain import CacheChain, open_cache_chain
from nkibuild.cache.key import CacheKey, file_sha256
from nkibuild.cache.local import UNFINISHED_AFTER_S, CacheEntry, LocalCache
from nkibuild.cache.store import NeffStore

__all__ = [
    "UNFINISHED_AFTER_S",
    "CacheChain",
    "CacheEntry",
    "CacheKey",
    "LocalCache",
    "NeffStore",
    "file_sha256",
    "open_cache_chain",
]
