"""TorchTitan checkpoints: the native (DCP) format and its patches, HF conversion."""
