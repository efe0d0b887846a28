"""MaxText parameters by key (their tree path joined by "-") in and out of an orbax step
folder, reading only the parameters asked for."""

from __future__ import annotations

import functools
import operator
from pathlib import Path
from typing import Any


def nested(leaves: dict[str, Any]) -> dict[str, Any]:
    """{"params": tree} of `leaves` by MaxText key (its parts joined by "-")."""
    tree: dict[str, Any] = {}
    for key, leaf in leaves.items():
        *parents, name = key.split("-")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[name] = leaf
    return {"params": tree}


def load_params(config: Any, params: dict[str, Any], step: Path) -> dict[str, Any]:
    """Parameters of an orbax step folder, by MaxText key: those of `params` (abstract
    leaves by MaxText key: the model's, or any of them), and only those are read."""
    from orbax.checkpoint import v1 as ocp

    from maxtext.common import checkpoint_context

    context = checkpoint_context.build_context(
        use_ocdbt=config.checkpoint_storage_use_ocdbt,
        use_zarr3=config.checkpoint_storage_use_zarr3,
        checkpoint_storage_concurrent_gb=config.checkpoint_storage_concurrent_gb,
        partial_load=True,  # a training checkpoint also holds the optimizer's state
    )
    with context:
        restored = ocp.load(str(step), nested(params), checkpointable_name="items")["params"]
    return {key: functools.reduce(operator.getitem, key.split("-"), restored) for key in params}
