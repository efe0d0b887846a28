"""Triton kernels with autograd. Each function takes any leading shape and bf16/fp16/fp32,
runs Triton on a GPU (or anywhere under `TRITON_INTERPRET=1`), and its PyTorch reference on
a CPU otherwise. Each module also has the reference the tests and benchmarks compare with.
"""
