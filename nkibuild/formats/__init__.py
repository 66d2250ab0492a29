"""Readers and writers for the file formats nkibuild handles: HLO module protos and NEFFs.

Each format lives in its own module so that importing one does not pull in the other's
dependencies (the HLO reader needs `protobuf`; the NEFF module only needs the standard
library).
"""
