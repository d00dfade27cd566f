"""Triton kernels for the GPU path (imported only when `--attention-backend triton` is chosen).

Nothing on the CPU serving path imports this package. Tests run the kernels on CPU tensors
under Triton's interpreter (`TRITON_INTERPRET=1`, set before the first import), and natively
where CUDA is present.
"""
