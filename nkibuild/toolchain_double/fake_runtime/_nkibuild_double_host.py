"""The host the toolchain double's runtime stands in for, as a test configures it: what a
bundle's preflight reads from a real host's hardware (the EC2 instance type) and runtime
(its version, which neither spike nor nrtpy reports). None where not configured."""

import os


def reported_host() -> tuple[str | None, str | None]:
    """(instance type, e.g. trn2.48xlarge; runtime version, e.g. 2.29.0)."""
    instance = os.environ.get("NKIBUILD_FAKE_RUNTIME_INSTANCE")
    return instance or None, os.environ.get("NKIBUILD_FAKE_RUNTIME_VERSION") or None
