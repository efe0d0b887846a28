"""Megatron checkpoints: the native (torch_dist) format and its patches, HF conversion."""
