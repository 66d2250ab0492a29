"""nkibuild toolchain double: fake torch_xla.core."""
