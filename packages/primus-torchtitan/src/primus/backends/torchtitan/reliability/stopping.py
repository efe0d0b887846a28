"""What the reliability patches do inside TorchTitan's training loop: agree across ranks, and
write a full checkpoint of the current step through TorchTitan's CheckpointManager."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

NO_CHECKPOINT = "no checkpoint (checkpoint.enable is false)"


def rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def host_group() -> Any:
    """A gloo group over every rank, for flags agreed on every step without waiting for the
    device: None (the default group) when that is gloo already or there is one process. All
    ranks must call it (it may create a group)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1 or dist.get_backend() == "gloo":
        return None
    return dist.new_group(backend="gloo")


def across_ranks(values: Sequence[Any], op: str, group: Any = None) -> list[float]:
    """`values` (floats or 0-d tensors) reduced over every rank with `op` ("max" or "sum"),
    through `group` (a gloo one: on the host) or the default group; as they are in a single
    process."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [float(v) for v in values]
    on_host = group is not None or dist.get_backend() == "gloo"
    device = "cpu" if on_host else torch.accelerator.current_accelerator()
    vector = torch.stack(
        [torch.as_tensor(v, dtype=torch.float64, device=device).reshape(()) for v in values]
    )
    dist.all_reduce(vector, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM,
                    group=group)  # fmt: skip
    return vector.tolist()


def save_full(manager: Any, step: int) -> str:
    """A full checkpoint of `step` (model, optimizer, lr schedulers, data position, train
    state; the model in its training dtype), written synchronously into TorchTitan's `step-N`
    folder: what its resume loads. Every rank calls it. Returns the folder."""
    from torchtitan.components.checkpointer import AsyncMode

    if not manager.enable:
        return NO_CHECKPOINT
    manager.maybe_wait_for_saving()
    path = manager._create_checkpoint_id(step)
    manager.dcp_save(manager._flattened_model_states_sd(), checkpoint_id=path,
                     async_mode=AsyncMode.DISABLED, enable_garbage_collection=True)  # fmt: skip
    return str(path)
