"""nkibuild toolchain double: fake `nkipy.core`."""
