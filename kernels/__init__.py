"""Attention, sampling and grammar-mask kernels behind one interface.

`torch_*` modules are the pure-torch CPU path (and the test oracle); `cpu/` holds the native C
kernels the CPU path uses where they build. There is no GPU path yet: when flashinfer / Triton
backends come, they plug in behind the same interfaces and import their libraries lazily.
"""
