"""nkibuild: a declarative build system for AWS Neuron kernels."""

import os

__version__ = "0.1.0"


def code_digest() -> str:
    """The stats of nkibuild's own Python files, hashed. What was planned or written by
    other code (a development checkout, a patched install) is stale even within one
    version: the graph snapshot, the plan cache, the bundle and the wheel."""
    import hashlib

    digest = hashlib.sha256()
    for directory, dirs, names in os.walk(os.path.dirname(__file__)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                info = os.stat(os.path.join(directory, name))
                digest.update(f"{directory}/{name}\0{info.st_mtime_ns}\0{info.st_size}\0".encode())
    return digest.hexdigest()
