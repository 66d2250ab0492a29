"""What an entry must prove before its NEFF is used: its record, its key, its signature.

`entry.json` is data anyone with write access to a shared cache could have written.
`parse_record` accepts it only if it is bounded JSON of the documented shape, records
exactly the key that was looked up (an entry copied under another key is refused),
and, with a shared secret configured, carries a valid HMAC-SHA256 over the whole
record, which includes the NEFF's sha256. The NEFF itself is then checked against
that sha256 by the tier (see docs/cache.md, "Trust").
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nkibuild.cache.key import FAILURE_INPUT, CacheKey
from nkibuild.cache.store import ENTRY_FILE, CorruptEntry
from nkibuild.confine import read_regular
from nkibuild.errors import UsageError
from nkibuild.formats.jsonlimits import JsonLimitError, JsonLimits, load_json

MAX_NEFF_BYTES = 4 << 30  # what a cache hands out; a kernel NEFF is far smaller
MAX_RECORD_BYTES = 1 << 20
RECORD_JSON = JsonLimits(
    max_bytes=MAX_RECORD_BYTES, max_depth=16, max_int_digits=20, allow_nonfinite=False
)
ENV_KEY = "NKIBUILD_CACHE_HMAC_KEY"
ENV_KEY_FILE = "NKIBUILD_CACHE_HMAC_KEY_FILE"
ENV_REQUIRE = "NKIBUILD_REQUIRE_SIGNED_CACHE"
MIN_SECRET_BYTES = 16
MAX_KEY_FILE_BYTES = 4096
_SIGNATURE_CONTEXT = b"nkibuild cache entry v1\n"  # a MAC of nothing else can pass for it

_HEX64 = re.compile(r"[0-9a-f]{64}")
_TEXT_FIELDS = ("unit", "compiler_version")
MAX_TEXT = 1000
MAX_LOG_TAIL = 16_000  # characters of a failed compile's log kept in its record
MAX_SECONDS = 10.0**9  # 30 years


class CacheConfigError(UsageError):
    """Cache signing settings that cannot be used (a missing or too short key)."""


@dataclass(frozen=True)
class CacheTrust:
    """The shared secret entries are signed with, and whether unsigned ones are refused."""

    secret: bytes | None = None
    require_signed: bool = False

    def sign(self, record: Mapping[str, Any], vouched: bool) -> dict[str, Any]:
        """`record`, signed only if this build `vouched` for it (it compiled the NEFF, or
        fetched it with a signature that verified under this secret): an entry keeps the
        trust it arrived with, and an unsigned one fetched is never made signed."""
        unsigned = {k: v for k, v in record.items() if k != "signature"}
        if self.secret is None or not vouched:
            return unsigned
        return {**unsigned, "signature": _mac(self.secret, unsigned)}

    def vouches(self, record: Mapping[str, Any]) -> bool:
        """Whether a record this trust accepted (`check`) is signed under its secret:
        with a secret, `check` refuses every signature that does not verify."""
        return self.secret is not None and record.get("signature") is not None

    def check(self, record: Mapping[str, Any]) -> None:
        signature = record.get("signature")
        if signature is None:
            if self.require_signed:
                raise CorruptEntry("it is unsigned and signed entries are required")
            return
        if not isinstance(signature, str) or not _HEX64.fullmatch(signature):
            raise CorruptEntry(f"{ENTRY_FILE} has a malformed signature")
        if self.secret is None:
            return  # cannot check it; nothing was asked of it either
        unsigned = {k: v for k, v in record.items() if k != "signature"}
        if not hmac.compare_digest(signature, _mac(self.secret, unsigned)):
            raise CorruptEntry("its signature does not verify (another key, or altered)")


NO_SIGNING = CacheTrust()


def _mac(secret: bytes, record: Mapping[str, Any]) -> str:
    canonical = json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hmac.new(secret, _SIGNATURE_CONTEXT + canonical.encode(), hashlib.sha256).hexdigest()


def parse_record(raw: bytes, digest: str, trust: CacheTrust) -> dict[str, Any]:
    """The validated entry.json of the entry stored under `digest`; CorruptEntry if not."""
    try:
        record = load_json(raw, RECORD_JSON)
    except JsonLimitError as error:
        raise CorruptEntry(f"unreadable {ENTRY_FILE} ({error})") from None
    if not isinstance(record, dict):
        raise CorruptEntry(f"{ENTRY_FILE} is not an object")
    if _check_key(record, digest):
        _check_failure(record.get("failure"))
    else:
        _check_neff_fields(record)
    _check_meta(record)
    trust.check(record)
    return record


def _check_neff_fields(record: Mapping[str, Any]) -> None:
    sha256 = record.get("sha256")
    if not isinstance(sha256, str) or not _HEX64.fullmatch(sha256):
        raise CorruptEntry(f"{ENTRY_FILE} records no valid sha256")
    size = record.get("size")
    if size is not None and not _in_range(size, 0, MAX_NEFF_BYTES):
        raise CorruptEntry(f"{ENTRY_FILE} records an invalid size ({_short(size)})")
    if "failure" in record:
        raise CorruptEntry(f"{ENTRY_FILE} records a compile failure under a NEFF's key")


def _check_failure(failure: object) -> None:
    """A failed compile's record: its exit status (a failure of its own: 1 to 255) and
    the message and log tail it was reported with, bounded text."""
    texts = ("message", "log_tail")
    if not (
        isinstance(failure, dict)
        and set(failure) == {"returncode", *texts}
        and _in_range(failure["returncode"], 1, 255)
        and all(isinstance(failure[t], str) and len(failure[t]) <= MAX_LOG_TAIL for t in texts)
    ):
        raise CorruptEntry(f"{ENTRY_FILE} records no valid compile failure")


def _check_key(record: Mapping[str, Any], digest: str) -> bool:
    """The entry must be for this key: its recorded inputs hash to the digest looked up.
    Whether the key is one a compile failure is recorded under (`CacheKey.failure`)."""
    inputs = record.get("key")
    if record.get("digest") != digest or not isinstance(inputs, dict):
        raise CorruptEntry(f"{ENTRY_FILE} is for another key ({_short(record.get('digest'))})")
    if CacheKey(tuple(sorted(inputs.items()))).digest != digest:
        raise CorruptEntry(f"{ENTRY_FILE}'s recorded key inputs do not hash to its key")
    return inputs.get(FAILURE_INPUT) == "failure"


def _check_meta(record: Mapping[str, Any]) -> None:
    for field in _TEXT_FIELDS:
        value = record.get(field)
        if value is not None and not (isinstance(value, str) and len(value) <= MAX_TEXT):
            raise CorruptEntry(f"{ENTRY_FILE}: {field} is not a string ({_short(value)})")
    seconds = record.get("compile_seconds")
    if seconds is not None and not _in_range(seconds, 0, MAX_SECONDS, (int, float)):
        raise CorruptEntry(f"{ENTRY_FILE}: compile_seconds is invalid ({_short(seconds)})")
    memory = record.get("peak_memory")
    if memory is not None and not _in_range(memory, 0, 2**63 - 1):
        raise CorruptEntry(f"{ENTRY_FILE}: peak_memory is invalid ({_short(memory)})")


def check_size(size: int, record: Mapping[str, Any]) -> None:
    """Before reading: a NEFF larger than its record says is refused unread (a 10 GB
    sparse file under a small entry). The sha256 decides the rest; the size is only
    the reading bound."""
    recorded = record.get("size")
    if recorded is not None and size > recorded:
        raise CorruptEntry(f"its NEFF is {size} bytes, more than the recorded {recorded}")


def caller_meta(record: Mapping[str, Any]) -> dict[str, Any]:
    """What a hit returns: the validated fields only (nothing unknown travels on)."""
    fields = ("key", "digest", "sha256", "size", *_TEXT_FIELDS, "compile_seconds", "peak_memory")
    fields += ("failure", "signature")  # checked whole by parse_record (see `vouches`)
    return {name: record[name] for name in fields if record.get(name) is not None}


def _in_range(value: object, low: float, high: float, kinds: tuple[type, ...] = (int,)) -> bool:
    """`value` of one of `kinds` exactly (not a bool), from `low` to `high` (not NaN)."""
    return type(value) in kinds and low <= value <= high  # type: ignore[operator]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- configuration ---------------------------------------------------------------------


def trust_from_environment(environ: Mapping[str, str] | None = None) -> CacheTrust:
    """The signing settings: a secret from NKIBUILD_CACHE_HMAC_KEY or from the file named
    by NKIBUILD_CACHE_HMAC_KEY_FILE, and NKIBUILD_REQUIRE_SIGNED_CACHE. Errors name the
    setting, never the secret."""
    from nkibuild.settings import parse_flag

    env = os.environ if environ is None else environ
    text, path = env.get(ENV_KEY) or None, env.get(ENV_KEY_FILE) or None
    if text is not None and path is not None:
        raise CacheConfigError(f"set one of {ENV_KEY} and {ENV_KEY_FILE}, not both")
    raw = os.fsencode(text) if text is not None else None
    if path is not None:  # a bounded regular file (secret mounts are often symlinks: followed)
        expanded = Path(path).expanduser()
        try:
            raw = read_regular(expanded, MAX_KEY_FILE_BYTES)
        except OSError as error:
            raise CacheConfigError(
                f"{ENV_KEY_FILE} ({expanded}): {error.strerror or error}"
            ) from None
    # One normalisation for both sources: surrounding whitespace (a file's newline, a
    # variable set from one) is not part of the key, so both sign and verify alike.
    secret = raw.strip() if raw is not None else None
    if secret is not None and len(secret) < MIN_SECRET_BYTES:
        where = ENV_KEY if text is not None else f"{ENV_KEY_FILE} ({path})"
        raise CacheConfigError(
            f"the cache signing key in {where} is {len(secret)} bytes; use at least "
            f"{MIN_SECRET_BYTES} (e.g. the output of `openssl rand -hex 32`)"
        )
    try:
        required = parse_flag(env.get(ENV_REQUIRE, ""))
    except ValueError as error:
        raise CacheConfigError(f"{ENV_REQUIRE}={env.get(ENV_REQUIRE)!r}: {error}") from None
    if required and secret is None:
        raise CacheConfigError(
            f"signed cache entries are required ({ENV_REQUIRE} or --require-signed-cache) "
            f"but no key is set: set {ENV_KEY} or {ENV_KEY_FILE} (--cache-key-file)"
        )
    return CacheTrust(secret, required)
