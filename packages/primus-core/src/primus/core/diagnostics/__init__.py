"""Diagnostics: preflight, the node smoke test, GPU health and the GEMM/attention/collective
benchmarks."""
