"""nkibuild toolchain double: fake `nkipy` (tracing only)."""

__version__ = "0.0.0+nkibuild.fake"
