"""Stopping a Megatron run at a step boundary with a checkpoint (preemption, non-finite steps):
what every rank agrees on, and Megatron's own checkpoint of the step, finished on disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The arguments of megatron.training.training.checkpoint_and_decide_exit, which runs after
# every step: what saving a checkpoint of that step needs.
SaveArgs = tuple[Any, Any, Any, int, float, dict, Any]


def agreed_max(*values: float) -> list[float]:
    """Each of `values`, the largest over all ranks (one all-reduce; as given with one process)."""
    import torch

    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device="cuda")
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return tensor.tolist()


def save_now(run_dir: Path, save_args: SaveArgs) -> Path:
    """Megatron's checkpoint of this step (into `save`; the run dir's checkpoints folder, which
    the next run loads, when `save` is unset), written completely; its folder."""
    from megatron.training import get_args
    from megatron.training.async_utils import maybe_finalize_async_save
    from megatron.training.checkpointing import get_checkpoint_name
    from megatron.training.training import save_checkpoint_and_time

    model, optimizer, scheduler, iteration, flops, context, data_iterator = save_args
    args = get_args()
    if args.save is None:
        args.save = str(run_dir / "checkpoints")
    save_checkpoint_and_time(
        iteration, model, optimizer, scheduler, flops, context, train_data_iterator=data_iterator
    )
    maybe_finalize_async_save(blocking=True)
    return Path(get_checkpoint_name(args.save, iteration, return_base_dir=True))
