"""Preference training (DPO) on Megatron: core's pairs as Megatron samples, the forward step
against the frozen reference, the loss as Megatron reduces it.

A Megatron sample is one pair (each tensor (2, seq): chosen, rejected), so the global batch,
consumed samples and a resume count pairs (`SFTSamples` over `PairDataset.row`). The forward
step flattens a micro-batch (mbs, 2, seq) to 2 x mbs rows and runs them through the reference
(without gradient, in eval mode) and the policy; each side's log-probability is minus the sum
of the model's per-token cross-entropy (vocabulary-parallel) over its loss mask.

The reference is the run's initial weights, also after a resume: with `peft:`, the model with
its LoRA adapters switched off (the frozen base is the HF import); without, a frozen copy of
the HF import's weights (iteration 0) kept beside the model (not a parameter, not in its state
dict) and run with `torch.func.functional_call`. With `dpo.precompute_reference`, each pair's
reference log-probabilities are computed once before the first step and read from its row.

Reporting: the loss function returns the micro-batch's summed pair losses with its pair count
as Megatron's "token" count (`calculate_per_token_loss`), so the gradient is that of the mean
over the global batch's pairs; `lm loss` and each of REWARD_METRICS go out as [sum, pairs],
which Megatron adds up over micro-batches and data-parallel ranks before dividing.

Eval: Megatron's `evaluate` runs the forward step with the model in eval mode; the loss
function then returns core's eval sums (`dpo_eval_sums_torch`, padding pairs left out) in the
same [sum, pairs] form, so the eval's `lm loss` and reward metrics are means over every eval
pair.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from primus.backends.megatron.posttrain.reference import precompute, reference_losses, side_logps
from primus.backends.megatron.providers import get_batch
from primus.core.posttrain import (
    REFERENCE_KEY,
    REWARD_METRICS,
    DPOConfig,
    PairDataset,
    dpo_eval_sums_torch,
    dpo_loss_torch,
)


def describe(dpo: DPOConfig, lora: bool) -> str:
    reference = "the base without its adapters" if lora else "a frozen copy of the HF import"
    return f"beta {dpo.beta:g}, label smoothing {dpo.label_smoothing:g}; reference: {reference}"


def loss_func(
    dpo: DPOConfig, loss_mask: torch.Tensor, reference: torch.Tensor, output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's summed DPO loss, its pair count, and for logging `lm loss` and the
    reward metrics, each as [sum, pairs]."""
    loss, metrics = dpo_loss_torch(side_logps(output, loss_mask), reference, dpo)
    pairs = reference.shape[0]
    # filled on the device, never copied from the host: the step may be a CUDA graph's capture
    count = torch.full((), float(pairs), device=loss.device)
    means = {"lm loss": loss.detach()} | metrics
    reduced = {key: torch.stack([mean.float() * pairs, count]) for key, mean in means.items()}
    return loss * pairs, torch.full((), pairs, dtype=torch.int, device=loss.device), reduced


def eval_func(
    dpo: DPOConfig, loss_mask: torch.Tensor, reference: torch.Tensor, output: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """An eval micro-batch's summed DPO loss over its pairs (not the padding), their count,
    and `lm loss` and the reward metrics as [sum, pairs]."""
    pairs = reference.shape[0]
    valid = loss_mask.reshape(pairs, -1).sum(-1) > 0  # a padding pair has no answer tokens
    sums = dpo_eval_sums_torch(side_logps(output, loss_mask), reference, valid, dpo).float()
    *totals, count = sums
    keys = ("lm loss", *REWARD_METRICS)
    reduced = {key: torch.stack([total, count]) for key, total in zip(keys, totals, strict=True)}
    return totals[0], count.to(torch.int), reduced


def forward_step(dpo: DPOConfig, lora: bool) -> Callable[[Any, Any], tuple[torch.Tensor, Any]]:
    """Megatron's forward step for DPO: the policy's per-token losses of the micro-batch's
    pairs, and the loss function holding the reference's log-probabilities (in eval mode,
    the eval's)."""

    def step(data_iterator: Any, model: Any) -> tuple[torch.Tensor, Any]:
        batch = get_batch(data_iterator, pairs=True, reference=dpo.precompute_reference)
        labels, loss_mask = batch["labels"], batch["loss_mask"]
        assert labels is not None and loss_mask is not None, "one pipeline stage"
        inputs = (batch["tokens"], batch["position_ids"], None)
        precomputed = batch.get(REFERENCE_KEY)  # the rows carry it (reference.precompute)
        if precomputed is not None:
            reference = precomputed.view(-1, 2)
        else:
            reference = side_logps(reference_losses(model, lora, inputs, labels), loss_mask)
        output = model(*inputs, labels=labels, loss_mask=loss_mask)
        func = loss_func if model.training else eval_func
        return output, partial(func, dpo, loss_mask, reference)

    return step


def precomputing(
    provide: Any, model_provider: Any, pairs: list[PairDataset], lora: bool, micro_batch: int
) -> tuple[Any, Any]:
    """The datasets provider `provide` (over `pairs`) and `model_provider`, changed so that
    the reference's log-probabilities of `pairs` are set on them (`precompute`, by the model
    the run built) before the data is read: every rank runs the reference; tensor-parallel
    rank 0 reads the data, as without."""
    from megatron.core import parallel_state

    models: list[Any] = []

    def build(**kwargs: Any) -> Any:
        models.append(model_provider(**kwargs))
        return models[-1]

    def provide_precomputed(num_samples: list[int], vp_stage: int | None = None) -> Any:
        precompute(models[-1], pairs, lora, micro_batch)  # one pipeline stage: one model
        if parallel_state.get_tensor_model_parallel_rank() != 0:
            return None, None, None
        return provide(num_samples, vp_stage)

    provide_precomputed.is_distributed = True  # type: ignore[attr-defined]
    return provide_precomputed, build
