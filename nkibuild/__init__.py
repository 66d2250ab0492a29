"""nkibuild: a declarative build system for AWS Neuron kernels."""

__version__ = "0.1.0"
