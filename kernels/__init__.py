"""Attention, sampling and grammar-mask kernels behind one interface.

`torch_*` modules are the pure-torch CPU path (and the test oracle); GPU modules (flashinfer,
Triton) import their libraries lazily so a CPU install never needs them.
"""
