"""Primus turbo: portable Triton kernels with autograd, and patches that install them.

`primus.turbo.kernels` holds the functions (they import torch and Triton);
`primus.turbo.patches` registers the backend patches, importing nothing heavy until they run.
"""
