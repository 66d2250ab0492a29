"""nkibuild toolchain double: fake torch_xla (graph extraction only, no device)."""

__version__ = "0.0.0+nkibuild.fake"
