"""MaxText checkpoints: the native (orbax) format, HF conversion."""
