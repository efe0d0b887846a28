"""The `megatron` Primus backend: Megatron-LM's training loop from the megatron-core wheel.

Registered through the `primus.backends` entry point. Importing this package does not import
megatron or torch: discovery, `primus --help` and inventories stay instant.
"""

from primus.backends.megatron.megatron_adapter import MegatronAdapter

__all__ = ["MegatronAdapter"]
