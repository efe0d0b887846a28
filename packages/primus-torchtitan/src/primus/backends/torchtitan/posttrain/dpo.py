"""Preference training (DPO) on TorchTitan: core's pairs and loss in TorchTitan's training step.

Data: a row of the SFT dataloader is one pair (`PairDataset.row`: chosen and rejected, read by
global position as SFT's rows, so a resume reads exactly the pairs it would have read); a batch
of L pairs reaches the model as 2L rows (`sft.collate_pairs`). `training.local_batch_size` and
`training.global_batch_size` count pairs, as TRL's batch sizes do.

Loss: `DPOStep` replaces the trainer's forward-backward body. Each micro-batch's loss is its
pairs' summed DPO loss divided by the global batch's pairs (as TorchTitan divides SFT's token
sum by `global_valid_tokens`), so TorchTitan's sum over micro-batches and data-parallel ranks
logs the mean over the step's pairs; the reward metrics are summed the same way (`rewards`).
Eval: the validator (`sft.SFTValidator`) runs `eval_sums` on its batches of eval pairs, the
policy in eval mode, and logs core's eval metrics from their sums over every eval pair.

Reference: the run's initial weights, frozen. With `peft:`, the policy itself with its adapters
switched off (`lora.adapters_off`): the HF import's frozen base. Without, a second instance of
the model, parallelized as the policy, holding the HF import's weights (never a checkpoint's:
a resumed run keeps its reference). With `dpo.precompute_reference`, `precompute` runs the
reference over every train and eval pair once, before the first step, and sets their
log-probabilities on the pairs' dataset: each row carries its pair's (REFERENCE_KEY, a model
kwarg the step takes out), and the frozen model is freed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from primus.backends.torchtitan.posttrain import lora
from primus.backends.torchtitan.posttrain.sft import logits, model_kwargs, rank_batches
from primus.core.logging import log_rank_0
from primus.core.posttrain.preference import (
    REFERENCE_KEY,
    REWARD_METRICS,
    PairDataset,
    dpo_eval_sums_torch,
    dpo_loss_torch,
    sequence_logps_torch,
)
from primus.core.reliability import preemption
from torchtitan.components.loss import IGNORE_INDEX


def reference_model(trainer: Any, folder: Path) -> Any:
    """A frozen instance of `trainer`'s model, parallelized as the trainer parallelizes its
    own, holding the weights of the HF import in `folder` (a DCP folder)."""
    from torchtitan.config import TORCH_DTYPE_MAP
    from torchtitan.tools import utils

    config = trainer.config
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        model = trainer.model_config.build()
    model = config.model_spec.parallelize_fn(
        model, parallel_dims=trainer.parallel_dims, training=config.training,
        parallelism=config.parallelism, compile_config=config.compile,
        ac_config=config.activation_checkpoint, dump_folder=config.dump_folder,
    )  # fmt: skip
    model.to_empty(device=trainer.device)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    lora.load_base(model, folder)
    model.requires_grad_(False)
    return model


class DPOStep:
    """TorchTitan's `fwd_bwd_fn` for DPO: the reference's and the policy's summed log-probs
    of each side, the DPO loss of the micro-batch's pairs (backward), and the step's reward
    metrics, accumulated. `reference`: the frozen model, or None for the policy with its
    LoRA adapters off."""

    def __init__(self, trainer: Any, dpo: Any, reference: Any | None) -> None:
        self.trainer, self.dpo, self.reference = trainer, dpo, reference
        self.precomputed = False
        dims, local = trainer.parallel_dims, trainer.config.training.local_batch_size
        self.global_pairs = local * trainer.gradient_accumulation_steps * dims.dp_replicate * dims.dp_shard  # fmt: skip
        self.totals = torch.zeros(len(REWARD_METRICS), dtype=torch.float64, device=trainer.device)
        self.step = -1  # the step `totals` belong to

    def logps(self, model: Any, tokens: Any, labels: Any, kwargs: dict[str, Any]) -> Any:
        """Each row's summed log-probability of its labels (those not ignored): (rows,)."""
        mask = labels != IGNORE_INDEX
        kwargs = {k: v for k, v in kwargs.items() if k != REFERENCE_KEY}  # not the model's
        return sequence_logps_torch(logits(model, tokens, **kwargs), labels.clamp(min=0), mask)

    def reference_logps(self, tokens: Any, labels: Any, kwargs: dict[str, Any]) -> Any:
        """Each row's under the reference: precomputed (the rows carry them), or run now."""
        if REFERENCE_KEY in kwargs:
            return kwargs[REFERENCE_KEY]
        assert not self.precomputed, "a row without its precomputed reference log-probs"
        with torch.no_grad():
            if self.reference is not None:
                return self.logps(self.reference, tokens, labels, kwargs)
            (model,) = self.trainer.model_parts
            with lora.adapters_off(model):
                return self.logps(model, tokens, labels, kwargs)

    def __call__(
        self, tokens: Any, labels: Any, global_valid_tokens: Any, kwargs: dict[str, Any]
    ) -> Any:
        from torchtitan.trainer import spmd  # spmd_types, as the trainer's body uses it

        trainer = self.trainer
        if trainer.step != self.step:
            self.step = trainer.step
            self.totals.zero_()
        with trainer.train_context():
            reference = self.reference_logps(tokens, labels, kwargs)
            (model,) = trainer.model_parts
            policy = self.logps(model, tokens, labels, kwargs)
            loss, metrics = dpo_loss_torch(policy.view(-1, 2), reference.view(-1, 2), self.dpo)
            share = policy.shape[0] // 2 / self.global_pairs  # this micro-batch's part
            loss = loss * share
            with spmd.no_typecheck():
                loss.backward()
        self.totals += torch.stack([metrics[k].double() for k in REWARD_METRICS]) * share
        return loss.detach()

    def eval_sums(self, tokens: Any, labels: Any, kwargs: dict[str, Any]) -> Any:
        """An eval batch's sums (core's `dpo_eval_sums_torch`), the policy as the caller put
        it (in eval mode); padding pairs, without a label kept, left out."""
        (model,) = self.trainer.model_parts
        with torch.no_grad():
            reference = self.reference_logps(tokens, labels, kwargs).view(-1, 2)
            policy = self.logps(model, tokens, labels, kwargs).view(-1, 2)
        valid = (labels != IGNORE_INDEX).view(policy.shape[0], -1).any(-1)
        return dpo_eval_sums_torch(policy, reference, valid, self.dpo)

    def precompute(self, pairs: list[PairDataset]) -> None:
        """Set the reference's log-probabilities of every pair of each of `pairs` (the train
        and eval pairs): each data-parallel rank runs its share in local batches (every rank
        the same number of them, for the sharded model), the ranks add the shares up; then
        the frozen model is freed. A stop signal (any rank's) ends the pass at the next batch:
        `SetUpInterrupted`."""
        from primus.backends.torchtitan.reliability.stopping import across_ranks

        trainer = self.trainer
        dims, size = trainer.parallel_dims, trainer.config.training.local_batch_size
        ranks, rank = 1, 0
        if dims.dp_enabled:
            group = dims.get_mesh("batch").get_group()
            ranks, rank = group.size(), group.rank()
        (model,) = trainer.model_parts
        start, total = time.perf_counter(), sum(len(rows) for rows in pairs)
        for rows in pairs:
            table = torch.zeros(len(rows), 2, dtype=torch.float32, device=trainer.device)
            for first, (inputs, labels) in rank_batches(rows, size, ranks, rank):
                if preemption.agreed(lambda number: across_ranks([number], "max")[0]):
                    raise preemption.SetUpInterrupted
                inputs = {k: v.to(trainer.device) for k, v in inputs.items()}
                with trainer.train_context():
                    logps = self.reference_logps(
                        inputs["input"], labels.to(trainer.device), model_kwargs(model, inputs)
                    )
                real = min(size, len(rows) - first)  # the padding's left out
                if real > 0:
                    table[first : first + real] = logps.view(-1, 2)[:real].float()
            if dims.dp_enabled:
                torch.distributed.all_reduce(table, group=group)
            rows.set_reference(table.cpu().numpy())
        self.reference, self.precomputed = None, True
        trainer.metrics_processor.time_last_log = time.perf_counter()  # not step 1's time
        seconds = time.perf_counter() - start
        log_rank_0(
            f"[torchtitan] DPO: the reference's log-probabilities of {total} pairs, precomputed "
            f"in {seconds:.1f} s ({total / max(seconds, 1e-9):.1f} pairs/s)"
        )

    def rewards(self) -> dict[str, float]:
        """The last step's reward metrics, means over its pairs (summed over the data-parallel
        ranks: every rank calls it)."""
        totals = self.totals.clone()
        dims = self.trainer.parallel_dims
        if dims.dp_enabled:
            torch.distributed.all_reduce(totals, group=dims.get_mesh("batch").get_group())
        return dict(zip(REWARD_METRICS, totals.tolist(), strict=True))
