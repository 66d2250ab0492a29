"""The host the toolchain double's runtime stands in for, as a test configures it.

A bundle asks this (only when its runtime binding's core is the double) for what a real
host answers from its hardware and libnrt: the EC2 instance type, and the runtime's
version (neither spike nor nrtpy reports one). Unset, the double is no Neuron host and
reports no version. The runtime's LNC is NEURON_LOGICAL_NC_CONFIG, as on a real host.
"""

import os

INSTANCE_ENV = "NKIBUILD_FAKE_RUNTIME_INSTANCE"  # e.g. trn2.48xlarge
VERSION_ENV = "NKIBUILD_FAKE_RUNTIME_VERSION"  # e.g. 2.29.0


def reported_host() -> tuple[str | None, str | None]:
    """(instance type, runtime version), each None where not configured."""
    return os.environ.get(INSTANCE_ENV) or None, os.environ.get(VERSION_ENV) or None
