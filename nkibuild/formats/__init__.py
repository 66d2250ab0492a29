"""Readers for the file formats nkibuild handles: HLO module protos and NEFFs (plus the
HLO rewrites the build itself applies: canonical bytes, relocated backend configs).

Writers that exist only for the toolchain double live in `nkibuild.toolchain_double`
(`neff_writer`, `hlo_writer`). Each format lives in its own module so that importing one
does not pull in the other's dependencies (the HLO reader needs `protobuf`; the NEFF
module only needs the standard library).
"""
