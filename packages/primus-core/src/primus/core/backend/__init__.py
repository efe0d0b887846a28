"""Backends: the adapter contract, entry-point discovery and the registry."""
