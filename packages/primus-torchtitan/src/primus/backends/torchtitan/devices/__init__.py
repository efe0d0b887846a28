"""Where TorchTitan runs: CPU shims and the device patches."""
