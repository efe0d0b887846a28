"""Where MaxText runs: JAX's platform and distributed runtime, GPU attention kernels."""
