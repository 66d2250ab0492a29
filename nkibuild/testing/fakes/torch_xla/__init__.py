"""nkibuild toolchain double: fake torch_xla (graph extraction only, no device)."""
