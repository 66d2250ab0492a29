"""Toolchain doubles: stand-ins for the Neuron tools that cannot be installed everywhere.

`fake_neuronxcc` behaves like `neuronx-cc` on the command line and writes placeholder
NEFFs (a real container and signature, no executable code). nkibuild's tests and CI use
these doubles; a real build never uses them unless `--toolchain fake` is chosen.
"""
