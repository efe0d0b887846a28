"""The `torchtitan` Primus backend: TorchTitan's Trainer from the torchtitan wheel.

Registered through the `primus.backends` entry point. Importing this package does not import
torchtitan or torch: discovery, `primus --help` and inventories stay instant.
"""

from primus.backends.torchtitan.torchtitan_adapter import TorchTitanAdapter

__all__ = ["TorchTitanAdapter"]
