"""Model definitions: Primus presets as TorchTitan flavors."""
