"""Where Megatron runs: CPU shims, GPU settings, fallbacks without Transformer Engine or Apex."""
