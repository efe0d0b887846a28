"""The `maxtext` Primus backend: MaxText's own training loop from the maxtext wheel (JAX).

Registered through the `primus.backends` entry point. Importing this package does not import
maxtext or JAX: discovery, `primus --help` and inventories stay instant.
"""

from primus.backends.maxtext.maxtext_adapter import MaxTextAdapter

__all__ = ["MaxTextAdapter"]
