"""DPO's reference model on Megatron: the run's initial weights, frozen, also after a resume.
With `peft:`, the model with its LoRA adapters switched off (the frozen base is the HF import);
without, a frozen copy of the HF import's weights (iteration 0) kept beside the model (not a
parameter, not in its state dict) and run with `torch.func.functional_call`. Apart from the
forward step (`dpo`), which the model provider must not import back.

With `dpo.precompute_reference`, `precompute` runs the reference over every pair once before
the first step and sets the pairs' log-probabilities on their dataset (the rows carry them to
the forward step); the frozen copy is then freed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from primus.core.logging import log_rank_0
from primus.core.posttrain import PairDataset
from primus.core.reliability import preemption

REFERENCE = "primus_dpo_reference"  # the model's attribute holding the frozen copy (full DPO)


def keep_reference(model: torch.nn.Module, folder: str, args: Any) -> None:
    """Full DPO: hold the weights of the Megatron checkpoint in `folder` (the HF import) beside
    `model` (a GPTModel of one stage) as its reference."""
    from primus.backends.megatron.posttrain.lora import import_weights

    # copies: the loaded tensors may be the model's own parameters (loaded in place)
    weights = {key: t.detach().clone() for key, t in import_weights(model, folder, args).items()}
    missing = [name for name, _ in model.named_parameters() if name not in weights]
    assert not missing, f"not in the HF import {folder}: {missing}"
    setattr(model, REFERENCE, weights)


@contextmanager
def evaluating(model: torch.nn.Module) -> Iterator[None]:
    """`model` in eval mode within (no dropout), in its own mode after."""
    mode = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(mode)


def _placed(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen copy on the device and in the dtype of the weights it stands for (once)."""
    weights: dict[str, torch.Tensor] = getattr(model, REFERENCE)
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    for name, tensor in weights.items():
        if tensor.device != own[name].device or tensor.dtype != own[name].dtype:
            weights[name] = tensor.to(own[name].device, own[name].dtype)
    return weights


def reference_losses(
    model: Any, lora: bool, inputs: tuple[Any, ...], labels: torch.Tensor
) -> torch.Tensor:
    """The reference's per-token cross-entropy of `labels`, without gradient: `model` (as
    Megatron wraps it) with its adapters off (`lora`), else its frozen copy."""
    from megatron.core.utils import unwrap_model
    from primus.backends.megatron.posttrain.lora import adapters_off

    inner = unwrap_model(model)
    with torch.no_grad(), evaluating(inner):
        if lora:
            with adapters_off(inner):
                return model(*inputs, labels=labels)
        weights = _placed(inner)
        return torch.func.functional_call(inner, weights, inputs, {"labels": labels})


def side_logps(losses: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """(pairs, 2) summed log-probabilities from per-token cross-entropy (2 x pairs, seq)."""
    return -(losses.float() * loss_mask.float()).sum(-1).view(-1, 2)


def precompute(model: Any, pairs: list[PairDataset], lora: bool, micro_batch: int) -> None:
    """Set the reference log-probabilities of every pair of each of `pairs` (the train and
    eval pairs): each data-parallel rank runs the reference (`model`: one stage's GPTModel)
    over its share in micro-batches of `micro_batch` pairs, and the group adds the shares up.
    Full DPO's frozen copy is freed after. A stop signal (any rank's) ends the pass at the
    next round of micro-batches: `SetUpInterrupted`."""
    import numpy as np

    from megatron.core import parallel_state
    from primus.backends.megatron.reliability.stopping import agreed_max

    rank = parallel_state.get_data_parallel_rank()
    ranks = parallel_state.get_data_parallel_world_size()
    device = next(model.parameters()).device
    start, total = time.perf_counter(), sum(len(rows) for rows in pairs)
    for rows in pairs:
        table = torch.zeros(len(rows), 2, dtype=torch.float32, device=device)
        for round_start in range(0, len(rows), ranks * micro_batch):  # as many on every rank
            if preemption.agreed(lambda number: agreed_max(number)[0]):
                raise preemption.SetUpInterrupted
            first = round_start + rank * micro_batch
            items = [rows[i] for i in range(first, min(first + micro_batch, len(rows)))]
            if not items:  # the last round's pairs went to the ranks before this one
                continue
            batch = {  # each pair's chosen and rejected rows, in turn: (2 x pairs, seq)
                k: torch.as_tensor(np.concatenate([item[k] for item in items])).to(device)
                for k in ("tokens", "labels", "position_ids", "loss_mask")
            }
            inputs = (batch["tokens"].long(), batch["position_ids"].long(), None)
            losses = reference_losses(model, lora, inputs, batch["labels"].long())
            table[first : first + len(items)] = side_logps(losses, batch["loss_mask"])
        torch.distributed.all_reduce(table, group=parallel_state.get_data_parallel_group())
        rows.set_reference(table.cpu().numpy())
    if hasattr(model, REFERENCE):
        delattr(model, REFERENCE)
    seconds = time.perf_counter() - start
    log_rank_0(
        f"[megatron] DPO: the reference's log-probabilities of {total} pairs, precomputed in "
        f"{seconds:.1f} s ({total / max(seconds, 1e-9):.1f} pairs/s)"
    )
